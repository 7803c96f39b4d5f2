"""Row filters: one pyiceberg expression plans the files of a read and filters its rows.

pyiceberg's scan prunes data files by partition values and column statistics, which
leaves whole files: the rows of a kept file that do not match are dropped by the same
expression, translated here into a Spark condition the executors evaluate.
"""

from __future__ import annotations

import logging
from typing import Any

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.literals import Literal
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import BoundBooleanExpressionVisitor, bind, visit
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    DateType,
    FixedType,
    IcebergType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)
from pyiceberg.utils.datetime import days_to_date, micros_to_timestamp, micros_to_timestamptz
from pyspark.sql import Column
from pyspark.sql import functions as F

log = logging.getLogger(__name__)

RowFilter = BooleanExpression | str


def as_expression(row_filter: RowFilter | None) -> BooleanExpression:
    """`row_filter` as a pyiceberg expression (a string in pyiceberg's syntax is parsed)."""
    if row_filter is None:
        return AlwaysTrue()
    if isinstance(row_filter, str):
        try:
            return parse(row_filter)
        except Exception as exc:  # pyparsing's errors are not one class
            raise ValueError(
                f"cannot read row filter {row_filter!r} ({exc}); write it as pyiceberg does, "
                "e.g. \"region = 'eu' and ordered_at >= '2024-01-01T00:00:00+00:00'\""
            ) from None
    return row_filter


def spark_condition(row_filter: RowFilter, schema: Schema) -> Column:
    """The Spark condition that keeps exactly the rows `row_filter` matches in `schema`."""
    bound = bind(schema, as_expression(row_filter), case_sensitive=True)
    return visit(bound, _ToSparkCondition(schema))


class _ToSparkCondition(BoundBooleanExpressionVisitor[Column]):
    # Spark's three-valued logic drops a row whose condition is null, as pyiceberg's
    # own reader (Arrow compute) does: `x != 1` keeps no null `x` in either.

    def __init__(self, schema: Schema) -> None:
        self._schema = schema

    def _col(self, term: Any) -> Column:
        field = term.ref().field
        name = self._schema.find_column_name(field.field_id) or field.name
        return F.col(".".join(f"`{part.replace('`', '``')}`" for part in name.split(".")))

    def _lit(self, term: Any, value: Any) -> Column:
        return _spark_literal(term.ref().field.field_type, value)

    def visit_in(self, term: Any, literals: set[Any]) -> Column:
        return self._col(term).isin([self._lit(term, v) for v in literals])

    def visit_not_in(self, term: Any, literals: set[Any]) -> Column:
        return ~self._col(term).isin([self._lit(term, v) for v in literals])

    def visit_is_nan(self, term: Any) -> Column:
        return F.isnan(self._col(term))

    def visit_not_nan(self, term: Any) -> Column:
        return ~F.isnan(self._col(term))

    def visit_is_null(self, term: Any) -> Column:
        return self._col(term).isNull()

    def visit_not_null(self, term: Any) -> Column:
        return self._col(term).isNotNull()

    def visit_equal(self, term: Any, literal: Literal[Any]) -> Column:
        return self._col(term) == self._lit(term, literal.value)

    def visit_not_equal(self, term: Any, literal: Literal[Any]) -> Column:
        return self._col(term) != self._lit(term, literal.value)

    def visit_greater_than_or_equal(self, term: Any, literal: Literal[Any]) -> Column:
        return self._col(term) >= self._lit(term, literal.value)

    def visit_greater_than(self, term: Any, literal: Literal[Any]) -> Column:
        return self._col(term) > self._lit(term, literal.value)

    def visit_less_than(self, term: Any, literal: Literal[Any]) -> Column:
        return self._col(term) < self._lit(term, literal.value)

    def visit_less_than_or_equal(self, term: Any, literal: Literal[Any]) -> Column:
        return self._col(term) <= self._lit(term, literal.value)

    def visit_starts_with(self, term: Any, literal: Literal[Any]) -> Column:
        return self._col(term).startswith(self._lit(term, literal.value))

    def visit_not_starts_with(self, term: Any, literal: Literal[Any]) -> Column:
        return ~self._col(term).startswith(self._lit(term, literal.value))

    def visit_true(self) -> Column:
        return F.lit(True)

    def visit_false(self) -> Column:
        return F.lit(False)

    def visit_not(self, child_result: Column) -> Column:
        return ~child_result

    def visit_and(self, left_result: Column, right_result: Column) -> Column:
        return left_result & right_result

    def visit_or(self, left_result: Column, right_result: Column) -> Column:
        return left_result | right_result


def _spark_literal(field_type: IcebergType, value: Any) -> Column:
    # Bound literals hold Iceberg's internal values: days for dates, micros since the
    # epoch for timestamps. Each becomes a Spark literal of the column's own type.
    if isinstance(field_type, DateType):
        return F.lit(days_to_date(value))
    if isinstance(field_type, TimestamptzType):
        return F.lit(micros_to_timestamptz(value))  # an aware datetime: an exact instant
    if isinstance(field_type, TimestampType):
        # A naive datetime given to Spark would be read in the process's time zone.
        wall_clock = micros_to_timestamp(value).isoformat(sep=" ")
        return F.expr(f"TIMESTAMP_NTZ '{wall_clock}'")
    if isinstance(field_type, (BinaryType, FixedType)):
        return F.lit(bytearray(value))
    if isinstance(field_type, (TimeType, UUIDType)):
        raise NotImplementedError(f"row filters on {field_type} columns are not supported")
    return F.lit(value)
