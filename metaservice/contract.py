"""What the MetaService and the jobs writing Iceberg tables agree on, outside the HTTP API.

Three facts, each written down once and imported by both sides:

- **The snapshot stamp.** Every snapshot a barrier job commits carries its barrier,
  its job, its batch id and (when known) its Spark query id in the snapshot summary,
  under the keys ``metaservice.barrier``, ``metaservice.job``, ``metaservice.batch``
  and ``metaservice.query``. The job writes it (:func:`encode_stamp`); replay
  detection, reads at a barrier and ``metaservice reconcile`` read it back
  (:func:`parse_stamp`).
- **The log files a snapshot owns.** Rows a table's log store spilled to files for a
  batch are listed in that batch's snapshot summary under ``metaservice.log-files``
  (:func:`encode_log_files`); expiring the snapshot deletes them
  (:func:`parse_log_files`).
- **The barrier grid.** A barrier is the start, in epoch milliseconds, of one slot
  of the barrier clock: a multiple of the slot width (:func:`slot_of`,
  :func:`on_grid`).

This module imports the standard library only (no pyspark, pyiceberg, FastAPI or
SQLAlchemy), so a Spark driver, the client and the service can all load it::

    >>> summary = encode_stamp(barrier=1_700_000_002_000, job="enrich", batch=7)
    >>> parse_stamp({"operation": "append", **summary})
    Stamp(barrier=1700000002000, job='enrich', batch=7, query=None)
    >>> slot_of(1_700_000_002_345, 1000)
    1700000002000
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

__all__ = [
    "SUMMARY_BARRIER",
    "SUMMARY_BATCH",
    "SUMMARY_JOB",
    "SUMMARY_LOG_FILES",
    "SUMMARY_QUERY",
    "Stamp",
    "encode_log_files",
    "encode_stamp",
    "on_grid",
    "parse_log_files",
    "parse_stamp",
    "slot_of",
]

SUMMARY_BARRIER = "metaservice.barrier"
SUMMARY_JOB = "metaservice.job"
SUMMARY_BATCH = "metaservice.batch"
SUMMARY_QUERY = "metaservice.query"
SUMMARY_LOG_FILES = "metaservice.log-files"


class Stamp(NamedTuple):
    """The MetaService stamp of one snapshot."""

    barrier: int
    job: str
    batch: int
    query: str | None = None  # the Spark query that committed it; None for older stamps


def encode_stamp(barrier: int, job: str, batch: int, query: str | None = None) -> dict[str, str]:
    """The snapshot-summary properties that stamp a batch's snapshot."""
    stamp = {SUMMARY_BARRIER: str(barrier), SUMMARY_JOB: job, SUMMARY_BATCH: str(batch)}
    if query is not None:
        stamp[SUMMARY_QUERY] = query
    return stamp


def parse_stamp(summary: Mapping[str, str] | None) -> Stamp | None:
    """The stamp in a snapshot summary, or None when the snapshot is not stamped
    (committed by another tool: it lacks the barrier, the job or the batch).

    Raises ``ValueError`` naming the key when a stamp's barrier or batch is not an integer.
    """
    if summary is None:
        return None
    barrier, job, batch = (summary.get(k) for k in (SUMMARY_BARRIER, SUMMARY_JOB, SUMMARY_BATCH))
    if barrier is None or job is None or batch is None:
        return None
    query = summary.get(SUMMARY_QUERY)
    return Stamp(_integer(SUMMARY_BARRIER, barrier), job, _integer(SUMMARY_BATCH, batch), query)


def _integer(key: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"malformed stamp: {key}={raw!r} is not an integer") from None


def encode_log_files(paths: list[str]) -> dict[str, str]:
    """The summary property listing a batch's spilled log files (none: no property)."""
    return {SUMMARY_LOG_FILES: ",".join(paths)} if paths else {}


def parse_log_files(summary: Mapping[str, str] | None) -> list[str]:
    """The spilled log files a snapshot summary lists (its expiry deletes them)."""
    raw = (summary or {}).get(SUMMARY_LOG_FILES) or ""  # a Summary ignores a default
    return [path for path in raw.split(",") if path]


def slot_of(ms: int, interval_ms: int) -> int:
    """The barrier of the slot that contains ``ms`` (slots of ``interval_ms`` from the epoch)."""
    return ms - ms % interval_ms


def on_grid(barrier: int, interval_ms: int) -> bool:
    """Whether ``barrier`` starts a slot of ``interval_ms``."""
    return barrier % interval_ms == 0
