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
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.types import LongType
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_barrier.iceberg import upsert
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.cdc import declare_keys
from spark_barrier.iceberg.commit import BATCH_ROWS_KEY, commit_batch
from spark_barrier.iceberg.files import write_data_files
from spark_barrier.iceberg.native_write import (
    DEFAULT_MIN_ROWS,
    DEFAULT_MIN_ROWS_PARTITIONED,
    NATIVE_MIN_ROWS_PROPERTY,
    NATIVE_WRITER_PROPERTY,
    why_not_native,
)
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
    """A table that asks for Spark's writer for every batch (the table property; by
    default only large batches get it)."""
    table = ensure_table(catalog, name, schema, **kw)
    with table.transaction() as txn:
        txn.set_properties({NATIVE_WRITER_PROPERTY: "true"})
    return table


def test_a_table_that_says_false_is_written_by_python_workers_whatever_the_batch(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = ensure_table(catalog, "dw.wide", WIDE)
    with table.transaction() as txn:
        txn.set_properties({NATIVE_WRITER_PROPERTY: "false", NATIVE_MIN_ROWS_PROPERTY: "1"})
    df = spark.createDataFrame(_wide_rows(range(3)), WIDE)
    assert "is false" in (why_not_native(df, table.location(), table, 10**9) or "")
    _commit(df, table, 1)
    sid = _commit(df, table, 2)  # the previous batch is large enough for auto
    assert not any(_spark_written(p) for p in data_file_paths(table, sid))


def test_auto_has_spark_write_large_batches_and_python_workers_small_or_unsized_ones(
    spark: SparkSession, catalog: Catalog
) -> None:
    plain = ensure_table(catalog, "dw.wide", WIDE)  # no property: auto
    by_day = ensure_table(catalog, "dw.events", EVENTS, partition_by=["day(at)"])
    df = spark.createDataFrame(_wide_rows(range(3)), WIDE)
    events = spark.createDataFrame(_events(), EVENTS)

    assert "not known" in (why_not_native(df, plain.location(), plain) or "")
    assert "small" in (why_not_native(df, plain.location(), plain, DEFAULT_MIN_ROWS - 1) or "")
    assert why_not_native(df, plain.location(), plain, DEFAULT_MIN_ROWS) is None
    # A partitioned table pays Spark's sort by partition too: it needs larger batches.
    assert "small" in (why_not_native(events, by_day.location(), by_day, DEFAULT_MIN_ROWS) or "")
    assert why_not_native(events, by_day.location(), by_day, DEFAULT_MIN_ROWS_PARTITIONED) is None
    # Only where the table's FileIO and Spark's Hadoop share nothing but the path.
    on_s3 = why_not_native(df, "s3://bucket/wh/t/data/batch-1", plain, 10**9) or ""
    assert "s3://" in on_s3 and "true" in on_s3
    with plain.transaction() as txn:
        txn.set_properties({NATIVE_MIN_ROWS_PROPERTY: "2"})
    assert why_not_native(df, plain.location(), plain, 2) is None
    with plain.transaction() as txn:
        txn.set_properties({NATIVE_WRITER_PROPERTY: "yes"})
    assert "'yes', not auto, true or false" in (
        why_not_native(df, plain.location(), plain, 10**9) or ""
    )


def test_a_sinks_batch_is_written_by_spark_once_the_previous_batch_was_large(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = ensure_table(catalog, "dw.events", EVENTS, partition_by=["day(at)"])
    with table.transaction() as txn:  # auto, with a threshold these few rows reach
        txn.set_properties({NATIVE_MIN_ROWS_PROPERTY: str(len(_events()))})
    df = spark.createDataFrame(_events(), EVENTS).repartition(2)

    first = _commit(df, table, 1)
    second = _commit(df.where("id < 3"), table, 2)
    third = _commit(df, table, 3)

    assert first is not None and second is not None and third is not None
    summary = {s.snapshot_id: s.summary for s in table.snapshots()}
    assert summary[first][BATCH_ROWS_KEY] == str(len(_events()))
    assert summary[second][BATCH_ROWS_KEY] == "3"
    written_by_spark = {
        sid: {_spark_written(f.file_path) for f in _added_files(table, sid)}
        for sid in (first, second, third)
    }
    # The first batch's size is unknown; the second follows a large one, the third a
    # small one.
    assert written_by_spark == {first: {False}, second: {True}, third: {False}}
    _assert_partition_values(table, second)
    assert read_snapshot(spark, table, third).count() == 2 * len(_events()) + 3


def test_an_upserts_large_rewrite_is_written_by_spark_with_its_statistics(
    spark: SparkSession, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upsert, "DRIVER_MATCH_MAX_ROWS", 0)  # the distributed rewrite
    # n: -20, -13, -6 (partition -1000: ids 0-2), 1 to 36 (partition 0: ids 3-8), null.
    table = ensure_table(catalog, "dw.events", EVENTS, partition_by=["truncate(1000, n)"])
    with table.transaction() as txn:
        txn.set_properties({NATIVE_MIN_ROWS_PROPERTY: "6"})
    rows = _events()
    first = commit_batch(
        spark.createDataFrame(rows, EVENTS).coalesce(1), table,
        barrier=1_000, job="job", batch_id=1, mode="upsert", key_columns=["id"],
    )  # fmt: skip
    # Key 3 changes: the file of partition 0 (6 rows) is rewritten without it, by Spark
    # because of its rows (the batch itself because the previous one had 10).
    changed = [(3, 1000, None, rows[3][3], "changed")]
    second = commit_batch(
        spark.createDataFrame(changed, EVENTS), table,
        barrier=2_000, job="job", batch_id=2, mode="upsert", key_columns=["id"],
    )  # fmt: skip

    assert first is not None and second is not None
    added = _added_files(table, second)
    assert sorted(f.record_count for f in added) == [1, 5]
    assert all(_spark_written(f.file_path) for f in added)
    _assert_partition_values(table, second)
    expected = {r[0]: r for r in rows} | {3: changed[0]}
    got = read_snapshot(spark, table, second).withColumn("at", F.unix_micros("at")).collect()
    assert sorted(tuple(r) for r in got) == sorted(
        (*r[:3], None if r[3] is None else _micros(r[3]), r[4]) for r in expected.values()
    )
    for data_file in added:  # the manifests keep the written files' statistics
        ids = [r["id"] for r in pq.read_table(_local(data_file.file_path)).to_pylist()]
        assert from_bytes(LongType(), data_file.lower_bounds[1]) == min(ids)
        assert from_bytes(LongType(), data_file.upper_bounds[1]) == max(ids)
        assert data_file.record_count == len(ids) == data_file.value_counts[1]
    # A filter on the key prunes by those statistics: only the rewritten file holds 4-8.
    assert len(data_file_paths(table, second, "id >= 4 and id <= 8")) == 1


def _added_files(table: Table, snapshot_id: int) -> list[DataFile]:
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    return [
        entry.data_file
        for manifest in snapshot.manifests(table.io)
        if manifest.added_snapshot_id == snapshot_id
        for entry in manifest.fetch_manifest_entry(table.io)
        if entry.status == ManifestEntryStatus.ADDED
    ]


def _assert_partition_values(table: Table, snapshot_id: int) -> None:
    """Every row of every file of the snapshot is in its file's partition, as Iceberg
    computes it (pyiceberg's transforms on the rows read back from the file)."""
    schema, fields = table.schema(), table.spec().fields
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        file_rows = pq.read_table(_local(task.file.file_path)).to_pylist()
        for field_index, field in enumerate(fields):
            column = schema.find_column_name(field.source_id)
            transform = field.transform.transform(schema.find_type(field.source_id))
            values = {transform(_internal(r[column])) for r in file_rows}
            assert values == {task.file.partition[field_index]}, (column, file_rows)


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


def test_a_required_column_is_written_by_spark_only_when_spark_knows_it_holds_no_null(
    spark: SparkSession, catalog: Catalog
) -> None:
    schema = T.StructType([T.StructField("id", T.LongType(), False)])
    arrow = spark_schema_to_arrow(schema, keep_nullability=True)
    required = native_table(catalog, "dw.req", arrow)
    maybe_null = spark.createDataFrame([(1,)], T.StructType([T.StructField("id", T.LongType())]))
    assert "required columns ['id']" in (
        why_not_native(maybe_null, required.location(), required) or ""
    )
    sid = _commit(maybe_null, required, 1)
    assert not any(_spark_written(p) for p in data_file_paths(required, sid))

    non_null = spark.createDataFrame([(2,)], schema)
    assert why_not_native(non_null, required.location(), required) is None
    sid = _commit(non_null, required, 2)
    paths = data_file_paths(required, sid, "id = 2")
    assert len(paths) == 1 and _spark_written(paths[0])
    assert not pq.read_metadata(_local(paths[0])).schema.to_arrow_schema().field("id").nullable
    assert sorted(tuple(r) for r in read_snapshot(spark, required, sid).collect()) == [(1,), (2,)]
    assert sorted(required.scan().to_arrow().column("id").to_pylist()) == [1, 2]


def test_a_cdc_tables_large_batch_is_written_by_spark_when_the_feeds_keys_are_non_null(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = ensure_table(catalog, "ods.orders", EVENTS, partition_by=["day(day)"])
    declare_keys(table, ["id"])  # as a CDC sink does: the key becomes required
    with table.transaction() as txn:
        txn.set_properties({NATIVE_MIN_ROWS_PROPERTY: "3"})
    non_null_id = T.StructField("id", T.LongType(), False)
    feed = T.StructType([non_null_id, *EVENTS.fields[1:], T.StructField("op", T.StringType())])
    records = [(*r, "I") for r in _events()]

    def apply(batch: list[tuple[Any, ...]], batch_id: int) -> int | None:
        frame = spark.createDataFrame(batch, feed).repartition(2)
        return commit_batch(
            frame, table, barrier=1_000 * batch_id, job="cdc", batch_id=batch_id,
            mode="cdc", key_columns=["id"], op_column="op",
        )  # fmt: skip

    first = apply(records, 1)
    # Key 0 deleted, key 1 updated, key 50 inserted: Spark writes the two live changes.
    second = apply(
        [(*_events()[0], "D"), (1, 7, dt.date(2030, 1, 1), None, "new", "U"),
         (50, 1, None, None, None, "I")],
        2,
    )  # fmt: skip

    assert first is not None and second is not None
    added = _added_files(table, second)
    # The two live changes (by Spark), and the rewrite of the file holding keys 0 and 1.
    assert sum(f.record_count for f in added if _spark_written(f.file_path)) == 2
    _assert_partition_values(table, second)
    got = {r["id"]: (r["n"], r["name"]) for r in table.scan().to_arrow().to_pylist()}
    expected = {r[0]: (r[1], r[4]) for r in _events()[1:]} | {1: (7, "new"), 50: (1, None)}
    assert got == expected
    assert read_snapshot(spark, table, second).count() == len(expected)
    # A feed whose keys may be null (as one read from Kafka or files) goes to the Python
    # workers: Spark would write the required key as optional.
    nullable = spark.createDataFrame(
        [(60, 1, None, None, None, "I")],
        T.StructType([*EVENTS.fields, T.StructField("op", T.StringType())]),
    )
    third = commit_batch(
        nullable, table, barrier=3_000, job="cdc", batch_id=3, mode="cdc",
        key_columns=["id"], op_column="op",
    )  # fmt: skip
    assert third is not None
    assert not any(_spark_written(f.file_path) for f in _added_files(table, third))


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
    _assert_partition_values(table, sid)
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
