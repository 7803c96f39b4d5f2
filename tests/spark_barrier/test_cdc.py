"""CDC apply (mode="cdc"): change records applied to a real Iceberg table by real Spark,
one snapshot per batch, and bad records refused with nothing committed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import SparkSession
from pyspark.sql import types as T

import spark_barrier
from spark_barrier.iceberg import upsert
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.cdc import CdcInputError
from spark_barrier.iceberg.commit import commit_batch
from spark_barrier.iceberg.scan import data_file_paths
from tests.spark_barrier.pipeline import Service

pytestmark = pytest.mark.spark

TABLE = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("status", T.StringType()),
        T.StructField("qty", T.IntegerType()),
    ]
)
FEED = T.StructType(
    [*TABLE.fields, T.StructField("op", T.StringType()), T.StructField("seq", T.LongType())]
)


def rows_of(table: Table) -> dict[int, tuple[str, int]]:
    table.refresh()
    return {r["id"]: (r["status"], r["qty"]) for r in table.scan().to_arrow().to_pylist()}


def operation(table: Table, snapshot: int) -> str:
    summary = table.snapshot_by_id(snapshot).summary  # type: ignore[union-attr]
    assert summary is not None and summary.operation is not None
    return str(summary.operation.value)


class Changes:
    """Commits CDC batches of (id, status, qty, op, seq) records to one table."""

    def __init__(self, spark: SparkSession, table: Table) -> None:
        self.spark = spark
        self.table = table
        self.batch_id = 0

    def apply(self, records: list[tuple[Any, ...]], order_by: str | None = "seq") -> int | None:
        frame = self.spark.createDataFrame(records, FEED).repartition(1)
        if order_by is None:
            frame = frame.drop("seq")
        snapshot = commit_batch(
            frame,
            self.table,
            barrier=1000 * (self.batch_id + 1),
            job="cdc",
            batch_id=self.batch_id,
            mode="cdc",
            key_columns=["id"],
            op_column="op",
            order_by=order_by,
        )
        self.batch_id += 1
        return snapshot


@pytest.fixture
def changes(spark: SparkSession, catalog: Catalog) -> Changes:
    return Changes(spark, ensure_table(catalog, "ods.cdc", TABLE))


def test_inserts_updates_and_deletes_are_applied_by_key_one_snapshot_per_batch(
    changes: Changes,
) -> None:
    table = changes.table
    first = changes.apply([(i, "placed", i, "I", i) for i in range(1, 7)])
    assert first is not None and operation(table, first) == "append"
    assert rows_of(table) == {i: ("placed", i) for i in range(1, 7)}

    second = changes.apply(
        [
            (2, "shipped", 20, "U", 10),
            (3, None, None, "D", 11),  # a delete needs only its key
            (7, "placed", 7, "insert", 12),  # ops in any case, long or short
            (9, "placed", 9, " I ", 13),
            (9, "cancelled", 9, "Delete", 14),  # inserted and deleted in one batch
            (4, "shipped", 40, "UPDATE", 16),
            (4, "lost", 41, "U", 15),  # earlier by seq although later in the batch
        ]
    )
    assert second is not None and operation(table, second) == "overwrite"
    assert len(table.snapshots()) == 2
    assert rows_of(table) == {
        1: ("placed", 1),
        2: ("shipped", 20),
        4: ("shipped", 40),
        5: ("placed", 5),
        6: ("placed", 6),
        7: ("placed", 7),
    }
    # The op and order columns are not stored.
    assert [f.name for f in table.schema().fields] == ["id", "status", "qty"]


def test_without_order_by_the_last_record_of_a_key_in_the_batch_wins(changes: Changes) -> None:
    changes.apply([(1, "placed", 1, "I", 0)], order_by=None)
    changes.apply([(1, "shipped", 2, "U", 0), (1, "delivered", 3, "U", 0)], order_by=None)
    assert rows_of(changes.table) == {1: ("delivered", 3)}
    changes.apply([(1, "x", 4, "U", 0), (1, None, None, "D", 0)], order_by=None)
    assert rows_of(changes.table) == {}


@pytest.mark.parametrize("on_driver", [True, False], ids=["match on the driver", "in Spark"])
def test_only_the_files_holding_changed_keys_are_rewritten(
    changes: Changes, on_driver: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not on_driver:
        monkeypatch.setattr(upsert, "DRIVER_MATCH_MAX_ROWS", 0)
    table = changes.table
    changes.apply([(i, "placed", i, "I", i) for i in range(1, 4)])
    low = set(data_file_paths(table))
    changes.apply([(i, "placed", i, "I", i) for i in range(100, 104)])
    high = set(data_file_paths(table)) - low

    changes.apply([(101, "shipped", 1, "U", 200)])

    after = set(data_file_paths(table))
    assert low <= after, "the files of keys 1..3 are untouched"
    assert not high & after, "the files of keys 100..103 are rewritten"
    assert len(after - low) == 2  # the batch's row; 100, 102 and 103 rewritten
    assert rows_of(table) == {
        **{i: ("placed", i) for i in (1, 2, 3, 100, 102, 103)},
        101: ("shipped", 1),
    }


def test_a_batch_that_only_removes_whole_files_is_a_delete_snapshot(changes: Changes) -> None:
    table = changes.table
    changes.apply([(1, "placed", 1, "I", 1), (2, "placed", 2, "I", 2)])
    changes.apply([(3, "placed", 3, "I", 3)])

    deleted = changes.apply([(1, None, None, "D", 4), (2, None, None, "D", 5)])

    assert deleted is not None and operation(table, deleted) == "delete"
    assert rows_of(table) == {3: ("placed", 3)}
    # Deleting keys that are not there changes nothing: no snapshot.
    assert changes.apply([(42, None, None, "D", 6)]) is None
    assert len(table.snapshots()) == 3


@pytest.mark.parametrize(
    ("record", "quoted"),
    [
        ((None, "placed", 1, "I", 2), "has no key: id is null"),
        ((5, "placed", 1, "X", 2), "has the unknown op 'X'"),
        ((5, "placed", 1, None, 2), "has the unknown op None"),
    ],
)
def test_a_record_without_key_or_with_an_unknown_op_fails_the_batch_with_nothing_committed(
    changes: Changes, record: tuple[Any, ...], quoted: str
) -> None:
    table = changes.table
    changes.apply([(1, "placed", 1, "I", 1)])
    snapshots = [s.snapshot_id for s in table.snapshots()]

    with pytest.raises(CdcInputError) as refused:
        changes.apply([(2, "placed", 2, "I", 1), record])

    message = str(refused.value)
    assert "job 'cdc' batch 1" in message and quoted in message
    assert "Nothing of the batch was committed" in message
    table.refresh()
    assert [s.snapshot_id for s in table.snapshots()] == snapshots
    assert rows_of(table) == {1: ("placed", 1)}


def test_a_cdc_sink_is_checked_when_built_and_keys_its_table(spark: Any, service: Service) -> None:
    job = spark_barrier.register(
        spark,
        service.url,
        job="ingest_cdc",
        outputs={"ods.keyed": TABLE},
        catalog_uri=service.db_url,
        warehouse=service.warehouse,
        catalog=service.catalog,
        state_dir=service.state_dir,
        outbox=False,
    )
    try:
        with pytest.raises(spark_barrier.BarrierConfigError, match="needs op_column"):
            job.sink(mode="cdc", key_columns=["id"])
        with pytest.raises(spark_barrier.BarrierConfigError, match="is a column of table"):
            job.sink(mode="cdc", key_columns=["id"], op_column="status")
        with pytest.raises(spark_barrier.BarrierConfigError, match="only used with mode='cdc'"):
            job.sink(mode="upsert", key_columns=["id"], op_column="op")
        job.sink(mode="cdc", key_columns=["id"], op_column="op")
    finally:
        job.close()
    schema = service.catalog.load_table("ods.keyed").schema()
    assert schema.identifier_field_names() == {"id"} and schema.find_field("id").required


def test_a_cdc_source_job_with_a_bad_record_stops_and_commits_nothing_of_that_batch(
    spark: Any, service: Service, tmp_path: Path
) -> None:
    feed = tmp_path / "feed"
    feed.mkdir()
    job = spark_barrier.register(
        spark,
        service.url,
        job="ingest_bad",
        outputs={"ods.bad": TABLE},
        catalog_uri=service.db_url,
        warehouse=service.warehouse,
        catalog=service.catalog,
        state_dir=service.state_dir,
    )
    stream = spark.readStream.schema(FEED).option("maxFilesPerTrigger", 1).json(str(feed))
    sink = job.sink(mode="cdc", key_columns=["id"], op_column="op", order_by="seq")
    (feed / "0.json").write_text('{"id": 1, "status": "placed", "qty": 1, "op": "I", "seq": 1}\n')
    query = job.start(stream, sink, trigger_seconds=0.3)
    try:
        table = service.catalog.load_table("ods.bad")
        deadline = time.monotonic() + 60
        while not rows_of(table) and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.3)
        good = [s.snapshot_id for s in table.snapshots()]
        (feed / "1.json").write_text(
            '{"id": 2, "status": "placed", "qty": 2, "op": "I", "seq": 2}\n'
            '{"id": 3, "status": "placed", "qty": 3, "op": "upsert", "seq": 3}\n'
        )
        deadline = time.monotonic() + 60
        while query.isActive and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not query.isActive, "the query still runs after a bad record"
        message = str(query.exception())
    finally:
        spark_barrier.stop_between_batches(query)
        job.close()

    assert "job 'ingest_bad' batch 1" in message and "unknown op 'upsert'" in message
    table.refresh()
    assert [s.snapshot_id for s in table.snapshots()] == good
    assert rows_of(table) == {1: ("placed", 1)}
