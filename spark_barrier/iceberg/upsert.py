"""Upserts: replacing rows by key, rewriting only the files that hold the batch's keys.

Which current files hold a changed key is found on the driver from the key columns
alone (pyiceberg's Arrow reader) when the candidate files and the changed keys allow
it (at most ``DRIVER_MATCH_MAX_ROWS`` rows, ``DRIVER_MATCH_MAX_FILES`` files, integer
or string keys, no null key), else by a distributed semi join in Spark. The answer is
the same; the driver's costs no Spark job: at 1M keys the semi join cost about 850 ms
(two jobs, and a broadcast of the keys built on the driver anyway), the key columns
read and matched by Arrow about a tenth of it.

An affected file whose every row holds a changed key is removed with nothing
rewritten. The others are rewritten without those keys: on the driver when they are
small (at most ``DRIVER_REWRITE_MAX_ROWS`` rows), else by Spark (an anti join with the
changed keys; plain equality when no key is null, which Spark builds a broadcast of
faster than of the null-safe one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (
    AlwaysTrue,
    BooleanExpression,
)
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import (
    IntegerType,
    LongType,
    StringType,
)
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_barrier.iceberg.files import (
    delete_folder,
    path_key,
    spark_path_key,
    write_arrow_files,
    write_data_files,
)
from spark_barrier.iceberg.key_bounds import file_bounds, key_range_filter
from spark_barrier.iceberg.read import read_files
from spark_barrier.iceberg.scan import data_files
from spark_barrier.iceberg.transaction import NOT_LANDED, commit_files
from spark_barrier.jvm import quoted, sql_over
from spark_barrier.steps import step

log = logging.getLogger(__name__)

# The driver finds the files holding the changed keys itself when the candidate files
# hold at most this many rows in at most this many files, and there are at most this
# many changed keys, all of these types (whose Arrow values Spark and pyiceberg agree on).
# It reads their key columns only: 2M long keys are 16 MB (a broadcast join of the
# changed keys brings them to the driver anyway).
DRIVER_MATCH_MAX_ROWS = 2_000_000
DRIVER_MATCH_MAX_FILES = 64
# Files matched on the driver holding at most this many rows are rewritten there too
# (every column read by the driver); larger ones by Spark.
DRIVER_REWRITE_MAX_ROWS = 100_000
_DRIVER_MATCH_KEY_TYPES = (IntegerType, LongType, StringType)


# The columns a last-row-per-key query adds: its rows' arrival order, and their rank.
ARRIVAL, RANK = "__ms_order", "__ms_rank"


def last_first(order_by: str | None) -> str:
    """The ORDER BY of a key's rows, last first: the largest `order_by` (nulls last),
    then the row that came last in the batch (the largest :data:`ARRIVAL`, from
    monotonically_increasing_id, which follows the batch's partition and row order)."""
    by_arrival = f"{ARRIVAL} DESC"
    return by_arrival if order_by is None else f"{quoted(order_by)} DESC NULLS LAST, {by_arrival}"


def last_row_per_key(
    df: DataFrame,
    keys: list[str],
    order_by: str | None = None,
    columns: list[str] | None = None,
) -> DataFrame:
    """The last row of each key: the largest `order_by` (nulls first), then the row
    that came last in the batch. `columns`: those of `df`, when the caller knows them.
    One SQL query (a few Py4J calls: the DataFrame API makes one per column and
    operator)."""
    by_key = ", ".join(quoted(k) for k in keys)
    listed = ", ".join(quoted(c) for c in (columns if columns is not None else df.columns))
    return sql_over(
        {"rows": df},
        f"""
        SELECT {listed} FROM (
            SELECT *, row_number() OVER (PARTITION BY {by_key} ORDER BY {last_first(order_by)})
                AS {RANK}
            FROM (SELECT *, monotonically_increasing_id() AS {ARRIVAL} FROM {{rows}})
        ) WHERE {RANK} = 1
        """,
    )


def upsert_attempt(
    spark: SparkSession,
    table: Table,
    stamp: dict[str, str],
    batch_files: list[DataFile],
    keys: list[str],
    rewrite_folder: str,
    batch_key_rows: pa.Table | None = None,
) -> int:
    """Plan against the table's current snapshot, rewrite affected files, commit.
    `batch_key_rows`: the batch's keys, when the driver has read them already."""

    # The batch is read back from its written files rather than recomputed from the
    # caller's DataFrame, whose lineage may re-read a source; only when Spark matches
    # the keys (a DataFrame costs the driver an analysis even when unused).
    def batch_keys() -> DataFrame:
        return read_files(spark, table, [f.file_path for f in batch_files]).select(*keys)

    key_filter = key_range_filter(table, keys, lambda field: file_bounds(batch_files, field))
    snapshot = replace_keys_attempt(
        spark,
        table,
        stamp,
        batch_files,
        batch_keys,
        keys,
        key_filter,
        rewrite_folder,
        changed_key_files=batch_files,
        changed_key_rows=batch_key_rows,
    )
    assert snapshot is not None  # the batch's own files are always committed
    return snapshot


def replace_keys_attempt(
    spark: SparkSession,
    table: Table,
    stamp: dict[str, str],
    added: list[DataFile],
    changed_keys: Callable[[], DataFrame],
    keys: list[str],
    key_filter: BooleanExpression,
    rewrite_folder: str,
    changed_key_files: list[DataFile] | None = None,
    changed_key_rows: pa.Table | None = None,
) -> int | None:
    """One snapshot that removes every row of `changed_keys()` (columns `keys`) from
    the table and adds the files `added`: the current files holding any of those keys
    (among those `key_filter` leaves) are rewritten without them, the others are left
    untouched. An overwrite; a delete when only files are removed. None when there is
    nothing to commit (no file added, no row removed). The driver needs the keys
    themselves only when few files are candidates: `changed_key_files`, data files
    whose keys are exactly the changed keys (an upsert's batch), or `changed_key_rows`,
    the changed keys already on the driver (a small CDC batch's), spare Spark a job;
    `changed_keys` is called only when Spark must find or match them."""
    with step("commit.match"):
        candidates = data_files(table, None, key_filter)
        small = _match_on_driver(
            table, candidates, changed_keys, keys, changed_key_files, changed_key_rows
        )
        if small is not None:
            affected = small.affected
        else:
            batch_keys = _aliased_keys(changed_keys(), keys)
            affected = _files_with_keys(spark, table, candidates, batch_keys, keys)
    if not affected:
        with step("commit.iceberg"):
            return commit_files(table, stamp, added, []) if added else None
    try:
        with step("commit.rewrite"):
            if small is None:
                rewritten = _rewrite_in_spark(
                    spark, table, affected, batch_keys, keys, rewrite_folder, null_safe=True
                )
            elif not small.partly:
                rewritten = []  # every row of the affected files is replaced
            elif _rows(small.partly) <= DRIVER_REWRITE_MAX_ROWS:
                rewritten = small.rewrite(table, keys, rewrite_folder)
            else:
                # No null among the changed keys (else Spark would have matched them).
                changed = _aliased_keys(changed_keys(), keys)
                rewritten = _rewrite_in_spark(
                    spark, table, small.partly, changed, keys, rewrite_folder, null_safe=False
                )
        with step("commit.iceberg"):
            return commit_files(table, stamp, added + rewritten, affected)
    except NOT_LANDED:
        delete_folder(rewrite_folder, table.io)
        raise


def _rewrite_in_spark(
    spark: SparkSession,
    table: Table,
    files: list[DataFile],
    changed: DataFrame,
    keys: list[str],
    folder: str,
    *,
    null_safe: bool,
) -> list[DataFile]:
    """`files` without the rows whose keys `changed` (aliased keys) holds, written by
    Spark into `folder`. `null_safe`: a null key matches a null key (else the changed
    keys are known to hold no null, and plain equality says the same)."""
    kept = read_files(spark, table, [f.file_path for f in files]).join(
        changed, _key_match(keys, null_safe=null_safe), "left_anti"
    )
    # At most the files' rows: the writer is chosen by them.
    return write_data_files(kept, folder, table, expected_rows=_rows(files))


def _aliased_keys(changed_keys: DataFrame, keys: list[str]) -> DataFrame:
    return changed_keys.select(*[F.col(k).alias(_key_alias(i)) for i, k in enumerate(keys)])


def _files_with_keys(
    spark: SparkSession,
    table: Table,
    candidates: list[DataFile],
    batch_keys: DataFrame,
    keys: list[str],
) -> list[DataFile]:
    """The candidate files holding at least one batch key (a distributed semi join)."""
    if not candidates:
        return []
    by_path = {path_key(f.file_path): f for f in candidates}
    paths = [f.file_path for f in candidates]
    current = read_files(spark, table, paths, file_uri_column="__ms_file").select(
        *keys, "__ms_file"
    )
    hits = (
        current.join(batch_keys, _key_match(keys), "left_semi")
        .select("__ms_file")
        .distinct()
        .collect()
    )
    return [by_path[spark_path_key(row["__ms_file"])] for row in hits]


@dataclass(frozen=True)
class _SmallMatch:
    """The files holding changed keys, found on the driver, and the keys (Arrow):
    `partly`, those of them that also hold rows of other keys (the ones to rewrite)."""

    affected: list[DataFile]
    changed: pa.Table
    partly: list[DataFile]

    def rewrite(self, table: Table, keys: list[str], folder: str) -> list[DataFile]:
        """The partly affected files without the changed keys' rows, rewritten on the
        driver (they hold few rows: see DRIVER_REWRITE_MAX_ROWS) into `folder`."""
        rows = _read(table, self.partly, table.schema())
        # Joined on the keys and a row number only: other columns may be of types
        # Arrow's join cannot carry.
        numbered = _with_plain_keys(rows.select(keys), keys).append_column(
            "__ms_row", pa.array(range(rows.num_rows), pa.int64())
        )
        probe = self.changed.select(keys).cast(numbered.select(keys).schema)
        hit = numbered.join(probe, keys=keys, join_type="left semi").column("__ms_row")
        kept = pc.invert(pc.is_in(numbered.column("__ms_row"), value_set=hit.combine_chunks()))
        return write_arrow_files(rows.filter(kept), folder, table)


def _match_on_driver(
    table: Table,
    candidates: list[DataFile],
    changed_keys: Callable[[], DataFrame],
    keys: list[str],
    changed_key_files: list[DataFile] | None,
    changed_key_rows: pa.Table | None = None,
) -> _SmallMatch | None:
    """The candidate files holding at least one changed key, found on the driver from
    the key columns only; None when it is a job for Spark (too many rows or files, a
    key type or a null key whose matching Spark's null-safe join must decide). The
    keys come from `changed_key_rows`, else `changed_key_files`, else a Spark job
    over the DataFrame `changed_keys()` builds."""
    if not _driver_matches_key_types(table, keys):
        return None
    if len(candidates) > DRIVER_MATCH_MAX_FILES or _rows(candidates) > DRIVER_MATCH_MAX_ROWS:
        return None
    if not candidates:
        return _SmallMatch([], pa.table({}), [])
    if changed_key_rows is not None:
        if changed_key_rows.num_rows > DRIVER_MATCH_MAX_ROWS:
            return None
        wanted = _with_plain_keys(changed_key_rows.select(keys), keys)
    elif changed_key_files is not None:
        if _rows(changed_key_files) > DRIVER_MATCH_MAX_ROWS:
            return None
        wanted = _key_columns(table, changed_key_files, keys)
    else:
        # One small Spark job (the changes are cached while the batch commits), which
        # stops after the limit: more keys than that are matched by Spark.
        wanted = changed_keys().select(*keys).limit(DRIVER_MATCH_MAX_ROWS + 1).toArrow()
        if wanted.num_rows > DRIVER_MATCH_MAX_ROWS:
            return None
    if any(wanted.column(k).null_count for k in keys):
        return None
    held = [_key_columns(table, [data_file], keys) for data_file in candidates]
    affected, partly = [], []
    for data_file, rows, hits in zip(candidates, held, _hits(held, wanted, keys), strict=True):
        if hits:
            affected.append(data_file)
            if hits < rows.num_rows:
                partly.append(data_file)
    return _SmallMatch(affected, wanted, partly)


def _hits(held: list[pa.Table], wanted: pa.Table, keys: list[str]) -> list[int]:
    """How many rows of each of `held` have a key of `wanted` (neither holds a null key)."""
    if not held:
        return []
    probe = wanted.select(keys).cast(held[0].schema)
    if len(keys) > 1:
        return [int(rows.join(probe, keys=keys, join_type="left semi").num_rows) for rows in held]
    # One set lookup over every file's keys: the set of `wanted` is built once.
    found = pc.is_in(
        pa.chunked_array(
            [c for rows in held for c in rows.column(keys[0]).chunks], probe.schema[0].type
        ),
        value_set=probe.column(keys[0]).combine_chunks(),
    )
    counts, start = [], 0
    for rows in held:
        counts.append(int(pc.sum(found.slice(start, rows.num_rows)).as_py() or 0))
        start += rows.num_rows
    return counts


def may_check_keys_on_driver(table: Table, keys: list[str], rows: int) -> bool:
    """Whether :func:`unique_keys` reads the keys of a batch of `rows` rows."""
    return rows <= DRIVER_MATCH_MAX_ROWS and _driver_matches_key_types(table, keys)


def _driver_matches_key_types(table: Table, keys: list[str]) -> bool:
    """Whether every key is of a type whose Arrow values Spark and pyiceberg agree on
    (see _DRIVER_MATCH_KEY_TYPES), so the driver may read and match the keys itself."""
    schema = table.schema()
    return all(isinstance(schema.find_field(k).field_type, _DRIVER_MATCH_KEY_TYPES) for k in keys)


def unique_keys(table: Table, files: list[DataFile], keys: list[str]) -> pa.Table | None:
    """The key columns of `files` (read by the driver), when no key is in them twice
    (a null key counts as a key); None when one is, or when they are too many to read
    (see :func:`may_check_keys_on_driver`)."""
    if not may_check_keys_on_driver(table, keys, _rows(files)):
        return None
    if not files:
        return _with_plain_keys(pa.table({k: pa.array([], pa.int64()) for k in keys}), keys)
    found = _key_columns(table, files, keys)
    return found if unique_rows(found, keys) else None


def unique_rows(rows: pa.Table, keys: list[str]) -> bool:
    """Whether no two of `rows` have the same `keys` (a null is a value like any other)."""
    if len(keys) == 1:
        distinct = pc.count_distinct(rows.column(keys[0]), mode="all").as_py()
    else:
        distinct = rows.group_by(keys).aggregate([]).num_rows
    return bool(distinct == rows.num_rows)


def _rows(files: list[DataFile]) -> int:
    return sum(f.record_count for f in files)


def _read(table: Table, files: list[DataFile], schema: Schema) -> pa.Table:
    """Columns `schema` of `files`, read by pyiceberg (field ids, name mapping, FileIO)."""
    scan = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
    return scan.to_table([FileScanTask(f) for f in files])


def _key_columns(table: Table, files: list[DataFile], keys: list[str]) -> pa.Table:
    return _with_plain_keys(_read(table, files, table.schema().select(*keys)), keys)


def _with_plain_keys(rows: pa.Table, keys: list[str]) -> pa.Table:
    """`rows` with its key columns as plain values: pyiceberg may hand strings back
    dictionary-encoded or as large strings, and a join needs both sides alike."""
    for key in keys:
        i = rows.schema.get_field_index(key)
        plain = _plain(rows.schema.field(key).type)
        rows = rows.set_column(
            i, rows.schema.field(key).with_type(plain), rows.column(key).cast(plain)
        )
    return rows


def _plain(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return pa.large_string()
    return arrow_type


def _key_alias(i: int) -> str:
    return f"__ms_key_{i}"


def _key_match(keys: list[str], null_safe: bool = True) -> Column:
    # Null-safe: a null key is a key like any other (upserting it replaces the old row).
    cond: Column | None = None
    for i, k in enumerate(keys):
        other = F.col(_key_alias(i))
        term = F.col(k).eqNullSafe(other) if null_safe else F.col(k) == other
        cond = term if cond is None else cond & term
    assert cond is not None
    return cond
