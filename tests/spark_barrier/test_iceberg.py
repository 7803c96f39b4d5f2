"""Spark-written, pyiceberg-committed Iceberg tables (spark_barrier.iceberg)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Operation
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_barrier.iceberg import commit, upsert
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.commit import commit_batch
from spark_barrier.iceberg.read import read_appended, read_snapshot
from spark_barrier.iceberg.scan import data_file_paths
from spark_barrier.iceberg.schemas import iceberg_schema_to_spark, spark_schema_to_arrow
from spark_barrier.iceberg.stamps import (
    SUMMARY_BARRIER,
    SUMMARY_BATCH,
    SUMMARY_JOB,
    StampedSnapshot,
    find_batch_snapshot,
    list_stamped_snapshots,
    snapshot_barrier,
)
from spark_barrier.spark_session import PARQUET_TIMESTAMP_TYPE_KEY

pytestmark = pytest.mark.spark

UTC = dt.UTC
KV = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def _kv_table(catalog: Catalog, name: str = "dw.kv") -> Table:
    return ensure_table(catalog, name, KV)


def _kv(spark: SparkSession, rows: list[tuple[int, str]]) -> DataFrame:
    return spark.createDataFrame(rows, KV)


def _micros(ts: dt.datetime) -> int:
    return (ts - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


def _commit(df: DataFrame, table: Table, batch: int, **kw: Any) -> int | None:
    return commit_batch(df, table, barrier=1_000 * batch, job="job", batch_id=batch, **kw)


# --------------------------------------------------------------------------- schemas


def test_spark_schema_maps_to_arrow() -> None:
    spark_schema = T.StructType(
        [
            T.StructField("l", T.LongType(), False),
            T.StructField("i", T.IntegerType()),
            T.StructField("d", T.DoubleType()),
            T.StructField("s", T.StringType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField("dec", T.DecimalType(12, 3)),
            T.StructField("b", T.BooleanType()),
            T.StructField("day", T.DateType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
        ]
    )
    arrow = spark_schema_to_arrow(spark_schema)
    assert arrow.field("l").type == pa.int64() and arrow.field("l").nullable
    assert arrow.field("ts").type == pa.timestamp("us", tz="UTC")
    assert arrow.field("ntz").type == pa.timestamp("us")
    assert arrow.field("dec").type == pa.decimal128(12, 3)
    assert arrow.field("day").type == pa.date32()
    assert arrow.field("tags").type.value_type == pa.string()
    assert not spark_schema_to_arrow(spark_schema, keep_nullability=True).field("l").nullable


def test_ensure_table_is_idempotent_and_keeps_types(catalog: Catalog) -> None:
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("amount", T.DecimalType(10, 2)),
            T.StructField("day", T.DateType()),
        ]
    )
    table = ensure_table(catalog, "dw.typed", schema)
    again = ensure_table(catalog, "dw.typed", schema)
    assert again.metadata.table_uuid == table.metadata.table_uuid
    back = iceberg_schema_to_spark(table.schema())
    assert [(f.name, f.dataType) for f in back.fields] == [
        (f.name, f.dataType) for f in schema.fields
    ]


# --------------------------------------------------------------------------- append


def test_append_commit_is_stamped_and_reads_back(spark: SparkSession, catalog: Catalog) -> None:
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("amount", T.DecimalType(10, 2)),
            T.StructField("ok", T.BooleanType()),
            T.StructField("day", T.DateType()),
            T.StructField("ratio", T.DoubleType()),
            T.StructField("n", T.IntegerType()),
        ]
    )
    rows = [
        (i, f"name-{i}", Decimal(f"{i}.25"), i % 2 == 0, dt.date(2024, 1, 1 + i), i / 4, i * 10)
        for i in range(6)
    ]
    table = ensure_table(catalog, "dw.orders", schema)

    sid = commit_batch(
        spark.createDataFrame(rows, schema),
        table,
        barrier=1_700_000_000_000,
        job="orders-job",
        batch_id=3,
    )

    assert sid is not None and table.current_snapshot().snapshot_id == sid  # type: ignore[union-attr]
    summary = table.snapshot_by_id(sid).summary  # type: ignore[union-attr]
    assert summary.operation == Operation.APPEND  # type: ignore[union-attr]
    assert (summary[SUMMARY_BARRIER], summary[SUMMARY_JOB], summary[SUMMARY_BATCH]) == (  # type: ignore[index]
        "1700000000000",
        "orders-job",
        "3",
    )
    assert _rows(read_snapshot(spark, table, sid)) == sorted(rows)
    # pyiceberg reads the same rows from the metadata it committed: the table is real Iceberg.
    fresh = catalog.load_table("dw.orders")
    arrow_rows = fresh.scan().to_arrow().to_pylist()
    assert sorted(tuple(r.values()) for r in arrow_rows) == sorted(rows)
    assert all(
        p.startswith(table.location() + "/data/batch-orders-job-3-") for p in data_file_paths(table)
    )


def test_timestamps_round_trip_as_int64_micros(spark: SparkSession, catalog: Catalog) -> None:
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("ts", T.TimestampType())]
    )
    stamps = [
        dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC),
        dt.datetime(1999, 12, 31, 0, 0, 0, 1, tzinfo=UTC),
    ]
    table = ensure_table(catalog, "dw.events", schema)
    # A session left at Spark's default (INT96) does not matter: pyiceberg writes the files.
    spark.conf.set(PARQUET_TIMESTAMP_TYPE_KEY, "INT96")
    try:
        sid = _commit(spark.createDataFrame(list(enumerate(stamps)), schema), table, 1)
    finally:
        spark.conf.set(PARQUET_TIMESTAMP_TYPE_KEY, "TIMESTAMP_MICROS")

    # Compared as epoch micros so the test does not depend on the process's time zone.
    got = read_snapshot(spark, table, sid).orderBy("id").select(F.unix_micros("ts")).collect()
    assert [r[0] for r in got] == [_micros(s) for s in stamps]
    assert [
        r["ts"] for r in sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    ] == stamps
    for path in data_file_paths(table):
        column = pq.read_metadata(urlparse(path).path).schema.column(1)
        assert column.physical_type == "INT64"  # not INT96


def test_empty_batch_makes_no_snapshot(spark: SparkSession, catalog: Catalog) -> None:
    table = _kv_table(catalog)
    assert _commit(_kv(spark, []), table, 0) is None
    assert table.snapshots() == []

    first = _commit(_kv(spark, [(1, "a")]), table, 1)
    assert _commit(_kv(spark, [(2, "b")]).where("id < 0"), table, 2) is None
    assert [s.snapshot_id for s in table.snapshots()] == [first]
    assert read_snapshot(spark, table, None).schema == iceberg_schema_to_spark(table.schema())
    assert read_snapshot(spark, table, None).count() == 0


def test_batch_columns_must_match_the_table(spark: SparkSession, catalog: Catalog) -> None:
    table = _kv_table(catalog)
    with pytest.raises(ValueError, match=r"not in the table \['extra'\]"):
        _commit(_kv(spark, [(1, "a")]).withColumn("extra", F.lit(1)), table, 1)
    with pytest.raises(ValueError, match=r"missing from the batch \['v'\]"):
        _commit(_kv(spark, [(1, "a")]).drop("v"), table, 1)
    with pytest.raises(ValueError, match="key_columns"):
        _commit(_kv(spark, [(1, "a")]), table, 1, mode="upsert")
    assert table.snapshots() == []


def test_replayed_batch_is_found_and_skipped(spark: SparkSession, catalog: Catalog) -> None:
    table = _kv_table(catalog)
    assert find_batch_snapshot(table, "job", 7) is None
    sid = commit_batch(
        _kv(spark, [(1, "a"), (2, "b")]), table, barrier=5_000, job="job", batch_id=7
    )

    reloaded = catalog.load_table("dw.kv")  # as a restarted driver would see it
    assert find_batch_snapshot(reloaded, "job", 7) == sid
    assert find_batch_snapshot(reloaded, "other-job", 7) is None
    assert snapshot_barrier(reloaded, sid) == 5_000  # type: ignore[arg-type]
    assert list_stamped_snapshots(reloaded) == [StampedSnapshot(sid, 5_000, "job", 7)]  # type: ignore[arg-type]

    # The replay is skipped: same snapshot, no second copy of the rows.
    replay = commit_batch(
        _kv(spark, [(1, "a"), (2, "b")]), reloaded, barrier=5_000, job="job", batch_id=7
    )
    assert replay == sid
    assert len(reloaded.snapshots()) == 1
    assert read_snapshot(spark, reloaded, sid).count() == 2


def test_read_appended_returns_rows_of_the_range(spark: SparkSession, catalog: Catalog) -> None:
    table = _kv_table(catalog)
    s1 = _commit(_kv(spark, [(1, "a"), (2, "b")]), table, 1)
    s2 = _commit(_kv(spark, [(3, "c")]), table, 2)
    s3 = _commit(_kv(spark, [(4, "d"), (5, "e")]), table, 3)

    assert _rows(read_appended(spark, table, s1, s3)) == [(3, "c"), (4, "d"), (5, "e")]
    assert _rows(read_appended(spark, table, None, s1)) == [(1, "a"), (2, "b")]
    assert _rows(read_appended(spark, table, s2, s3)) == [(4, "d"), (5, "e")]
    empty = read_appended(spark, table, s2, s2)
    assert empty.count() == 0 and empty.schema == iceberg_schema_to_spark(table.schema())
    assert read_appended(spark, table, None, None).count() == 0
    with pytest.raises(ValueError, match="ancestor"):
        read_appended(spark, table, s3, s1)


# --------------------------------------------------------------------------- upsert


def _file_of_key(spark: SparkSession, table: Table) -> dict[int, str]:
    df = read_snapshot(spark, table, table.current_snapshot().snapshot_id)  # type: ignore[union-attr]
    return {
        r["id"]: r["f"] for r in df.select("id", F.col("_metadata.file_path").alias("f")).collect()
    }


@pytest.fixture(params=["on the driver", "in Spark"])
def key_match(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where an upsert finds the files holding its keys: small tables on the driver,
    others in Spark; "in Spark" makes every table too big for the driver."""
    if request.param == "in Spark":
        monkeypatch.setattr(upsert, "DRIVER_MATCH_MAX_ROWS", 0)
    return str(request.param)


