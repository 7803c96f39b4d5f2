"""Partitioned Iceberg tables: specs at ensure_table, transforms computed by the
executors, partition values in the manifests, pruned reads, partition-local upserts.

Everything runs for real: Spark writes through pyiceberg's writer on the executors,
pyiceberg commits, and pyiceberg's own reader (another engine than Spark) reads back.
Expected partition values are computed here by hand (or, for bucket, by pyiceberg's
pure-Python murmur3, while the writer uses pyiceberg-core's Rust one).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import IntegerType, LongType, StringType
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_barrier.iceberg.catalog import check_partition_by, ensure_table
from spark_barrier.iceberg.commit import commit_batch
from spark_barrier.iceberg.partitioning import PartitionSpecError
from spark_barrier.iceberg.read import read_snapshot
from spark_barrier.iceberg.scan import data_file_paths
from tests.s3 import S3Server

pytestmark = pytest.mark.spark

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)

EVENTS = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("item_id", T.IntegerType()),
        T.StructField("name", T.StringType()),
        T.StructField("region", T.StringType()),
        T.StructField("ordered_at", T.TimestampType()),  # hour
        T.StructField("shipped_at", T.TimestampType()),  # month
        T.StructField("created_at", T.TimestampType()),  # year
        T.StructField("day", T.DateType()),  # day
    ]
)
EVERY_KIND = [
    "region",
    "hour(ordered_at)",
    "month(shipped_at)",
    "year(created_at)",
    "day(day)",
    "bucket(16, item_id)",
    "truncate(4, name)",
]


def _commit(df: DataFrame, table: Table, batch: int, **kw: Any) -> int | None:
    return commit_batch(df, table, barrier=1_000 * batch, job="job", batch_id=batch, **kw)


def _event(i: int) -> tuple[Any, ...]:
    at = dt.datetime(2023, 12, 31, 22, 30, tzinfo=UTC) + dt.timedelta(hours=7 * i)
    return (
        i,
        i * 17 % 50,
        ["iceberg", "ice", "spark streaming", "a/b c%d"][i % 4],
        ["eu", "us", "x/y z"][i % 3],
        at,
        at + dt.timedelta(days=20 * i),
        at - dt.timedelta(days=200 * i),
        (at + dt.timedelta(days=i)).date(),
    )


def _bucket16(value: int) -> int:
    # pyiceberg's pure-Python transform (mmh3), not pyiceberg-core's that wrote the files.
    return BucketTransform(16).transform(IntegerType())(value)  # type: ignore[return-value]


def _expected_partition(row: dict[str, Any]) -> dict[str, Any]:
    """The partition values of a row by the Iceberg spec, computed by hand."""
    hours = (row["ordered_at"] - EPOCH) // dt.timedelta(hours=1)
    shipped, created = row["shipped_at"], row["created_at"]
    return {
        "region": row["region"],
        "ordered_at_hour": hours,
        "shipped_at_month": (shipped.year - 1970) * 12 + shipped.month - 1,
        "created_at_year": created.year - 1970,
        "day_day": row["day"],
        "item_id_bucket_16": _bucket16(row["item_id"]),
        "name_trunc_4": row["name"][:4],
    }


def _files(table: Table) -> list[dict[str, Any]]:
    return table.inspect.files().select(["file_path", "partition", "record_count"]).to_pylist()


def _file_rows(table: Table, path: str) -> list[dict[str, Any]]:
    # Through the table's FileIO: what pyiceberg (and any engine) would open.
    with table.io.new_input(path).open() as stream:
        return pq.read_table(stream).to_pylist()  # type: ignore[no-any-return]


def _sorted(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in rows)


def _spark_rows(df: DataFrame) -> list[tuple[Any, ...]]:
    """Rows as tuples with aware UTC timestamps (Spark hands out naive local ones)."""
    micros = [
        F.unix_micros(f.name).alias(f.name) if isinstance(f.dataType, T.TimestampType) else f.name
        for f in df.schema.fields
    ]
    kinds = [isinstance(f.dataType, T.TimestampType) for f in df.schema.fields]
    return sorted(
        tuple(
            EPOCH + dt.timedelta(microseconds=v) if ts and v is not None else v
            for v, ts in zip(row, kinds, strict=True)
        )
        for row in df.select(*micros).collect()
    )


# --------------------------------------------------------------------------- writes


def test_every_transform_kind_puts_each_row_under_its_partition_values(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = ensure_table(catalog, "dw.events", EVENTS, EVERY_KIND)
    rows = [_event(i) for i in range(24)]
    # A session time zone other than UTC: Spark labels the Arrow timestamps with it, and
    # the transforms must still see the same instants (Iceberg's hours and days are UTC).
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        sid = _commit(spark.createDataFrame(rows, EVENTS).repartition(3), table, 1)
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")

    assert sid is not None
    files = _files(table)
    seen = 0
    for f in files:
        file_rows = _file_rows(table, f["file_path"])
        assert f["record_count"] == len(file_rows) > 0  # no empty files
        assert f["file_path"].startswith(f"{table.location()}/data/batch-job-1-")
        for row in file_rows:
            assert _expected_partition(row) == f["partition"], row
        seen += len(file_rows)
    assert seen == len(rows)
    # Rows with the same partition values share files (per writing task), and every
    # distinct tuple of values is a partition of the table.
    wanted = {
        tuple(_expected_partition(dict(zip(EVENTS.names, r, strict=True))).values()) for r in rows
    }
    partitions = {tuple(p["partition"].values()) for p in table.inspect.partitions().to_pylist()}
    assert partitions == wanted


def test_bucket_is_icebergs_murmur3(spark: SparkSession, catalog: Catalog) -> None:
    # The Iceberg spec's own examples (Appendix B): murmur3_x86_32 with seed 0 of the
    # value's bytes (int and long hash alike, as 8 little-endian bytes).
    assert BucketTransform(16).transform(IntegerType(), bucket=False)(34) == 2017239379
    assert BucketTransform(16).transform(LongType(), bucket=False)(34) == 2017239379
    assert BucketTransform(16).transform(StringType(), bucket=False)("iceberg") == 1210000089
    schema = T.StructType([T.StructField("k", T.IntegerType()), T.StructField("s", T.StringType())])
    table = ensure_table(catalog, "dw.buckets", schema, ["bucket(16, k)", "bucket(8, s)"])

    _commit(
        spark.createDataFrame([(34, "iceberg")] + [(k, str(k)) for k in range(40)], schema),
        table,
        1,
    )

    by_row = {}
    for f in _files(table):
        for row in _file_rows(table, f["file_path"]):
            by_row[(row["k"], row["s"])] = (
                f["partition"]["k_bucket_16"],
                f["partition"]["s_bucket_8"],
            )
    assert by_row[(34, "iceberg")] == (2017239379 % 16, 1210000089 % 8) == (3, 1)
    for k in range(40):
        s_bucket = BucketTransform(8).transform(StringType())(str(k))
        assert by_row[(k, str(k))] == (_bucket16(k), s_bucket)


def test_pyiceberg_reads_a_partitioned_table_written_here(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = ensure_table(catalog, "dw.events", EVENTS, EVERY_KIND)
    rows = [_event(i) for i in range(30)]
    _commit(spark.createDataFrame(rows[:20], EVENTS), table, 1)
    _commit(spark.createDataFrame(rows[20:], EVENTS), table, 2)

    # Another engine: pyiceberg's reader, from the committed metadata alone, partition
    # columns included (their values come from the data, matched to the manifests).
    fresh = catalog.load_table("dw.events")
    assert _sorted(fresh.scan().to_arrow().to_pylist()) == sorted(rows)
    eu = fresh.scan(row_filter=EqualTo("region", "x/y z")).to_arrow().to_pylist()
    assert _sorted(eu) == sorted(r for r in rows if r[3] == "x/y z")
    # And Spark, from the same files.
    current = table.current_snapshot()
    assert current is not None
    assert _spark_rows(read_snapshot(spark, table, current.snapshot_id)) == sorted(rows)


def test_an_empty_batch_writes_no_file(spark: SparkSession, catalog: Catalog) -> None:
    table = ensure_table(catalog, "dw.events", EVENTS, EVERY_KIND)
    assert _commit(spark.createDataFrame([_event(1)], EVENTS).where("id < 0"), table, 1) is None
    assert table.snapshots() == []


# --------------------------------------------------------------------------- reads


def test_a_filter_on_the_partition_column_plans_fewer_files(
    spark: SparkSession, catalog: Catalog
) -> None:
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("region", T.StringType()),
            T.StructField("ordered_at", T.TimestampType()),
        ]
    )
    table = ensure_table(catalog, "dw.orders", schema, ["region", "day(ordered_at)"])
    start = dt.datetime(2024, 3, 1, 12, tzinfo=UTC)
    rows = [(i, ["eu", "us", "apac"][i % 3], start + dt.timedelta(days=i % 4)) for i in range(48)]
    sid = _commit(spark.createDataFrame(rows, schema), table, 1)

    everything = data_file_paths(table, sid)
    eu = data_file_paths(table, sid, "region = 'eu'")
    assert 0 < len(eu) < len(everything)
    assert all("/region=eu/" in p for p in eu)
    late = "ordered_at >= '2024-03-03T00:00:00+00:00'"
    assert 0 < len(data_file_paths(table, sid, late)) < len(everything)

    def ids(row_filter: str) -> list[int]:
        return sorted(r["id"] for r in read_snapshot(spark, table, sid, row_filter).collect())

    assert ids("region = 'eu'") == [r[0] for r in rows if r[1] == "eu"]
    assert ids(late) == [r[0] for r in rows if r[2] >= start + dt.timedelta(days=1, hours=12)]
    # A filter no partition can answer still filters the rows of the files it keeps.
    assert ids("region = 'us' and id < 10") == [r[0] for r in rows if r[1] == "us" and r[0] < 10]


# --------------------------------------------------------------------------- upserts


def test_an_upsert_rewrites_only_the_files_of_the_affected_partition(
    spark: SparkSession, catalog: Catalog
) -> None:
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("region", T.StringType()),
            T.StructField("v", T.StringType()),
        ]
    )
    table = ensure_table(catalog, "dw.kv", schema, ["region"])
    up: dict[str, Any] = {"mode": "upsert", "key_columns": ["id"]}
    first = [(i, ["eu", "us"][i % 2], "b1") for i in range(20)]
    # Two batches: each partition has two files or more, one of them holding key 4.
    _commit(spark.createDataFrame(first[:10], schema), table, 1, **up)
    _commit(spark.createDataFrame(first[10:], schema), table, 2, **up)
    before = {f["file_path"]: f["partition"]["region"] for f in _files(table)}
    assert set(before.values()) == {"eu", "us"} and min(Counter(before.values()).values()) >= 2

    sid = _commit(spark.createDataFrame([(4, "eu", "b2")], schema), table, 3, **up)

    after = {f["file_path"]: f["partition"]["region"] for f in _files(table)}
    removed, added = set(before) - set(after), set(after) - set(before)
    holding_4 = [p for p in before if any(r["id"] == 4 for r in _file_rows(table, p))]
    assert removed == set(holding_4) and len(holding_4) == 1  # one eu file, no us file
    assert {after[p] for p in added} == {"eu"}  # the batch and the rewritten eu file
    expected = {i: (region, v) for i, region, v in first} | {4: ("eu", "b2")}
    got = read_snapshot(spark, table, sid).collect()
    assert {r["id"]: (r["region"], r["v"]) for r in got} == expected
    assert _sorted(table.scan().to_arrow().to_pylist()) == sorted(
        (i, region, v) for i, (region, v) in expected.items()
    )


def test_an_upsert_moving_a_key_to_another_partition(spark: SparkSession, catalog: Catalog) -> None:
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("region", T.StringType())]
    )
    table = ensure_table(catalog, "dw.moves", schema, ["region"])
    up: dict[str, Any] = {"mode": "upsert", "key_columns": ["id"]}
    _commit(spark.createDataFrame([(1, "eu"), (2, "eu"), (3, "us")], schema), table, 1, **up)

    sid = _commit(spark.createDataFrame([(1, "us")], schema), table, 2, **up)

    got = sorted(tuple(r) for r in read_snapshot(spark, table, sid).collect())
    assert got == [(1, "us"), (2, "eu"), (3, "us")]
    for f in _files(table):
        assert {r["region"] for r in _file_rows(table, f["file_path"])} == {
            f["partition"]["region"]
        }


# --------------------------------------------------------------------------- bad specs


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            ["day(placed_at)"],
            r"no column 'placed_at'; its columns are: id, item_id, name, region, ordered_at",
        ),
        (
            ["weekly(ordered_at)"],
            r"unknown partition transform 'weekly'.*valid forms: .*bucket\(N, column\)",
        ),
        (
            ["hour(day)"],
            r"hour does not apply to column 'day' of type date; hour applies to timestamps",
        ),
        (
            ["truncate(4, ordered_at)"],
            r"truncate does not apply to column 'ordered_at' of type timestamptz",
        ),
        (["bucket(item_id)"], r"bucket takes a width and a column, as in bucket\(16, column\)"),
        (["bucket(0, item_id)"], r"width of bucket must be a positive integer"),
        (
            ["day(ordered_at)", "hour(ordered_at)"],
            r"both partition 'ordered_at' by time: keep only one",
        ),
        ("region", r"must be a list of entries.*\['region'\]"),
    ],
)
def test_a_bad_spec_fails_at_ensure_table_and_creates_nothing(
    catalog: Catalog, spec: Any, message: str
) -> None:
    with pytest.raises(PartitionSpecError, match=message):
        check_partition_by(EVENTS, spec)  # what register() checks before creating outputs
    with pytest.raises(PartitionSpecError, match=message):
        ensure_table(catalog, "dw.events", EVENTS, spec)
    assert catalog.list_namespaces() == []


def test_an_existing_table_with_another_spec_is_refused(catalog: Catalog) -> None:
    table = ensure_table(catalog, "dw.events", EVENTS, ["day(day)", "bucket(16, item_id)"])
    # The same spec in other spellings is the same table.
    again = ensure_table(catalog, "dw.events", EVENTS, ["days(day)", "bucket(16,item_id)"])
    assert again.metadata.table_uuid == table.metadata.table_uuid
    assert (
        ensure_table(catalog, "dw.events", EVENTS).metadata.table_uuid == table.metadata.table_uuid
    )

    existing = r"\['day\(day\)', 'bucket\(16, item_id\)'\]"
    with pytest.raises(PartitionSpecError, match=rf"exists partitioned by {existing}, not by"):
        ensure_table(catalog, "dw.events", EVENTS, ["region"])
    ensure_table(catalog, "dw.plain", EVENTS)
    with pytest.raises(
        PartitionSpecError, match=r"exists partitioned by nothing \(unpartitioned\)"
    ):
        ensure_table(catalog, "dw.plain", EVENTS, ["region"])


# --------------------------------------------------------------------------- object storage


@pytest.fixture
def s3_catalog(tmp_path: Path, s3_server: S3Server) -> Catalog:
    """A SqlCatalog whose warehouse is on the tests' S3 server (tests/s3.py): endpoint
    and keys are catalog properties only, which the executors get through the table's
    FileIO properties."""
    return SqlCatalog(
        "s3",
        uri=f"sqlite:///{tmp_path / 's3-catalog.db'}",
        warehouse=s3_server.warehouse("partitioned"),
        **s3_server.properties,
    )


def test_executors_write_a_partitioned_table_on_s3(
    spark: SparkSession, s3_catalog: Catalog
) -> None:
    table = ensure_table(s3_catalog, "dw.events", EVENTS, EVERY_KIND)
    rows = [_event(i) for i in range(12)]

    sid = _commit(spark.createDataFrame(rows, EVENTS), table, 1)

    files = _files(table)
    assert files and all(
        f["file_path"].startswith("s3://warehouse/partitioned/dw/events/data/batch-") for f in files
    )
    fresh = s3_catalog.load_table("dw.events")
    assert _sorted(fresh.scan().to_arrow().to_pylist()) == sorted(rows)
    # A pruned read of the bucket's files, by Spark's executors.
    assert 0 < len(data_file_paths(table, sid, "region = 'eu'")) < len(files)
    eu = read_snapshot(spark, table, sid, "region = 'eu'").collect()
    assert sorted(r["id"] for r in eu) == [r[0] for r in rows if r[3] == "eu"]


def test_a_partition_field_named_like_a_column_is_refused(catalog: Catalog) -> None:
    schema = T.StructType(
        [T.StructField("ts", T.TimestampType()), T.StructField("ts_day", T.DateType())]
    )
    with pytest.raises(PartitionSpecError, match=r"'ts_day' of 'day\(ts\)' has the name of a"):
        ensure_table(catalog, "dw.clash", schema, ["day(ts)"])
    assert catalog.list_namespaces() == []
    # An identity partition is named after its own column: no clash.
    assert ensure_table(catalog, "dw.clash", schema, ["ts_day"]).spec().fields[0].name == "ts_day"
