"""A StreamingQueryListener reporting query start, progress and termination.

Callbacks never block Spark: they put the event on a queue and a background thread
sends it to the MetaService (losing liveness events when it is down is harmless).
Progress events reach it from their JSON (:class:`spark_barrier.jvm.JsonQueryEvents`),
not built by pyspark field by field over Py4J.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from metaservice.client import MetaServiceClient, MetaServiceError
from metaservice.topology.schemas import JobEvent
from spark_barrier.jvm import java_listener

log = logging.getLogger("spark_barrier.listener")


class BarrierListener(StreamingQueryListener):
    """Reports events of queries named after registered jobs (``queryName(job)``)."""

    def __init__(self, client: MetaServiceClient) -> None:
        self.client = client
        self.jobs: set[str] = set()
        self._names: dict[str, str] = {}  # query id -> job name
        self._queue: queue.Queue[tuple[str, JobEvent] | None] = queue.Queue(maxsize=10_000)
        self._thread = threading.Thread(target=self._deliver, name="barrier-listener", daemon=True)
        self._thread.start()
        self._java: Any = None

    @property
    def _jlistener(self) -> Any:
        # What StreamingQueryManager.addListener registers: events as JSON (see jvm).
        if self._java is None:
            self._java = java_listener(self)
        return self._java

    def _put(self, name: str | None, event: JobEvent) -> None:
        if name in self.jobs:
            # Liveness only: dropping an event is better than stalling Spark.
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait((name, event))

    def onQueryStarted(self, event: Any) -> None:
        self._names[str(event.id)] = event.name
        self._put(event.name, JobEvent(event="started", run_id=str(event.runId)))

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        if p.name not in self.jobs:
            return  # another query's: build nothing
        self._put(
            p.name,
            JobEvent(
                event="progress",
                run_id=str(p.runId),
                batch_id=p.batchId,
                num_input_rows=p.numInputRows,
                duration_ms=p.batchDuration,
            ),
        )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        name = self._names.pop(str(event.id), None)
        failed = event.exception is not None
        self._put(
            name,
            JobEvent(
                event="failed" if failed else "terminated",
                run_id=str(event.runId),
                message=(event.exception or "")[:10_000] or None,
            ),
        )

    def _deliver(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            name, event = item
            try:
                self.client.send_job_event(name, event)  # no job view back: 204
            except MetaServiceError as exc:
                log.debug("could not report %s of %s: %s", event.event, name, exc)
            finally:
                self._queue.task_done()

    def stop(self, timeout: float = 1.0) -> None:
        """End the delivery thread (once the listener is removed from Spark)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until every queued event was sent (tests, clean shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks
