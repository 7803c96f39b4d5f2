"""Partition specs given at registration: `["day(ordered_at)", "bucket(16, item_id)", "region"]`.

Each entry is a bare column (identity) or `transform(column)`, with the width first
for the transforms that take one: `bucket(N, column)`, `truncate(W, column)`. The
time transforms also answer to their plural spelling in Spark's DDL (`days(ts)`).
Partition field names follow pyiceberg's (`ordered_at_day`, `item_id_bucket_16`,
`name_trunc_4`, identity keeps the column's name).

Everything is checked against the table's schema before any table exists, so a bad
spec fails at registration with a message that says what to change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import NestedField

# Partition field ids start here (the Iceberg spec's convention; pyiceberg's too).
_FIRST_PARTITION_FIELD_ID = 1000


@dataclass(frozen=True)
class _Kind:
    """One transform of the spec language: how it is built and named."""

    name: str
    make: Callable[..., Transform[Any, Any]]
    suffix: Callable[..., str]  # the partition field's name after the column's
    takes_width: bool = False
    is_time: bool = False


_IDENTITY = _Kind("identity", IdentityTransform, lambda: "")
_YEAR = _Kind("year", YearTransform, lambda: "_year", is_time=True)
_MONTH = _Kind("month", MonthTransform, lambda: "_month", is_time=True)
_DAY = _Kind("day", DayTransform, lambda: "_day", is_time=True)
_HOUR = _Kind("hour", HourTransform, lambda: "_hour", is_time=True)
_BUCKET = _Kind("bucket", BucketTransform, lambda n: f"_bucket_{n}", takes_width=True)
_TRUNCATE = _Kind("truncate", TruncateTransform, lambda w: f"_trunc_{w}", takes_width=True)

_KINDS: dict[str, _Kind] = {
    "identity": _IDENTITY,
    "year": _YEAR,
    "years": _YEAR,
    "month": _MONTH,
    "months": _MONTH,
    "day": _DAY,
    "days": _DAY,
    "hour": _HOUR,
    "hours": _HOUR,
    "bucket": _BUCKET,
    "truncate": _TRUNCATE,
}

VALID_FORMS = (
    "column (identity), identity(column), year(column), month(column), day(column), "
    "hour(column), bucket(N, column), truncate(W, column)"
)

_CALL = re.compile(r"^(?P<name>\w+)\s*\((?P<args>[^()]*)\)$")
_BARE = re.compile(r"^[^()\s,]+$")


class PartitionSpecError(ValueError):
    """A partition spec that cannot apply to the table's schema; the message says why."""


@dataclass(frozen=True)
class _Entry:
    text: str
    kind: _Kind
    column: str
    width: int | None


def partition_spec(partition_by: Sequence[str], schema: Schema) -> PartitionSpec:
    """The pyiceberg `PartitionSpec` for `partition_by` over `schema` (ids from `schema`).

    An empty `partition_by` is the unpartitioned spec. Raises `PartitionSpecError`
    naming the entry and what to fix: an unknown column (with the table's columns), an
    unknown transform (with the valid forms), a transform that does not apply to the
    column's type, a missing or bad width, or the same column partitioned twice by
    the same transform or by two time transforms.
    """
    if isinstance(partition_by, str):
        raise PartitionSpecError(
            f"partition_by must be a list of entries, not the string {partition_by!r}: "
            f"write [{partition_by!r}]"
        )
    fields: list[PartitionField] = []
    seen: dict[tuple[int, str], str] = {}
    time_sources: dict[int, str] = {}
    for position, text in enumerate(partition_by):
        entry = _parse(text)
        source = _source_field(entry, schema)
        transform = _transform(entry, source)
        name = entry.column + entry.kind.suffix(*([entry.width] if entry.kind.takes_width else []))
        _check_not_repeated(entry, source, transform, seen, time_sources)
        fields.append(
            PartitionField(
                source_id=source.field_id,
                field_id=_FIRST_PARTITION_FIELD_ID + position,
                transform=transform,
                name=name,
            )
        )
    spec = PartitionSpec(*fields)
    _check_names(spec, schema)
    return spec


def describe(spec: PartitionSpec, schema: Schema) -> list[str]:
    """A spec in the language `partition_spec` reads (identity as the bare column).

    Two specs are the same for this layer when their descriptions are equal: field
    ids and names aside, the same transforms of the same columns in the same order.
    """
    out = []
    for field in spec.fields:
        column = schema.find_column_name(field.source_id) or f"<field {field.source_id}>"
        transform = field.transform
        if isinstance(transform, IdentityTransform):
            out.append(column)
        elif isinstance(transform, BucketTransform):
            out.append(f"bucket({transform.num_buckets}, {column})")
        elif isinstance(transform, TruncateTransform):
            out.append(f"truncate({transform.width}, {column})")
        else:
            out.append(f"{transform}({column})")
    return out


