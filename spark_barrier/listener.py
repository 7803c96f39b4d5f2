"""A StreamingQueryListener reporting query start, progress and termination.

Callbacks never block Spark: they put the event on a queue and a background thread
sends it to the MetaService (losing liveness events when it is down is harmless).
Progress events reach it from their JSON (:class:`spark_barrier.jvm.JsonQueryEvents`),
not built by pyspark field by field over Py4J.

One request per batch: a job whose barrier requests carry its progress
(:meth:`BarrierListener.carry`, see ``spark_barrier/carry.py``) has its latest
progress event held for up to ``carry_s`` for the next request to take
(:meth:`BarrierListener.take_progress`); one not taken by then, or not recorded, is
sent from here as before, and so is a held event when its query ends (before the end).

The jobs of one Spark session and MetaService share one listener
(:func:`listener_for`); the last one to close removes it (:func:`release_listener`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any

from pyspark.sql import SparkSession
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
        self._java: Any = None
        self._carry_s: dict[str, float] = {}  # job -> how long its progress waits
        self._held: dict[str, tuple[JobEvent, float]] = {}  # job -> (event, held since)
        self._held_lock = threading.Lock()
        self._thread.start()

    def carry(self, job: str, seconds: float) -> None:
        """Hold ``job``'s progress events up to ``seconds`` for its barrier requests."""
        with self._held_lock:
            self._carry_s[job] = seconds

    def stop_carrying(self, job: str) -> None:
        """``job``'s progress goes at once again; a held event is sent now."""
        self._release_held(job)
        with self._held_lock:
            self._carry_s.pop(job, None)

    def take_progress(self, job: str) -> JobEvent | None:
        """The job's held progress event, for a barrier request to carry (or None)."""
        with self._held_lock:
            held = self._held.pop(job, None)
        return held[0] if held is not None else None

    def give_back(self, job: str, event: JobEvent) -> None:
        """A progress event a barrier request took but did not get recorded: sent from
        here (unless a newer one is held, which says more)."""
        with self._held_lock:
            if job in self._held:
                return
        self._send_now(job, event)

    def _send_now(self, name: str, event: JobEvent) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait((name, event))

    def _release_held(self, job: str | None = None) -> None:
        """Send held events that waited their time (or ``job``'s, whatever its age)."""
        now = time.monotonic()
        with self._held_lock:
            due = [
                (name, event)
                for name, (event, since) in self._held.items()
                if name == job or now - since >= self._carry_s.get(name, 0.0)
            ]
            for name, _ in due:
                del self._held[name]
        for name, event in due:
            self._send_now(name, event)

    @property
    def _jlistener(self) -> Any:
        # What StreamingQueryManager.addListener registers: events as JSON (see jvm).
        if self._java is None:
            self._java = java_listener(self)
        return self._java

    def _put(self, name: str | None, event: JobEvent) -> None:
        if name not in self.jobs:
            return
        assert name is not None
        if event.event == "progress":
            with self._held_lock:
                if name in self._carry_s:
                    self._held[name] = (event, self._held.get(name, (event, time.monotonic()))[1])
                    return
        else:
            self._release_held(name)  # a query's end comes after its last progress
        # Liveness only: dropping an event is better than stalling Spark.
        self._send_now(name, event)

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
            try:
                item = self._queue.get(timeout=0.1)  # and send held events that waited their time
            except queue.Empty:
                self._release_held()
                continue
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
        with self._held_lock:
            held = list(self._held)
        for job in held:
            self._release_held(job)
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks


# One listener per Spark session and MetaService, shared by the jobs registered there.
_listeners: dict[tuple[int, str], BarrierListener] = {}
_listeners_lock = threading.Lock()


def listener_for(spark: SparkSession, client: MetaServiceClient) -> BarrierListener:
    """One listener per Spark session and MetaService, shared by the jobs registered there."""
    key = (id(spark), client.url)
    with _listeners_lock:
        listener = _listeners.get(key)
        if listener is None:
            listener = BarrierListener(MetaServiceClient(client.url, token=_token(client)))
            spark.streams.addListener(listener)
            _listeners[key] = listener
        return listener


def release_listener(spark: SparkSession, client: MetaServiceClient, job: str) -> None:
    """`job` no longer reports through its session's listener; the last job's close removes
    the listener from Spark. Spark calls every registered listener, through Py4J, for every
    event of every query: listeners left behind by closed jobs slow the whole driver, and
    Spark delivers their backlog before a session stops."""
    key = (id(spark), client.url)
    with _listeners_lock:
        listener = _listeners.get(key)
        if listener is None:
            return
        listener.stop_carrying(job)
        listener.jobs.discard(job)
        if listener.jobs:
            return
        del _listeners[key]
    listener.drain(timeout=2.0)  # the terminated events of the queries just stopped
    spark.streams.removeListener(listener)
    listener.stop()


def _token(client: MetaServiceClient) -> str | None:
    auth = client._http.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ") or None
