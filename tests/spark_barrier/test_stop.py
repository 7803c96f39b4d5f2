"""stop_between_batches waits for the sink's batch in progress, however busy Spark is."""

from __future__ import annotations

import threading
import time

from spark_barrier.job import _in_batch, stop_between_batches


class BusyQuery:
    """The part of a StreamingQuery that stop_between_batches uses: a query whose
    triggers run back to back, so Spark never reports itself idle."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.isActive = True
        self.status = {"isTriggerActive": True}
        self.stopped_at: float | None = None

    def stop(self) -> None:
        self.stopped_at = time.monotonic()
        self.isActive = False


def test_stop_waits_for_the_batch_in_progress_and_no_longer() -> None:
    query = BusyQuery("job_busy")
    entered = threading.Event()
    finished: list[float] = []

    def batch() -> None:
        with _in_batch("job_busy"):
            entered.set()
            time.sleep(0.5)  # committing
            finished.append(time.monotonic())

    worker = threading.Thread(target=batch)
    worker.start()
    entered.wait(5)
    started = time.monotonic()
    stop_between_batches(query, timeout=10)
    worker.join()
    assert query.stopped_at is not None and query.stopped_at >= finished[0]
    assert query.stopped_at - started < 5  # did not wait for Spark to be idle


def test_stop_gives_up_waiting_after_the_timeout() -> None:
    query = BusyQuery("job_stuck")
    release = threading.Event()

    def batch() -> None:
        with _in_batch("job_stuck"):
            release.wait(10)

    worker = threading.Thread(target=batch)
    worker.start()
    time.sleep(0.05)
    started = time.monotonic()
    stop_between_batches(query, timeout=0.3)
    assert query.stopped_at is not None and query.stopped_at - started < 2
    release.set()
    worker.join()