def _parse(text: str) -> _Entry:
    if not isinstance(text, str):
        raise PartitionSpecError(f"partition entry {text!r} is not a string; {_forms()}")
    stripped = text.strip()
    if _BARE.match(stripped):
        return _Entry(text, _IDENTITY, stripped, None)
    call = _CALL.match(stripped)
    if call is None:
        raise PartitionSpecError(f"cannot read partition entry {text!r}; {_forms()}")
    name = call["name"].lower()
    kind = _KINDS.get(name)
    if kind is None:
        raise PartitionSpecError(
            f"unknown partition transform {call['name']!r} in {text!r}; {_forms()}"
        )
    args = [a.strip() for a in call["args"].split(",")]
    if kind.takes_width:
        if len(args) != 2 or not args[1]:
            raise PartitionSpecError(
                f"{name} takes a width and a column, as in {name}(16, column): got {text!r}"
            )
        return _Entry(text, kind, args[1], _width(name, args[0], text))
    if len(args) != 1 or not args[0]:
        raise PartitionSpecError(f"{name} takes one column, as in {name}(column): got {text!r}")
    return _Entry(text, kind, args[0], None)


def _width(name: str, raw: str, text: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise PartitionSpecError(
            f"the width of {name} must be a positive integer, as in {name}(16, column): "
            f"got {raw!r} in {text!r}"
        )
    return int(raw)


def _source_field(entry: _Entry, schema: Schema) -> NestedField:
    try:
        return schema.find_field(entry.column, case_sensitive=True)
    except ValueError:
        columns = ", ".join(f.name for f in schema.fields)
        raise PartitionSpecError(
            f"partition entry {entry.text!r}: the table has no column {entry.column!r}; "
            f"its columns are: {columns}"
        ) from None


def _transform(entry: _Entry, source: NestedField) -> Transform[Any, Any]:
    transform = entry.kind.make(entry.width) if entry.kind.takes_width else entry.kind.make()
    if not source.field_type.is_primitive or not transform.can_transform(source.field_type):
        raise PartitionSpecError(
            f"partition entry {entry.text!r}: {entry.kind.name} does not apply to column "
            f"{entry.column!r} of type {source.field_type}; {_applies_to(entry.kind)}"
        )
    return transform


def _applies_to(kind: _Kind) -> str:
    if kind is _HOUR:
        return "hour applies to timestamps"
    if kind.is_time:
        return "year, month and day apply to dates and timestamps"
    if kind is _BUCKET:
        return (
            "bucket applies to int, long, decimal, date, time, timestamp, string, "
            "binary, fixed and uuid"
        )
    if kind is _TRUNCATE:
        return "truncate applies to int, long, decimal, string and binary"
    return "identity applies to primitive columns (not structs, lists or maps)"


def _check_not_repeated(
    entry: _Entry,
    source: NestedField,
    transform: Transform[Any, Any],
    seen: dict[tuple[int, str], str],
    time_sources: dict[int, str],
) -> None:
    key = (source.field_id, str(transform))
    if key in seen:
        raise PartitionSpecError(
            f"partition entry {entry.text!r} repeats {seen[key]!r}: remove one of them"
        )
    seen[key] = entry.text
    if entry.kind.is_time:
        # Iceberg refuses two time partitions of one column: the finer one implies the other.
        if source.field_id in time_sources:
            raise PartitionSpecError(
                f"partition entries {time_sources[source.field_id]!r} and {entry.text!r} "
                f"both partition {entry.column!r} by time: keep only one"
            )
        time_sources[source.field_id] = entry.text


def _check_names(spec: PartitionSpec, schema: Schema) -> None:
    # A transform's partition field must not take the name of another column: readers
    # that project partition values by name would confuse the two.
    for field in spec.fields:
        if isinstance(field.transform, IdentityTransform):
            continue
        try:
            schema.find_field(field.name, case_sensitive=True)
        except ValueError:
            continue
        entry = describe(PartitionSpec(field), schema)[0]
        raise PartitionSpecError(
            f"the partition field {field.name!r} of {entry!r} has the name of a column of "
            "the table; rename that column"
        )


def _forms() -> str:
    return f"valid forms: {VALID_FORMS}"


def check_same_spec(table_name: str, existing: list[str], asked: list[str]) -> None:
    """Refuse an existing table whose spec (as :func:`describe` gives it) is not the one asked."""
    if existing == asked:
        return
    have = existing or "nothing (unpartitioned)"
    raise PartitionSpecError(
        f"table {table_name} exists partitioned by {have}, not by {asked} as asked; "
        "partition specs are not changed here: register it with partition_by="
        f"{existing}, or drop the table (losing its data) to recreate it"
    )
