"""Pruning by key bounds: the files an upsert or a CDC batch may touch, from the changed
keys' min and max per key column against each file's Parquet statistics.

The changed keys' bounds come either from Spark aggregates computed with the batch's
others (:func:`key_bound_aggregates`, no Spark job of their own), from Arrow on the
driver (:func:`key_bounds`), or from the batch's own files' statistics
(:func:`file_bounds`); :func:`key_range_filter` turns them into a pyiceberg filter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
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
from pyspark.sql import Column, Row
from pyspark.sql import functions as F

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


def key_bounds(table: Table, keys: list[str], found: pa.Table | None) -> dict[str, Any]:
    """The row of :func:`key_bound_aggregates` over the changed keys `found` (no null
    among them: a null key is a bad record)."""
    rows = 0 if found is None else found.num_rows
    row: dict[str, Any] = {"__ms_rows": rows}
    for i, key in enumerate(_bounded_keys(table, keys)):
        assert found is not None or rows == 0
        bounds = pc.min_max(found.column(key)) if found is not None else None
        row[f"__ms_min_{i}"] = bounds["min"].as_py() if bounds is not None else None
        row[f"__ms_max_{i}"] = bounds["max"].as_py() if bounds is not None else None
        row[f"__ms_known_{i}"] = rows
    return row


Bounds = tuple[Any, Any]


def key_range_filter(
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


def file_bounds(files: list[DataFile], field: NestedField) -> Bounds | None:
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


def key_filter_from_bounds(
    table: Table, keys: list[str], row: Row | Mapping[str, Any]
) -> BooleanExpression:
    """:func:`key_range_filter` with the bounds of a row of :func:`key_bound_aggregates`
    over the changed keys; AlwaysFalse when nothing changed."""
    if row["__ms_rows"] == 0:
        return AlwaysFalse()
    found: dict[str, Bounds] = {}
    for i, key in enumerate(_bounded_keys(table, keys)):
        if row[f"__ms_known_{i}"] == row["__ms_rows"]:  # else a null key: no bounds
            found[key] = (row[f"__ms_min_{i}"], row[f"__ms_max_{i}"])
    return key_range_filter(table, keys, lambda field: found.get(field.name))


def _bounded_keys(table: Table, keys: list[str]) -> list[str]:
    schema = table.schema()
    return [k for k in keys if isinstance(schema.find_field(k).field_type, _FRAME_BOUND_TYPES)]
