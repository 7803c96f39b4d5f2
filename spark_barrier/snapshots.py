"""Barrier arithmetic on an Iceberg table's own metadata (no MetaService round trip)."""

from __future__ import annotations

from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from spark_barrier.iceberg_io import SUMMARY_BARRIER


def snapshot_at(table: Table, barrier: int) -> int | None:
    """The latest snapshot of ``table`` whose barrier is <= ``barrier`` (None: none yet).

    Walks the current snapshot's ancestry, newest first, so that several batches of
    a source job sharing one barrier resolve to the latest of them.
    """
    current = table.current_snapshot()
    if current is None:
        return None
    for snap in ancestors_of(current, table.metadata):
        stamp = snap.summary.get(SUMMARY_BARRIER) if snap.summary else None
        if stamp is not None and int(stamp) <= barrier:
            return snap.snapshot_id
    return None
