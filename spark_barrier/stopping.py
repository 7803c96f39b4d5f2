"""Stopping a job's query between batches: the sink calls in progress by query name
(:func:`_in_batch`), :func:`stop_between_batches`, and the grace after which a batch
still waiting for another job gives up (:func:`_stop_requested`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql.streaming.query import StreamingQuery

# Sink calls in progress, by query name (a job's query is named after the job).
_batches_running: dict[str, int] = {}
_batches_lock = threading.Lock()


@contextmanager
def _in_batch(query_name: str) -> Iterator[None]:
    with _batches_lock:
        _batches_running[query_name] = _batches_running.get(query_name, 0) + 1
    try:
        yield
    finally:
        with _batches_lock:
            _batches_running[query_name] -= 1


def _sink_busy(query_name: str) -> bool:
    with _batches_lock:
        return _batches_running.get(query_name, 0) > 0


# Queries in stop_between_batches (their names are job names), with when it was asked.
_stopping: dict[str, float] = {}
# How long a batch's wait may go on after its query was asked to stop: a short wait
# finishes and the batch commits (a clean stop); a stuck one ends.
STOP_GRACE_S = 5.0


def _stop_requested(query_name: str) -> bool:
    """Whether ``query_name`` was asked to stop more than STOP_GRACE_S ago."""
    with _batches_lock:
        asked = _stopping.get(query_name)
    return asked is not None and time.monotonic() - asked >= STOP_GRACE_S


def stop_between_batches(query: StreamingQuery, timeout: float = 60.0) -> None:
    """Stop ``query`` when its sink is between batches, so no commit is interrupted halfway.

    A query that is behind runs its triggers back to back, so waiting for Spark to be
    idle could wait forever; what matters is that no ``foreachBatch`` call is in the
    middle of a commit. Interrupting one is safe (the next run replays it exactly once)
    but noisy; after ``timeout`` seconds the query is stopped anyway.

    A batch that is still waiting for another job (``ctx.read`` of a table not exact
    yet) ``STOP_GRACE_S`` after the stop was asked gives up with ``BarrierBatchError``
    code ``stopping``: Spark's stop waits for the running ``foreachBatch`` call to
    return, which could otherwise take the job's whole patience.
    """
    name = query.name or ""
    with _batches_lock:
        _stopping[name] = time.monotonic()
    try:
        deadline = time.monotonic() + timeout
        while query.isActive and _sink_busy(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        query.stop()
    finally:
        with _batches_lock:
            _stopping.pop(name, None)