def test_upsert_keeps_latest_value_and_untouched_files(
    spark: SparkSession, catalog: Catalog, key_match: str
) -> None:
    table = _kv_table(catalog)
    up = {"mode": "upsert", "key_columns": ["id"]}
    _commit(_kv(spark, [(i, "b1") for i in range(10)]), table, 1, **up)
    _commit(_kv(spark, [(i, "b2") for i in range(100, 110)] + [(5, "b2")]), table, 2, **up)
    before = _file_of_key(spark, table)

    # Two rows for key 5 in one batch: the later one wins.
    s3 = _commit(_kv(spark, [(5, "b3-first"), (5, "b3-last")]), table, 3, **up)

    expected = {i: "b1" for i in range(10)} | {i: "b2" for i in range(100, 110)} | {5: "b3-last"}
    assert _rows(read_snapshot(spark, table, s3)) == sorted(expected.items())
    assert sorted((r["id"], r["v"]) for r in table.scan().to_arrow().to_pylist()) == sorted(
        expected.items()
    )
    assert table.snapshot_by_id(s3).summary.operation == Operation.OVERWRITE  # type: ignore[union-attr]
    assert snapshot_barrier(table, s3) == 3_000  # type: ignore[arg-type]

    after = _file_of_key(spark, table)
    untouched = {k for k, f in before.items() if f != before[5]}
    assert untouched, "the test needs files that do not hold key 5"
    assert all(after[k] == before[k] for k in untouched)
    assert after[5] != before[5]
    # An upsert table is not append-only: incremental reads refuse the overwrite range.
    with pytest.raises(ValueError, match="append-only"):
        read_appended(spark, table, None, s3)


