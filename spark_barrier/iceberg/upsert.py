"""Upserts: replacing rows by key, rewriting only the files that hold the batch's keys."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    LessThanOrEqual,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.types import (
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from spark_barrier.iceberg.files import delete_folder, path_key, spark_path_key, write_data_files
from spark_barrier.iceberg.read import read_files
from spark_barrier.iceberg.scan import data_files
from spark_barrier.iceberg.transaction import NOT_LANDED, commit_files
from spark_barrier.steps import step

log = logging.getLogger(__name__)

# Key types whose file-level min/max statistics are safe to prune with (floats
# are left out: NaN bounds make range pruning unreliable).
_PRUNABLE_KEY_TYPES = (
    IntegerType,
    LongType,
    StringType,
    DateType,
    TimestampType,
    TimestamptzType,
    DecimalType,
)
# Key types whose bounds Spark returns as pyiceberg takes them (dates and timestamps
# would need converting to days and micros).
_FRAME_BOUND_TYPES = (IntegerType, LongType, StringType, DecimalType)


def last_row_per_key(df: DataFrame, keys: list[str], order_by: str | None = None) -> DataFrame:
    """The last row of each key: the largest `order_by` (nulls first), then the row
    that came last in the batch."""
    # monotonically_increasing_id follows the batch's partition and row order, so
    # "largest id" is the row that came last in the batch.
    order, rank = "__ms_order", "__ms_rank"
    ordering = [F.col(order).desc()]
    if order_by is not None:
        ordering.insert(0, F.col(order_by).desc_nulls_last())
    window = Window.partitionBy(*keys).orderBy(*ordering)
    return (
        df.withColumn(order, F.monotonically_increasing_id())
        .withColumn(rank, F.row_number().over(window))
        .where(F.col(rank) == 1)
        .drop(order, rank)
    )


def upsert_attempt(
    spark: SparkSession,
    table: Table,
    stamp: dict[str, str],
    batch_files: list[DataFile],
    keys: list[str],
    rewrite_folder: str,
) -> int:
    """Plan against the table's current snapshot, rewrite affected files, commit."""
    # The batch is read back from its written files rather than recomputed from the
    # caller's DataFrame, whose lineage may re-read a source.
    batch = read_files(spark, table, [f.file_path for f in batch_files])
    key_filter = _key_range_filter(table, keys, lambda field: _file_bounds(batch_files, field))
    snapshot = replace_keys_attempt(
        spark, table, stamp, batch_files, batch.select(*keys), keys, key_filter, rewrite_folder
    )
    assert snapshot is not None  # the batch's own files are always committed
    return snapshot


def replace_keys_attempt(
    spark: SparkSession,
    table: Table,
    stamp: dict[str, str],
    added: list[DataFile],
    changed_keys: DataFrame,
    keys: list[str],
    key_filter: BooleanExpression,
    rewrite_folder: str,
) -> int | None:
    """One snapshot that removes every row of `changed_keys` (columns `keys`) from the
    table and adds the files `added`: the current files holding any of those keys
    (among those `key_filter` leaves) are rewritten without them, the others are left
    untouched. An overwrite; a delete when only files are removed. None when there is
    nothing to commit (no file added, no row removed)."""
    batch_keys = changed_keys.select(*[F.col(k).alias(_key_alias(i)) for i, k in enumerate(keys)])
    with step("commit.match"):
        candidates = data_files(table, None, key_filter)
        affected = _files_with_keys(spark, table, candidates, batch_keys, keys)
    if not affected:
        with step("commit.iceberg"):
            return commit_files(table, stamp, added, []) if added else None
    try:
        kept = read_files(spark, table, [f.file_path for f in affected]).join(
            batch_keys, _key_match(keys), "left_anti"
        )
        with step("commit.rewrite"):
            rewritten = write_data_files(kept, rewrite_folder, table)
        with step("commit.iceberg"):
            return commit_files(table, stamp, added + rewritten, affected)
    except NOT_LANDED:
        delete_folder(rewrite_folder)
        raise


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


