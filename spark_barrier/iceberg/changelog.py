"""Changelog reads: the net changes of a table between two snapshots, as Iceberg's
changelog view with net changes computes them (copy-on-write tables: no delete files).

The driver plans files only (:func:`changelog_files`): per snapshot in `(from, to]`,
the data files its own manifests record as ADDED or DELETED by it. Over the range, a
file both added and removed inside it cancels out; what remains is

- *removed*: files live at `from` that the range removed, i.e. the rows as they were;
- *added*: files the range added that are live at `to`, i.e. the rows as they are.

Spark reads both natively and nets them (:func:`read_changelog`): a row present the
same number of times on both sides is a carry-over of a rewritten file (an upsert
rewrites a whole file to replace one row of it) and no change; the others are
``DELETE`` (only before) or ``INSERT`` (only after). With key columns, a key that is
both deleted and inserted is an update: ``UPDATE_BEFORE`` and ``UPDATE_AFTER``.

A first read (no start snapshot: a new reader, or a start that was since expired)
gets the table's state at `to`, every row an ``INSERT``, as append reads do.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_barrier.iceberg.read import read_files
from spark_barrier.iceberg.scan import data_file_paths, snapshots_in_range
from spark_barrier.jvm import quoted, sql_over

log = logging.getLogger(__name__)

CHANGE_TYPE = "_change_type"
INSERT, DELETE = "INSERT", "DELETE"
UPDATE_BEFORE, UPDATE_AFTER = "UPDATE_BEFORE", "UPDATE_AFTER"
CHANGE_TYPES = (INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER)

_COUNT = "__ms_net"  # how many more times a row is in `added` than in `removed`
_COPY = "__ms_copy"  # one of the copies of a row changed several times


@dataclass(frozen=True)
class ChangelogFiles:
    """The data files a changelog read of `(from, to]` reads (paths)."""

    removed: list[str]  # live at `from`, gone at `to`: the rows before
    added: list[str]  # not live at `from`, live at `to`: the rows after

    @property
    def empty(self) -> bool:
        return not self.removed and not self.added


def changelog_files(table: Table, after: int | None, upto: int | None) -> ChangelogFiles:
    """Plan the changelog of the snapshot range `(after, upto]` of `table` (no rows read).

    Raises ValueError if `after` is not an ancestor of `upto`, and NotImplementedError
    for merge-on-read delete files (nothing here writes them).
    """
    if upto is None or upto == after:
        return ChangelogFiles([], [])
    if after is None or table.snapshot_by_id(after) is None:
        return ChangelogFiles([], data_file_paths(table, upto))
    added: set[str] = set()
    removed: set[str] = set()
    for snapshot in snapshots_in_range(table, after, upto):
        for manifest in snapshot.manifests(table.io):
            # Only manifests the snapshot wrote hold its ADDED and DELETED entries;
            # older ones it carries over list EXISTING files.
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            if manifest.content != ManifestContent.DATA:
                raise NotImplementedError(
                    f"snapshot {snapshot.snapshot_id} of table {table.name()} has "
                    "merge-on-read delete files, which changelog reads do not support"
                )
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                if entry.snapshot_id != snapshot.snapshot_id:
                    continue
                if entry.status == ManifestEntryStatus.ADDED:
                    added.add(entry.data_file.file_path)
                elif entry.status == ManifestEntryStatus.DELETED:
                    removed.add(entry.data_file.file_path)
    transient = added & removed  # added and removed again inside the range
    return ChangelogFiles(sorted(removed - transient), sorted(added - transient))


def read_changelog(
    spark: SparkSession, table: Table, files: ChangelogFiles, keys: Sequence[str] = ()
) -> DataFrame:
    """The changes `files` describe: the table's columns plus ``_change_type``.

    Read by Spark's Parquet reader on the executors. A range that only added files
    (appends) or only removed some costs no shuffle; netting a rewrite costs one
    (grouping by every column, so map-typed columns are not supported), by `keys`
    when given, which serves pairing updates by them too.
    """
    if not files.removed:
        return read_files(spark, table, files.added).withColumn(CHANGE_TYPE, F.lit(INSERT))
    before = read_files(spark, table, files.removed)
    if not files.added:
        return before.withColumn(CHANGE_TYPE, F.lit(DELETE))
    after = read_files(spark, table, files.added)
    columns = [f.name for f in table.schema().fields]  # as read_files reads them
    return sql_over({"before": before, "after": after}, _changes_query(columns, keys))


def _changes_query(columns: Sequence[str], keys: Sequence[str]) -> str:
    """The net changes between ``{before}`` and ``{after}`` (one SQL query: built with
    the DataFrame API it cost the driver a Py4J call per column and operator).

    Rows of `after` not in `before` are INSERT, rows of `before` not in `after` DELETE,
    each as many times as the difference of their counts (a multiset difference both
    ways, in one aggregation: exceptAll twice would shuffle twice). With `keys`, a key
    both deleted and inserted was updated: UPDATE_BEFORE and UPDATE_AFTER."""
    listed = ", ".join(quoted(c) for c in columns)
    by_key = ", ".join(quoted(k) for k in keys)
    # With keys, the rows are shuffled once, by key: that partitioning serves both the
    # aggregation by every column (the key among them) and the pairing by key, which
    # would otherwise shuffle the netted rows a second time.
    by_key_first = f"DISTRIBUTE BY {by_key}" if keys else ""
    net = f"""
        SELECT {listed},
            CASE WHEN {_COUNT} > 0 THEN '{INSERT}' ELSE '{DELETE}' END AS {CHANGE_TYPE}
        FROM (
            SELECT {listed}, sum({_COUNT}) AS {_COUNT} FROM (
                SELECT * FROM (
                    SELECT {listed}, -1 AS {_COUNT} FROM {{before}}
                    UNION ALL
                    SELECT {listed}, 1 AS {_COUNT} FROM {{after}}
                ) {by_key_first}
            ) GROUP BY {listed}
        )
        LATERAL VIEW explode(array_repeat(0, CAST(abs({_COUNT}) AS INT))) {_COPY}s AS {_COPY}
    """
    if not keys:
        return net

    def seen(kind: str) -> str:
        return f"max(CAST({CHANGE_TYPE} = '{kind}' AS INT)) OVER (PARTITION BY {by_key}) = 1"

    return f"""
        SELECT {listed},
            CASE WHEN {seen(INSERT)} AND {seen(DELETE)}
                THEN CASE WHEN {CHANGE_TYPE} = '{INSERT}' THEN '{UPDATE_AFTER}'
                    ELSE '{UPDATE_BEFORE}' END
                ELSE {CHANGE_TYPE} END AS {CHANGE_TYPE}
        FROM ({net})
    """