def test_the_driver_finds_the_files_holding_keys_as_spark_does(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = _kv_table(catalog)
    _commit(_kv(spark, [(i, "a") for i in range(10)]), table, 1)
    _commit(_kv(spark, [(i, "b") for i in range(100, 110)]), table, 2)
    _commit(_kv(spark, [(5, "c"), (200, "c")]), table, 3)
    candidates = upsert.data_files(table, None)
    assert len(candidates) >= 3

    def both(keys: list[int | None]) -> tuple[list[str] | None, list[str]]:
        changed = spark.createDataFrame([(k,) for k in keys], "id long")
        on_driver = upsert._match_on_driver(table, candidates, lambda: changed, ["id"], None)
        aliased = changed.select(F.col("id").alias(upsert._key_alias(0)))
        in_spark = upsert._files_with_keys(spark, table, candidates, aliased, ["id"])
        driver_paths = (
            None if on_driver is None else sorted(f.file_path for f in on_driver.affected)
        )
        return driver_paths, sorted(f.file_path for f in in_spark)

    for keys in ([5], [105, 7], [200], [999], [5, 105, 200]):
        on_driver, in_spark = both(keys)  # type: ignore[arg-type]
        assert on_driver == in_spark, keys
    assert len(both([5])[1]) == 2  # the first batch's file and the third's
    # A null key is Spark's to match (null-safe equality); so is a table too big.
    assert both([5, None])[0] is None


def test_upsert_treats_null_as_a_key(spark: SparkSession, catalog: Catalog) -> None:
    table = _kv_table(catalog)
    up: dict[str, Any] = {"mode": "upsert", "key_columns": ["id"]}
    _commit(spark.createDataFrame([(None, "old"), (1, "one")], KV), table, 1, **up)
    sid = _commit(spark.createDataFrame([(None, "new")], KV), table, 2, **up)

    rows = read_snapshot(spark, table, sid).collect()
    assert len(rows) == 2 and {r["id"]: r["v"] for r in rows} == {None: "new", 1: "one"}


def _added_and_removed(table: Table, sid: int) -> tuple[set[str], set[str]]:
    parent = table.snapshot_by_id(sid).parent_snapshot_id  # type: ignore[union-attr]
    before = set() if parent is None else set(data_file_paths(table, parent))
    after = set(data_file_paths(table, sid))
    return after - before, before - after


def test_an_upsert_batch_with_a_key_twice_is_reduced_and_the_next_ones_first(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = _kv_table(catalog)
    up = {"mode": "upsert", "key_columns": ["id"]}
    _commit(_kv(spark, [(1, "a"), (2, "a")]), table, 1, **up)
    # Written as it came (the previous batch's size is known), then found to hold key 1
    # twice: written again, reduced to its last row per key.
    s2 = _commit(_kv(spark, [(1, "first"), (3, "b"), (1, "last")]), table, 2, **up)
    assert _rows(read_snapshot(spark, table, s2)) == [(1, "last"), (2, "a"), (3, "b")]
    summary = table.snapshot_by_id(s2).summary  # type: ignore[union-attr]
    assert summary[commit.UNIQUE_KEYS_KEY] == "false"  # type: ignore[index]
    assert summary[commit.BATCH_ROWS_KEY] == "2"  # type: ignore[index]
    # The next batch is reduced before it is written, and says so again.
    s3 = _commit(_kv(spark, [(4, "c"), (4, "d")]), table, 3, **up)
    assert _rows(read_snapshot(spark, table, s3)) == [(1, "last"), (2, "a"), (3, "b"), (4, "d")]
    assert table.snapshot_by_id(s3).summary[commit.UNIQUE_KEYS_KEY] == "false"  # type: ignore[union-attr,index]


def test_an_upsert_removes_a_file_whose_every_key_it_replaces_without_rewriting_it(
    spark: SparkSession, catalog: Catalog
) -> None:
    table = _kv_table(catalog)
    up = {"mode": "upsert", "key_columns": ["id"]}
    s1 = _commit(_kv(spark, [(1, "a"), (2, "a")]).coalesce(1), table, 1, **up)
    s2 = _commit(_kv(spark, [(10, "b"), (11, "b")]).coalesce(1), table, 2, **up)
    (first,), (second,) = _added_and_removed(table, s1)[0], _added_and_removed(table, s2)[0]

    s3 = _commit(_kv(spark, [(1, "c"), (2, "c"), (10, "c")]).coalesce(1), table, 3, **up)

    added, removed = _added_and_removed(table, s3)
    assert removed == {first, second}
    # The batch's file, and the second file without key 10; the first is not rewritten.
    assert len(added) == 2
    assert table.snapshot_by_id(s3).summary[commit.UNIQUE_KEYS_KEY] == "true"  # type: ignore[union-attr,index]
    assert _rows(read_snapshot(spark, table, s3)) == [(1, "c"), (2, "c"), (10, "c"), (11, "b")]


def test_files_matched_on_the_driver_are_rewritten_by_spark_when_large(
    spark: SparkSession, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upsert, "DRIVER_REWRITE_MAX_ROWS", 0)
    table = _kv_table(catalog)
    up = {"mode": "upsert", "key_columns": ["id"]}
    _commit(_kv(spark, [(i, "a") for i in range(10)]), table, 1, **up)
    sid = _commit(_kv(spark, [(3, "b"), (20, "b")]), table, 2, **up)
    expected = [(i, "b" if i == 3 else "a") for i in range(10)] + [(20, "b")]
    assert _rows(read_snapshot(spark, table, sid)) == expected


@pytest.mark.slow
def test_upsert_of_a_million_rows(spark: SparkSession, catalog: Catalog) -> None:
    table = ensure_table(
        catalog,
        "dw.big",
        T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.LongType())]),
    )
    up: dict[str, Any] = {"mode": "upsert", "key_columns": ["id"]}
    started = time.monotonic()

    _commit(spark.range(1_000_000).select("id", F.col("id").alias("v")), table, 1, **up)
    sid = _commit(
        spark.range(500_000, 1_500_000).select("id", F.lit(-1).cast("long").alias("v")),
        table,
        2,
        **up,
    )

    elapsed = time.monotonic() - started
    stats = (
        read_snapshot(spark, table, sid)
        .agg(
            F.count("*").alias("rows"),
            F.countDistinct("id").alias("keys"),
            F.sum(F.when(F.col("v") == -1, 1).otherwise(0)).alias("updated"),
            F.sum(F.when(F.col("v") == F.col("id"), 1).otherwise(0)).alias("old"),
        )
        .first()
    )
    assert (stats["rows"], stats["keys"], stats["updated"], stats["old"]) == (
        1_500_000,
        1_500_000,
        1_000_000,
        500_000,
    )
    assert elapsed < 60, f"1M-row upsert took {elapsed:.1f}s"


