"""Planning the data files a read needs (the driver's part of a read: no rows)."""

from __future__ import annotations

import logging

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot, ancestors_of

from spark_barrier.iceberg.filters import RowFilter, as_expression

log = logging.getLogger(__name__)

# Operations that only add rows (or rewrite them without changing content): an
# incremental append read over them is exact.
_APPEND_ONLY_OPERATIONS = frozenset({Operation.APPEND, Operation.REPLACE})


class NotAppendOnly(ValueError):
    """A range of a table holds snapshots that replace or delete rows: reading only the
    files they add would silently miss rows."""


def data_file_paths(
    table: Table, snapshot_id: int | None = None, row_filter: RowFilter | None = None
) -> list[str]:
    """Paths of the live data files of a snapshot (default: current); [] for no snapshot.

    With `row_filter`, only the files whose partition values and column statistics
    may hold matching rows (they may hold others too).
    """
    return [f.file_path for f in data_files(table, snapshot_id, row_filter)]


def data_files(
    table: Table, snapshot_id: int | None, row_filter: RowFilter | None = None
) -> list[DataFile]:
    if snapshot_id is None:
        current = table.current_snapshot()
        if current is None:
            return []
        snapshot_id = current.snapshot_id
    elif table.snapshot_by_id(snapshot_id) is None:
        raise ValueError(f"snapshot {snapshot_id} not found in table {table.name()}")
    scan = table.scan(snapshot_id=snapshot_id, row_filter=as_expression(row_filter))
    tasks = list(scan.plan_files())
    if any(t.delete_files for t in tasks):
        raise NotImplementedError("snapshots with merge-on-read delete files are not supported")
    return [t.file for t in tasks]


def appended_file_paths(table: Table, after: int | None, upto: int | None) -> list[str]:
    """Paths of the data files added by the snapshots in `(after, upto]`, checked.

    Uses pyiceberg's incremental append scan: the data files whose manifest entry
    is ADDED by an append snapshot in the ancestor chain from `upto` back to (not
    including) `after` (`after=None`: from the first snapshot). Raises
    :class:`NotAppendOnly` if the range holds an overwrite or delete snapshot,
    because rows those removed or replaced would silently be missed, and ValueError
    if `after` is not an ancestor of `upto`.
    """
    if upto is None or upto == after:
        return []
    _require_append_only(table, after, upto)
    scan = table.incremental_append_scan(
        from_snapshot_id_exclusive=after, to_snapshot_id_inclusive=upto
    )
    return [t.file.file_path for t in scan.plan_files()]


def range_file_paths(table: Table, after: int | None, upto: int | None) -> list[str]:
    """The data files a batch reads for the snapshot range `(after, upto]` of an input.

    A first read (no start snapshot: a new reader, or a start that was expired since)
    reads the table's full state at `upto`: the increments of the snapshots that
    survived would miss what the expired ones added. Otherwise the files added in the
    range, which must be append-only (:func:`appended_file_paths`).
    """
    if upto is None or upto == after:
        return []
    if after is None or table.snapshot_by_id(after) is None:
        return data_file_paths(table, upto)
    return appended_file_paths(table, after, upto)


def snapshots_in_range(table: Table, after: int | None, upto: int) -> list[Snapshot]:
    """The snapshots in `(after, upto]`: the ancestors of `upto` back to (not including)
    `after`, newest first (`after=None`: back to the first snapshot).

    Comparing with each snapshot's parent also accepts an `after` that was since
    expired. Raises ValueError if `upto` does not exist or `after` is not an ancestor.
    """
    upto_snap = table.snapshot_by_id(upto)
    if upto_snap is None:
        raise ValueError(f"snapshot {upto} not found in table {table.name()}")
    found = []
    for snap in ancestors_of(upto_snap, table.metadata):
        found.append(snap)
        if snap.parent_snapshot_id == after:
            return found
    raise ValueError(f"snapshot {after} is not an ancestor of snapshot {upto}")


def _require_append_only(table: Table, after: int | None, upto: int) -> None:
    for snap in snapshots_in_range(table, after, upto):
        operation = snap.summary.operation if snap.summary else None
        if operation not in _APPEND_ONLY_OPERATIONS:
            name = ".".join(table.name())
            kind = operation.value if isinstance(operation, Operation) else operation
            raise NotAppendOnly(
                f"table {name} is not append-only between snapshots {after} and {upto}: "
                f"snapshot {snap.snapshot_id} is a {kind} snapshot (an upsert, CDC, overwrite "
                "or delete), and an incremental read of its rows would silently miss the "
                "rows it replaced or deleted. Read its changes instead: "
                f"job.source('{name}', changelog=True) gives each batch the rows inserted, "
                "deleted and updated, with a _change_type column. Or read it whole as of "
                f"the batch's barrier: declare it in register(..., lookups=['{name}']) and "
                f"call ctx.read('{name}') in the transform"
            )