def _key_alias(i: int) -> str:
    return f"__ms_key_{i}"


def _key_match(keys: list[str]) -> Column:
    # Null-safe: a null key is a key like any other (upserting it replaces the old row).
    cond: Column | None = None
    for i, k in enumerate(keys):
        term = F.col(k).eqNullSafe(F.col(_key_alias(i)))
        cond = term if cond is None else cond & term
    assert cond is not None
    return cond


Bounds = tuple[Any, Any]


def _key_range_filter(
    table: Table, keys: list[str], bounds_of: Callable[[NestedField], Bounds | None]
) -> BooleanExpression:
    """Prune files whose key min/max statistics cannot overlap the changed keys.

    `bounds_of(field)` gives the changed keys' (min, max) of a key column, in
    pyiceberg's representation, or None when it cannot tell (null keys, missing
    statistics): that column is not pruned on. Float keys never are (NaN bounds make
    range pruning unreliable); with no bounds the expression is AlwaysTrue.
    """
    expr: BooleanExpression = AlwaysTrue()
    schema = table.schema()
    for key in keys:
        field = schema.find_field(key)
        if not isinstance(field.field_type, _PRUNABLE_KEY_TYPES):
            continue
        bounds = bounds_of(field)
        if bounds is not None:
            # mypy sees pydantic's generated signature, not the (term, literal) __init__.
            low = GreaterThanOrEqual(key, bounds[0])  # type: ignore[call-arg]
            high = LessThanOrEqual(key, bounds[1])  # type: ignore[call-arg]
            expr = And(expr, low, high)
    return expr


def _file_bounds(files: list[DataFile], field: NestedField) -> Bounds | None:
    """The bounds of a column over `files`, from their Parquet statistics (no Spark job)."""
    fid, ftype = field.field_id, field.field_type
    lows, highs = [], []
    for f in files:
        nulls = (f.null_value_counts or {}).get(fid)
        low, high = (f.lower_bounds or {}).get(fid), (f.upper_bounds or {}).get(fid)
        if nulls is None or nulls > 0 or low is None or high is None:
            return None
        lows.append(from_bytes(ftype, low))  # type: ignore[arg-type]
        highs.append(from_bytes(ftype, high))  # type: ignore[arg-type]
    return (min(lows), max(highs)) if lows else None


def key_bound_aggregates(table: Table, keys: list[str]) -> list[Column]:
    """The aggregates :func:`key_filter_from_bounds` reads: a row count, and per key
    whose Spark and pyiceberg values agree (ints, strings, decimals) its min, max and
    count of non-null values. Computed with other aggregates of the batch, they cost
    no Spark job of their own."""
    aggregates = [F.count(F.lit(1)).alias("__ms_rows")]
    for i, key in enumerate(_bounded_keys(table, keys)):
        aggregates += [
            F.min(key).alias(f"__ms_min_{i}"),
            F.max(key).alias(f"__ms_max_{i}"),
            F.count(key).alias(f"__ms_known_{i}"),
        ]
    return aggregates


def key_filter_from_bounds(table: Table, keys: list[str], row: Row) -> BooleanExpression:
    """:func:`_key_range_filter` with the bounds of a row of :func:`key_bound_aggregates`
    over the changed keys; AlwaysFalse when nothing changed."""
    if row["__ms_rows"] == 0:
        return AlwaysFalse()
    found: dict[str, Bounds] = {}
    for i, key in enumerate(_bounded_keys(table, keys)):
        if row[f"__ms_known_{i}"] == row["__ms_rows"]:  # else a null key: no bounds
            found[key] = (row[f"__ms_min_{i}"], row[f"__ms_max_{i}"])
    return _key_range_filter(table, keys, lambda field: found.get(field.name))


def _bounded_keys(table: Table, keys: list[str]) -> list[str]:
    schema = table.schema()
    return [k for k in keys if isinstance(schema.find_field(k).field_type, _FRAME_BOUND_TYPES)]
