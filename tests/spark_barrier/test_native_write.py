"""Data files written by Spark's own Parquet writer (spark_barrier.iceberg.native_write)."""

from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.commit import commit_batch
from spark_barrier.iceberg.files import write_data_files
from spark_barrier.iceberg.native_write import NATIVE_WRITER_PROPERTY, why_not_native
from spark_barrier.iceberg.read import read_snapshot
from spark_barrier.iceberg.scan import data_file_paths
from spark_barrier.iceberg.schemas import spark_schema_to_arrow
from spark_barrier.spark_session import PARQUET_TIMESTAMP_TYPE_KEY

pytestmark = pytest.mark.spark

UTC = dt.UTC
WIDE = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("name", T.StringType()),
        T.StructField("n", T.IntegerType()),
        T.StructField("small", T.ShortType()),  # stored as int: Iceberg has no 16-bit ints
        T.StructField("ratio", T.DoubleType()),
        T.StructField("f", T.FloatType()),
        T.StructField("ok", T.BooleanType()),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("local", T.TimestampNTZType()),
        T.StructField("blob", T.BinaryType()),
    ]
)


def _wide_rows(ids: range) -> list[tuple[Any, ...]]:
    return [
        (
            i,
            f"name-{i}",
            i * 10,
            i % 7,
            i / 4,
            float(i),
            i % 2 == 0,
            dt.date(2024, 1, 1) + dt.timedelta(days=i),
            dt.datetime(2024, 2, 29, 23, 59, 59, i, tzinfo=UTC),
            dt.datetime(2024, 3, 1, 12, 0, 0, i),
            bytes([i % 256]),
        )
        for i in ids
    ]


def native_table(catalog: Catalog, name: str, schema: Any, **kw: Any) -> Table:
    """A table that asks for Spark's writer (the table property; off by default)."""
    table = ensure_table(catalog, name, schema, **kw)
    with table.transaction() as txn:
        txn.set_properties({NATIVE_WRITER_PROPERTY: "true"})
    return table