# --------------------------------------------------------------------------- retries


@pytest.fixture
def concurrent_commit(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Make the next N commits lose a race: each first lets another writer commit.

    Append the other writer's action (a callable) to the yielded list once per lost race.
    """
    races: list[Any] = []
    original = Transaction.commit_transaction
    busy = False

    def racing(self: Transaction) -> Table:
        nonlocal busy
        if races and not busy:
            busy = True
            try:
                races.pop(0)()
            finally:
                busy = False
        return original(self)

    monkeypatch.setattr(Transaction, "commit_transaction", racing)
    yield races


def _other_writer_appends(
    catalog: Catalog, rows: list[tuple[int, str]], stamp: dict[str, str] | None = None
) -> Any:
    def append() -> None:
        other = catalog.load_table("dw.kv")  # another driver's Table object
        other.append(
            pa.table(
                {"id": [r[0] for r in rows], "v": [r[1] for r in rows]},
                schema=pa.schema([("id", pa.int64()), ("v", pa.string())]),
            ),
            snapshot_properties=stamp or {},
        )

    return append


def test_append_retries_after_a_concurrent_commit(
    spark: SparkSession, catalog: Catalog, concurrent_commit: list[Any]
) -> None:
    table = _kv_table(catalog)
    concurrent_commit.append(_other_writer_appends(catalog, [(99, "other")]))

    sid = _commit(_kv(spark, [(1, "a")]), table, 1)

    assert not concurrent_commit, "the race was not run"
    snap = table.snapshot_by_id(sid)  # type: ignore[arg-type]
    parent = table.snapshot_by_id(snap.parent_snapshot_id)  # type: ignore[union-attr, arg-type]
    assert parent is not None and parent.summary.get(SUMMARY_JOB) is None  # type: ignore[union-attr]
    assert _rows(read_snapshot(spark, table, sid)) == [(1, "a"), (99, "other")]
    assert find_batch_snapshot(table, "job", 1) == sid


def test_upsert_replans_after_a_conflicting_commit(
    spark: SparkSession, catalog: Catalog, concurrent_commit: list[Any]
) -> None:
    table = _kv_table(catalog)
    up = {"mode": "upsert", "key_columns": ["id"]}
    _commit(_kv(spark, [(1, "a"), (5, "a")]), table, 1, **up)
    # Concurrently, someone else adds another row for key 5; the upsert must replace it too.
    concurrent_commit.append(_other_writer_appends(catalog, [(5, "other"), (7, "other")]))

    sid = _commit(_kv(spark, [(5, "new")]), table, 2, **up)

    assert not concurrent_commit
    assert _rows(read_snapshot(spark, table, sid)) == [(1, "a"), (5, "new"), (7, "other")]


def test_commit_gives_up_after_bounded_attempts(
    spark: SparkSession, catalog: Catalog, concurrent_commit: list[Any]
) -> None:
    table = _kv_table(catalog)
    concurrent_commit.extend(_other_writer_appends(catalog, [(i, "x")]) for i in range(2))

    with pytest.raises(CommitFailedException):
        _commit(_kv(spark, [(1, "a")]), table, 1, max_attempts=2)

    assert find_batch_snapshot(table, "job", 1) is None
    # The files written for the batch are gone; only the other writer's remain.
    data = Path(urlparse(table.location()).path) / "data"
    assert data.is_dir() and not list(data.glob("batch-*"))


def test_retry_stops_when_another_driver_committed_the_batch(
    spark: SparkSession, catalog: Catalog, concurrent_commit: list[Any]
) -> None:
    table = _kv_table(catalog)  # ensure_table turns pyiceberg's own commit retries off
    stamp = {SUMMARY_BARRIER: "1000", SUMMARY_JOB: "job", SUMMARY_BATCH: "1"}
    concurrent_commit.append(_other_writer_appends(catalog, [(1, "a")], stamp))

    sid = _commit(_kv(spark, [(1, "a")]), table, 1)  # the same batch, replayed by a zombie

    assert [s.snapshot_id for s in table.snapshots()] == [sid]
    assert _rows(read_snapshot(spark, table, sid)) == [(1, "a")]
    assert not list((Path(urlparse(table.location()).path) / "data").glob("batch-*"))
