"""Where a batch's time goes: named steps, timed on the driver, logged per batch.

The sink opens a recorder for each batch (:func:`recording`); code on the batch's
path marks its parts with ``with step("write"): ...``. Outside a batch ``step`` costs
nothing. When the batch ends the sink logs one line on the ``spark_barrier.steps``
logger at INFO, with the durations (ms) also in the record's ``steps`` attribute and
the batch's whole time in ``total_ms``, so a benchmark or an operator can collect them
with an ordinary logging handler:

    spark_barrier.steps: build_order_detail batch 12 (barrier 1795...000): plan 4 ms,
    barrier 31 ms, inputs 85 ms, transform 640 ms, write 1900 ms, commit 410 ms, ...;
    total 3120 ms

Spark is lazy: rows are read and transformed when they are written, so ``write`` holds
the reading and transforming of a batch's rows (and for a small CDC batch its check:
one Spark job, see ``iceberg.cdc_write``; a CDC batch Spark's writer writes is checked
first, in ``cdc_check``); ``inputs`` and ``transform`` are what the driver does before that
(planning files, waiting for a lookup to be exact). A dotted name is a part of the step
before the dot (``commit.match`` is inside ``commit``): for instance ``write.keys``, an
upsert batch's keys read back to check they are unique, ``write.deduped``, the batch
written again reduced to its last row per key when they were not, and
``cdc_check.keys``, a CDC batch's changed keys brought to the driver for the match.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

log = logging.getLogger("spark_barrier.steps")

_current: ContextVar[dict[str, float] | None] = ContextVar("spark_barrier_steps", default=None)


@contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Record the steps run inside the block (on this thread) into the dict yielded."""
    steps: dict[str, float] = {}
    token = _current.set(steps)
    try:
        yield steps
    finally:
        _current.reset(token)


@contextmanager
def step(name: str) -> Iterator[None]:
    """Add the block's wall time to step ``name`` of the batch being recorded, if any."""
    steps = _current.get()
    if steps is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        steps[name] = steps.get(name, 0.0) + (time.perf_counter() - started) * 1000


def log_batch(
    job: str,
    batch_id: int,
    barrier: int | None,
    steps: dict[str, float],
    total_ms: float | None = None,
) -> None:
    """One INFO line for the batch; ``record.steps`` holds the durations (ms) and
    ``record.total_ms`` the whole batch's wall time on the driver (steps included)."""
    if not steps:
        return
    shown = ", ".join(f"{name} {ms:.0f} ms" for name, ms in steps.items())
    total = "" if total_ms is None else f"; total {total_ms:.0f} ms"
    log.info(
        "%s batch %d (barrier %s): %s%s",
        job,
        batch_id,
        barrier,
        shown,
        total,
        extra={
            "steps": dict(steps),
            "total_ms": total_ms,
            "job": job,
            "batch_id": batch_id,
            "barrier": barrier,
        },
    )