def test_a_table_is_written_by_python_workers_unless_it_asks_for_spark(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = ensure_table(catalog, "dw.wide", WIDE)
    df = spark.createDataFrame(_wide_rows(range(3)), WIDE)
    assert NATIVE_WRITER_PROPERTY in (why_not_native(df, table.location(), table) or "")
    sid = _commit(df, table, 1)
    assert not any(_spark_written(p) for p in data_file_paths(table, sid))


def _micros(ts: dt.datetime) -> int:
    return (ts - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


def _commit(df: DataFrame, table: Table, batch: int) -> int | None:
    return commit_batch(df, table, barrier=1_000 * batch, job="job", batch_id=batch)


def _local(path: str) -> str:
    return urlparse(path).path


def _spark_written(path: str) -> bool:
    return os.path.basename(_local(path)).startswith("part-")  # pyiceberg names files by uuid


def test_an_unpartitioned_table_is_written_by_spark_with_iceberg_field_ids_and_statistics(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = native_table(catalog, "dw.wide", WIDE)
    rows = _wide_rows(range(50))

    sid = _commit(spark.createDataFrame(rows, WIDE).repartition(2), table, 1)

    paths = data_file_paths(table, sid)
    assert paths and all(_spark_written(p) for p in paths)
    # Timestamps compared as epoch micros: the process's time zone does not matter.
    expected = sorted((*r[:8], _micros(r[8]), *r[9:]) for r in rows)
    read = read_snapshot(spark, table, sid).withColumn("at", F.unix_micros("at"))
    assert sorted(tuple(r) for r in read.collect()) == expected
    # Another Iceberg reader (pyiceberg, by field id) reads the same rows and types.
    scanned = catalog.load_table("dw.wide").scan().to_arrow()
    assert scanned.num_rows == 50
    assert sorted(scanned.column("at").to_pylist()) == sorted(r[8] for r in rows)
    for path in paths:
        parquet_schema = pq.read_metadata(_local(path)).schema.to_arrow_schema()
        ids = {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in parquet_schema}
        assert ids == {f.name: f.field_id for f in table.schema().fields}
        assert parquet_schema.field("at").type.unit == "us"  # INT64 micros, not INT96
    # The manifests carry the files' real statistics: a filter prunes by them.
    files = list(table.scan(snapshot_id=sid).plan_files())
    assert sum(f.file.record_count for f in files) == 50
    bounds = sorted(f.file.lower_bounds[1] for f in files)  # field 1: id, little-endian
    assert int.from_bytes(bounds[0], "little") == 0


def test_a_filter_prunes_spark_written_files_by_their_statistics(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = native_table(catalog, "dw.wide", WIDE)
    _commit(spark.createDataFrame(_wide_rows(range(0, 10)), WIDE).coalesce(1), table, 1)
    sid = _commit(spark.createDataFrame(_wide_rows(range(100, 110)), WIDE).coalesce(1), table, 2)

    assert len(data_file_paths(table, sid)) == 2
    assert len(data_file_paths(table, sid, "id >= 100")) == 1
    assert read_snapshot(spark, table, sid, "id >= 100").count() == 10


def test_spark_leaves_no_marker_checksum_or_empty_file_behind(
    spark: SparkSession, catalog: Catalog, tmp_path: Path
) -> None:
    table = native_table(catalog, "dw.wide", WIDE)
    folder = f"{table.location()}/data/batch-test"

    written = write_data_files(
        spark.createDataFrame(_wide_rows(range(3)), WIDE).repartition(4), folder, table
    )
    assert sum(f.record_count for f in written) == 3
    on_disk = sorted(os.listdir(_local(folder)))
    assert on_disk == sorted(os.path.basename(_local(f.file_path)) for f in written)

    empty_folder = f"{table.location()}/data/batch-empty"
    assert write_data_files(spark.createDataFrame([], WIDE), empty_folder, table) == []
    assert not os.path.exists(_local(empty_folder)) or os.listdir(_local(empty_folder)) == []


DECIMALS = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("d9", T.DecimalType(9, 2)),  # Parquet INT32
        T.StructField("d18", T.DecimalType(18, 2)),  # INT64
        T.StructField("d38", T.DecimalType(38, 10)),  # FIXED_LEN_BYTE_ARRAY
    ]
)


def test_decimals_of_every_width_are_written_by_spark_with_their_bounds(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = native_table(catalog, "dw.dec", DECIMALS)
    rows = [
        (1, Decimal("-1.25"), Decimal("1234567890123456.78"), Decimal("-0.0000000001")),
        (2, Decimal("9999999.99"), Decimal("-0.01"), Decimal("1234567890123456789012345678")),
    ]

    sid = _commit(spark.createDataFrame(rows, DECIMALS).coalesce(1), table, 1)

    assert all(_spark_written(p) for p in data_file_paths(table, sid))
    assert sorted(tuple(r) for r in read_snapshot(spark, table, sid).collect()) == rows
    assert sorted(tuple(r.values()) for r in table.scan().to_arrow().to_pylist()) == rows
    assert len(data_file_paths(table, sid, "d18 < 0")) == 1
    assert data_file_paths(table, sid, "d9 > 10000000") == []  # pruned by the upper bound


def test_tables_spark_cannot_write_as_iceberg_expects_go_through_pyiceberg(
    spark: SparkSession, catalog: Catalog
) -> None:
    schema = T.StructType([T.StructField("id", T.LongType(), False)])
    arrow = spark_schema_to_arrow(schema, keep_nullability=True)
    required = native_table(catalog, "dw.req", arrow)
    df = spark.createDataFrame([(1,)], schema)
    assert why_not_native(df, required.location(), required) == "the table has required columns"
    sid = _commit(df, required, 1)
    assert not any(_spark_written(p) for p in data_file_paths(required, sid))
    assert [tuple(r) for r in read_snapshot(spark, required, sid).collect()] == [(1,)]


def test_a_session_writing_int96_timestamps_leaves_the_write_to_pyiceberg(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = native_table(catalog, "dw.wide", WIDE)
    df = spark.createDataFrame(_wide_rows(range(2)), WIDE)
    spark.conf.set(PARQUET_TIMESTAMP_TYPE_KEY, "INT96")
    try:
        assert "INT96" in (why_not_native(df, table.location(), table) or "")
        sid = _commit(df, table, 1)
    finally:
        spark.conf.set(PARQUET_TIMESTAMP_TYPE_KEY, "TIMESTAMP_MICROS")
    assert not any(_spark_written(p) for p in data_file_paths(table, sid))
    assert why_not_native(df, table.location(), table) is None


# --------------------------------------------------------------------------- partitioned

EVENTS = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("n", T.IntegerType()),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("name", T.StringType()),
    ]
)


def _events() -> list[tuple[Any, ...]]:
    """Values on both sides of the epoch and of day, month and year boundaries, far in
    the future, and nulls."""
    stamps = [
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1970, 1, 1, 0, 0, 0, tzinfo=UTC),
        dt.datetime(1968, 2, 29, 13, 0, 1, tzinfo=UTC),
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(2024, 3, 1, 0, 0, 0, tzinfo=UTC),
        dt.datetime(2024, 12, 31, 23, 0, 0, tzinfo=UTC),
        # Past 2**53 microseconds since the epoch: no floating point in the transforms.
        dt.datetime(2500, 7, 1, 12, 0, 0, 1, tzinfo=UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        None,
    ]
    rows = []
    for i, at in enumerate(stamps):
        day = None if at is None else at.date()
        rows.append((i, (i * 7) - 20, day, at, f"n{i % 3}"))
    rows.append((99, None, dt.date(1960, 6, 15), dt.datetime(2025, 1, 1, tzinfo=UTC), None))
    return rows


def _internal(value: Any) -> Any:
    """A value as pyiceberg's transforms take it: micros for timestamps, days for dates."""
    if isinstance(value, dt.datetime):
        return datetime_to_micros(value)
    if isinstance(value, dt.date):
        return date_to_days(value)
    return value


@pytest.mark.parametrize(
    "spec",
    [
        ["day(at)"],
        ["hour(at)"],
        ["month(at)"],
        ["year(at)"],
        ["day(day)"],
        ["month(day)"],
        ["year(day)"],
        ["day"],
        ["n"],
        ["truncate(10, n)"],
        ["truncate(4, id)", "month(day)"],
    ],
)
def test_a_partitioned_table_is_written_by_spark_with_iceberg_partition_values(
    spark: SparkSession, catalog: Catalog, spec: list[str]
) -> None:
    table = native_table(catalog, "dw.events", EVENTS, partition_by=spec)
    rows = _events()
    df = spark.createDataFrame(rows, EVENTS).repartition(2)
    assert why_not_native(df, table.location(), table) is None

    sid = _commit(df, table, 1)

    paths = data_file_paths(table, sid)
    assert paths and all(_spark_written(p) for p in paths)
    schema, fields = table.schema(), table.spec().fields
    for task in table.scan(snapshot_id=sid).plan_files():
        file_rows = pq.read_table(_local(task.file.file_path)).to_pylist()
        for field_index, field in enumerate(fields):
            column = schema.find_column_name(field.source_id)
            transform = field.transform.transform(schema.find_type(field.source_id))
            values = {transform(_internal(r[column])) for r in file_rows}
            # Every row of the file is in the file's partition, as Iceberg computes it.
            assert values == {task.file.partition[field_index]}, (spec, column, file_rows)
    scanned = catalog.load_table("dw.events").scan().to_arrow()
    assert sorted(scanned.column("id").to_pylist()) == sorted(r[0] for r in rows)
    assert read_snapshot(spark, table, sid).count() == len(rows)


@pytest.mark.parametrize("spec", [["bucket(4, id)"], ["name"], ["truncate(2, name)"]])
def test_partitions_spark_cannot_compute_as_iceberg_does_are_written_by_pyiceberg(
    spark: SparkSession, catalog: Catalog, spec: list[str]
) -> None:
    table = native_table(catalog, "dw.events", EVENTS, partition_by=spec)
    df = spark.createDataFrame(_events(), EVENTS)
    assert "computed by pyiceberg" in (why_not_native(df, table.location(), table) or "")
    sid = _commit(df, table, 1)
    assert not any(_spark_written(p) for p in data_file_paths(table, sid))
    assert read_snapshot(spark, table, sid).count() == len(_events())
