"""CDC apply: a batch of change records (insert, update, delete by key) applied to a
table as one snapshot.

Each record carries the table's columns and an op column: ``I``/``U``/``D``, or
``INSERT``/``UPDATE``/``DELETE`` (case-insensitive, surrounding blanks ignored). Per
key, the batch's last record wins (the largest ``order_by`` value when one is given,
else the last in the batch); a key whose last op is a delete leaves the table, the
others are upserted (an insert of an existing key replaces it, an update of a missing
one inserts it). The op column (and an ``order_by`` column that is not a table column)
is not stored.

A record with a null key column or an op that is none of the above fails the whole
batch before anything is written.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, FloatType
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from spark_barrier.iceberg.upsert import last_row_per_key, may_check_keys_on_driver
from spark_barrier.jvm import quoted

log = logging.getLogger(__name__)

OPS = {"I": "I", "INSERT": "I", "U": "U", "UPDATE": "U", "D": "D", "DELETE": "D"}
DELETE_OP = "D"
OP = "__ms_op"  # the normalized op of a record (null: not a known op)
_SHOWN = 5  # bad records quoted in an error


class CdcInputError(ValueError):
    """A change record cannot be applied (null key, unknown op); nothing was committed."""


def normalized_op(op_column: str) -> Column:
    """``I``, ``U`` or ``D`` for a known op, else null."""
    return F.expr(normalized_op_sql(op_column))


def normalized_op_sql(op_column: str) -> str:
    """:func:`normalized_op` as a Spark SQL expression."""
    known = ", ".join(f"'{x}'" for pair in OPS.items() for x in pair)
    return f"map({known})[upper(trim(CAST({quoted(op_column)} AS STRING)))]"


def check_changes(
    rows: DataFrame,
    keys: Sequence[str],
    op_column: str,
    where: str,
    aggregates: Sequence[Column] = (),
) -> Row:
    """Raise :class:`CdcInputError` naming the first bad records of the batch; else the
    row of `aggregates` over `rows`, computed in the same Spark job as the check."""
    null_key = F.lit(False)
    for key in keys:
        null_key = null_key | F.col(key).isNull()
    is_bad = null_key | normalized_op(op_column).isNull()
    (found,) = rows.agg(F.count_if(is_bad).alias("__ms_bad_records"), *aggregates).collect()
    if not found["__ms_bad_records"]:
        return found
    shown = rows.where(is_bad).select(*keys, op_column).limit(_SHOWN).collect()
    problems = "; ".join(_problem(row.asDict(), keys, op_column) for row in shown)
    raise CdcInputError(
        f"{where}: change records that cannot be applied ({problems}"
        f"{'; and maybe more' if found['__ms_bad_records'] > _SHOWN else ''}). Every record "
        f"needs its key columns {list(keys)} and an op in {op_column!r} of I/U/D or "
        "INSERT/UPDATE/DELETE. Nothing of the batch was committed; fix or filter the "
        "change feed and restart the query, which runs the batch again"
    )


def changed_keys_on_driver(
    table: Table, records: DataFrame, keys: list[str], checked: Row
) -> pa.Table | None:
    """The keys of `records` (checked by :func:`check_changes`, whose row `checked` with
    :func:`~spark_barrier.iceberg.key_bounds.key_bound_aggregates` counts them), brought to
    the driver; None when they are too many for it (see
    :func:`~spark_barrier.iceberg.upsert.may_check_keys_on_driver`)."""
    if not may_check_keys_on_driver(table, keys, checked["__ms_rows"]):
        return None
    return records.select(*keys).toArrow()


def _problem(record: dict[str, Any], keys: Sequence[str], op_column: str) -> str:
    nulls = [k for k in keys if record[k] is None]
    shown = ", ".join(f"{k}={record[k]!r}" for k in [*keys, op_column])
    if nulls:
        return f"record {{{shown}}} has no key: {', '.join(nulls)} is null"
    return f"record {{{shown}}} has the unknown op {record[op_column]!r}"


def check_key_types(table: Table, keys: Sequence[str]) -> None:
    for key in keys:
        field = table.schema().find_field(key)
        if not field.field_type.is_primitive or isinstance(
            field.field_type, (FloatType, DoubleType)
        ):
            raise ValueError(
                f"key column {key} of table {table.name()} is {field.field_type}: CDC keys "
                "must be of a primitive type other than float or double"
            )


def declare_keys(table: Table, keys: Sequence[str]) -> None:
    """Record `keys` as the table's identifier fields (Iceberg's primary key, which
    changelog readers pair updates by), unless it has some already.

    Identifier fields must be required columns, so the key columns become required
    (CDC refuses null keys anyway). Raises ValueError when the table's identifier
    fields are other columns.
    """
    schema = table.schema()
    current = [schema.find_column_name(i) for i in schema.identifier_field_ids]
    if current == list(keys) or set(current) == set(keys):
        return
    if current:
        raise ValueError(
            f"table {table.name()} is keyed by {current} (its identifier fields), not by "
            f"{list(keys)}: apply changes by its key, or change the table's identifier "
            "fields first"
        )
    with table.update_schema(allow_incompatible_changes=True) as update:
        for key in keys:
            if not schema.find_field(key).required:
                update.update_column(key, required=True)
        update.set_identifier_fields(*keys)
    log.info("table %s is now keyed by %s", table.name(), list(keys))


def last_changes(
    rows: DataFrame, keys: list[str], op_column: str, order_by: str | None
) -> DataFrame:
    """The batch's last change per key, with its normalized op in ``__ms_op``."""
    with_op = rows.withColumn(OP, normalized_op(op_column))
    return last_row_per_key(with_op, keys, order_by)
