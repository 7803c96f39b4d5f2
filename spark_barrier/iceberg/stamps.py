"""The MetaService stamp on Iceberg snapshots: a batch's snapshot, a snapshot's barrier.

The stamp's format (summary keys, encoding, parsing) is :mod:`metaservice.contract`'s,
shared with the service; this module finds stamped snapshots in pyiceberg tables.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from metaservice.contract import (
    SUMMARY_BARRIER,
    SUMMARY_BATCH,
    SUMMARY_JOB,
    SUMMARY_QUERY,
    parse_stamp,
)

__all__ = [
    "SUMMARY_BARRIER",
    "SUMMARY_BATCH",
    "SUMMARY_JOB",
    "SUMMARY_QUERY",
    "StampedSnapshot",
    "find_batch_commit",
    "find_batch_snapshot",
    "list_stamped_snapshots",
    "snapshot_at",
    "snapshot_barrier",
]

log = logging.getLogger(__name__)


class StampedSnapshot(NamedTuple):
    """A snapshot carrying the MetaService stamp in its summary."""

    snapshot_id: int
    barrier: int
    job: str
    batch: int
    query: str | None = None  # the Spark query that committed it (None: not stamped)


def list_stamped_snapshots(table: Table) -> list[StampedSnapshot]:
    """Every snapshot of `table` (commit order) whose summary carries the MetaService stamp."""
    return [s for snap in table.snapshots() if (s := _stamp_of(snap)) is not None]


def find_batch_commit(
    table: Table, job: str, batch_id: int, query_id: str | None = None
) -> StampedSnapshot | None:
    """The snapshot already committed by `job` for `batch_id` (with its barrier), or None.

    Used to skip a replayed batch (exactly-once). With `query_id`, a snapshot stamped
    by another Spark query (a reset checkpoint restarts batch ids at 0) is not this
    batch; snapshots stamped without a query match on job and batch alone. The latest
    match wins; there is only one unless an external tool re-committed a batch.
    """
    for stamped in reversed(list_stamped_snapshots(table)):
        if stamped.job != job or stamped.batch != batch_id:
            continue
        if query_id is None or stamped.query is None or stamped.query == query_id:
            return stamped
    return None


def find_batch_snapshot(
    table: Table, job: str, batch_id: int, query_id: str | None = None
) -> int | None:
    """The id of :func:`find_batch_commit`'s snapshot, or None."""
    found = find_batch_commit(table, job, batch_id, query_id)
    return found.snapshot_id if found is not None else None


def snapshot_barrier(table: Table, snapshot_id: int) -> int | None:
    """The barrier stamped on snapshot `snapshot_id`, or None (unknown or unstamped)."""
    snap = table.snapshot_by_id(snapshot_id)
    stamp = parse_stamp(snap.summary) if snap is not None else None
    return stamp.barrier if stamp is not None else None


def _stamp_of(snap: Snapshot) -> StampedSnapshot | None:
    stamp = parse_stamp(snap.summary)
    return StampedSnapshot(snap.snapshot_id, *stamp) if stamp is not None else None


def snapshot_at(table: Table, barrier: int) -> int | None:
    """The latest snapshot of ``table`` whose barrier is <= ``barrier`` (None: none yet).

    Walks the current snapshot's ancestry, newest first, so that several batches of
    a source job sharing one barrier resolve to the latest of them.
    """
    current = table.current_snapshot()
    if current is None:
        return None
    for snap in ancestors_of(current, table.metadata):
        stamp = parse_stamp(snap.summary)
        if stamp is not None and stamp.barrier <= barrier:
            return snap.snapshot_id
    return None
