"""A log reader's fallback: the rows of a table's Iceberg snapshots after a position,
read through pyiceberg (imported here only, so the log service runs without it).

At-least-once, not exactly-once: a position that is no longer in the table's history
(expired, or a rollback moved the table elsewhere) gives the table's whole current state,
and a snapshot that is not an append (an overwrite, a compaction) gives its whole state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from metaservice.contract import Stamp, parse_stamp

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

__all__ = ["SnapshotRows", "rows_after"]


@dataclass(frozen=True)
class SnapshotRows:
    snapshot_id: int
    stamp: Stamp | None  # the MetaService stamp; None for a snapshot another tool made
    rows: pa.Table


def rows_after(table: Table, after: int | None) -> Iterator[SnapshotRows]:
    """The rows the snapshots after ``after`` added, one snapshot at a time, oldest first,
    up to the table's current snapshot (``after=None``: its whole current state)."""
    current = table.current_snapshot()
    if current is None or current.snapshot_id == after:
        return
    newer = _snapshots_after(table, current, after)
    if newer is None:
        yield SnapshotRows(current.snapshot_id, _stamp(current), _whole(table, current))
        return
    for snapshot in newer:
        yield SnapshotRows(snapshot.snapshot_id, _stamp(snapshot), _added(table, snapshot))


def _snapshots_after(table: Table, current: Snapshot, after: int | None) -> list[Snapshot] | None:
    """The ancestors of ``current`` after ``after``, oldest first; None when ``after`` is
    not among them (none given, expired, or on another branch of history)."""
    from pyiceberg.table.snapshots import ancestors_of

    if after is None:
        return None
    newer: list[Snapshot] = []
    for snapshot in ancestors_of(current, table.metadata):
        if snapshot.snapshot_id == after:
            return newer[::-1]
        newer.append(snapshot)
    return None


def _added(table: Table, snapshot: Snapshot) -> pa.Table:
    from pyiceberg.table.snapshots import Operation

    operation = snapshot.summary.operation if snapshot.summary else None
    if operation != Operation.APPEND:
        return _whole(table, snapshot)
    scan = table.incremental_append_scan(
        from_snapshot_id_exclusive=snapshot.parent_snapshot_id,
        to_snapshot_id_inclusive=snapshot.snapshot_id,
    )
    return scan.to_arrow()


def _whole(table: Table, snapshot: Snapshot) -> pa.Table:
    return table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()


def _stamp(snapshot: Snapshot) -> Stamp | None:
    return parse_stamp(snapshot.summary)  # a Summary reads as a mapping of its properties
