"""The whole system: real Spark jobs writing real Iceberg tables, a real MetaService over HTTP."""

from __future__ import annotations

import logging
import time

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import spark_barrier
from examples import warehouse_pipeline as wp
from metaservice.client import ConflictError
from spark_barrier import BarrierConfigError, BatchContext
from spark_barrier.iceberg.stamps import snapshot_at
from tests.spark_barrier.pipeline import (
    NUMBERS_SCHEMA,
    DrivenSource,
    Service,
    labelled,
)

pytestmark = pytest.mark.spark


def _register(spark, service: Service, **kwargs):  # type: ignore[no-untyped-def]
    return spark_barrier.register(
        spark,
        service.url,
        catalog_uri=service.db_url,
        warehouse=service.warehouse,
        catalog=service.catalog,
        state_dir=service.state_dir,
        **kwargs,
    )


def _stop(queries, jobs) -> None:  # type: ignore[no-untyped-def]
    for q in queries:
        spark_barrier.stop_between_batches(q)
    for job in jobs:
        job.close()


def test_the_demo_check_finds_each_kind_of_disagreement(spark) -> None:  # type: ignore[no-untyped-def]
    """`wp.check` compares in the driver; each way the tables can disagree is counted."""
    from decimal import Decimal as D

    def tables(orders, detail, revenue):  # type: ignore[no-untyped-def]
        return {
            wp.ORDERS: spark.createDataFrame([(o,) for o in orders], "order_id long"),
            wp.DETAIL: spark.createDataFrame(
                detail, "order_id long, item_id long, amount decimal(18,2)"
            ),
            wp.REVENUE: spark.createDataFrame(
                revenue, "item_id long, revenue decimal(18,2), order_count long"
            ),
        }

    detail = [(1, 7, D("2.50")), (2, 7, D("1.25")), (3, 8, D("4.00"))]
    revenue = [(7, D("3.75"), 2), (8, D("4.00"), 1)]
    assert wp.check(tables([1, 2, 3], detail, revenue)).ok

    wrong = wp.check(tables([1, 2, 3], detail, [(7, D("3.70"), 2), (8, D("4.00"), 2)]))
    assert (wrong.items, wrong.revenue_wrong, wrong.count_wrong) == (2, 1, 1)
    doubled = wp.check(tables([1, 2, 3], detail, [*revenue, (8, D("4.00"), 1)]))
    assert (doubled.revenue_wrong, doubled.count_wrong) == (1, 1)
    unknown_item = wp.check(tables([1, 2, 3], detail, [*revenue, (9, D("0.00"), 1)]))
    assert (unknown_item.items, unknown_item.count_wrong) == (3, 1)
    missing = wp.check(tables([1, 2, 3, 4], detail, revenue))
    assert (missing.orders_missing, missing.orders_extra, missing.ok) == (1, 0, False)
    extra = wp.check(tables([1, 2], detail, revenue))
    assert (extra.orders_missing, extra.orders_extra) == (0, 1)


@pytest.mark.slow
def test_demo_cdc_pipeline_is_right_at_every_consistent_version(spark, service, caplog):
    """The demo's pipeline (CDC with updates and deletes, partitioned ODS tables,
    changelog reads): its check holds at every consistent version of the four tables."""
    caplog.set_level(logging.INFO, logger="spark_barrier.steps")
    register = wp.registrar(
        spark,
        service.url,
        catalog_properties=service.catalog_properties,
        state_dir=service.state_dir,
    )
    pipeline = wp.build(spark, register, orders_per_second=20, source_trigger_s=0.5)
    queries = [pipeline.start(name) for name in pipeline.launchers]
    checked: dict[int, wp.Check] = {}  # barrier -> what the check found there
    try:
        deadline = time.monotonic() + 150
        while len(checked) < 3 and time.monotonic() < deadline:
            time.sleep(3)
            for q in queries:
                assert q.exception() is None, q.exception()
            try:
                read = spark_barrier.read_consistent(
                    spark, service.client, service.catalog, wp.ALL_TABLES
                )
            except ConflictError:
                continue
            found = wp.check({name: read[name] for name in wp.ALL_TABLES})
            assert found.ok, f"at barrier {read.version.barrier}: {found.describe()}"
            if found.items:
                checked[read.version.barrier] = found
        assert len(checked) >= 3, f"only {len(checked)} non-empty consistent versions in 150 s"
        version = service.client.consistent_version([wp.DETAIL, wp.REVENUE])
    finally:
        _stop(queries, pipeline.jobs.values())

    # Every batch logs where its time went, derived batches from planning to report (a
    # batch with no rows to write has no commit: the job's last one may be such a batch).
    timed: dict[str, list[set[str]]] = {}
    for record in caplog.records:
        if hasattr(record, "steps"):
            timed.setdefault(record.job, []).append(set(record.steps))
    assert set(timed) == set(pipeline.jobs), sorted(timed)
    every_step = {"plan", "barrier", "inputs", "transform", "write", "commit", "report"}
    assert any(every_step <= steps for steps in timed["aggregate_revenue"]), timed[
        "aggregate_revenue"
    ][-3:]

    # Deletes and updates happened: cancelled orders are gone from the ODS table.
    orders = service.catalog.load_table(wp.ORDERS)
    statuses = {r["status"] for r in orders.scan().to_arrow().to_pylist()}
    assert "shipped" in statuses and "cancelled" not in statuses, statuses
    assert not orders.spec().is_unpartitioned()

    snapshot = version.snapshots[wp.REVENUE]
    assert snapshot is not None
    lineage = service.client.snapshot_lineage(wp.REVENUE, snapshot)
    assert lineage.job == "aggregate_revenue"
    (consumed,) = lineage.inputs
    assert consumed.table == wp.DETAIL
    detail_table = service.catalog.load_table(wp.DETAIL)
    assert consumed.to_snapshot == snapshot_at(detail_table, lineage.barrier)
    assert consumed.from_snapshot == snapshot_at(detail_table, consumed.from_barrier)
    assert consumed.to_snapshot is not None


@pytest.mark.slow
def test_join_job_reads_both_inputs_up_to_the_same_barrier(spark, service):
    fast_job = _register(spark, service, job="src_fast", outputs={"ods.fast": NUMBERS_SCHEMA})
    slow_job = _register(spark, service, job="src_slow", outputs={"ods.slow": NUMBERS_SCHEMA})
    fast = DrivenSource(spark, service, "src_fast", "ods.fast")
    slow = DrivenSource(spark, service, "src_slow", "ods.slow")
    joined = _register(
        spark,
        service,
        job="join_both",
        inputs=["ods.fast", "ods.slow"],
        outputs={
            "dwd.both": T.StructType(
                [*NUMBERS_SCHEMA.fields, T.StructField("input", T.StringType())]
            )
        },
    )
    batches: list[tuple[int, int | None, dict[str, tuple[int, int, int]]]] = []

    def record(batch: DataFrame, ctx: BatchContext) -> DataFrame:
        frame = labelled(batch)
        stats = (
            frame.groupBy("input").agg(F.count("*"), F.min("barrier"), F.max("barrier")).collect()
        )
        batches.append((ctx.barrier, ctx.start_barrier, {r[0]: (r[1], r[2], r[3]) for r in stats}))
        return frame

    # The sink reads both inputs; a row's input is in its _table column.
    stream = joined.source("ods.fast").unionByName(joined.source("ods.slow"))
    query = joined.start(stream, joined.sink(transform=record), trigger_seconds=0.5)
    try:
        for step in range(16):
            fast.batch(rows=3)
            if step % 4 == 0:
                # The slow source holds a batch open for a while: its frontier lags.
                barrier = slow.open_batch()
                time.sleep(1.2)
                slow.commit(barrier, rows=2)
            time.sleep(0.3)
        deadline = time.monotonic() + 60
        last = max(b for _, b in fast.rows + slow.rows)
        while service.client.get_job("join_both").frontier < last and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
    finally:
        _stop([query], [fast_job, slow_job, joined])

    assert batches, "the join job ran no batch"
    for barrier, start, stats in batches:
        for source in (fast, slow):
            name = "fast" if source is fast else "slow"
            expected = [i for i, b in source.rows if (start or 0) < b <= barrier]
            count, low, high = stats.get(name, (0, None, None))
            assert count == len(expected), (name, barrier, start, stats)
            if count:
                assert (start or 0) < low and high <= barrier
    output = service.catalog.load_table("dwd.both").scan().to_arrow().to_pylist()
    assert sorted((r["input"], r["id"]) for r in output) == sorted(
        [("fast", i) for i, _ in fast.rows] + [("slow", i) for i, _ in slow.rows]
    )


def test_register_refuses_an_input_table_missing_from_the_catalog(spark, service):
    with pytest.raises(BarrierConfigError, match=r"ods.nowhere.*does not exist"):
        _register(
            spark, service, job="reader", inputs=["ods.nowhere"], outputs={"dwd.x": NUMBERS_SCHEMA}
        )
    with pytest.raises(Exception, match="not registered"):
        service.client.get_job("reader")


def test_register_refuses_a_bad_partition_spec_and_creates_nothing(spark, service):
    outputs = {"ods.good": NUMBERS_SCHEMA, "ods.bad": NUMBERS_SCHEMA}
    with pytest.raises(BarrierConfigError, match=r"ods.bad.*nowhere"):
        _register(
            spark,
            service,
            job="parted",
            outputs=outputs,
            partition_by={"ods.good": ["bucket(4, id)"], "ods.bad": ["day(nowhere)"]},
        )
    with pytest.raises(BarrierConfigError, match=r"not among its outputs"):
        _register(spark, service, job="parted", outputs=outputs, partition_by={"ods.x": ["id"]})
    assert not service.catalog.table_exists("ods.good")
    assert not service.catalog.table_exists("ods.bad")
    with pytest.raises(Exception, match="not registered"):
        service.client.get_job("parted")
    job = _register(
        spark, service, job="parted", outputs=outputs, partition_by={"ods.good": ["bucket(4, id)"]}
    )
    job.close()
    spec = service.catalog.load_table("ods.good").spec()
    assert [str(f.transform) for f in spec.fields] == ["bucket[4]"]
    assert service.catalog.load_table("ods.bad").spec().is_unpartitioned()


def test_register_refuses_a_table_another_job_writes(spark, service):
    _register(spark, service, job="writer_one", outputs={"ods.shared": NUMBERS_SCHEMA}).close()
    with pytest.raises(BarrierConfigError, match="already written by job 'writer_one'"):
        _register(spark, service, job="writer_two", outputs={"ods.shared": NUMBERS_SCHEMA})


def test_register_fails_fast_when_the_metaservice_is_unreachable(spark, service, tmp_path):
    started = time.monotonic()
    with pytest.raises(BarrierConfigError, match=r"unreachable.*metaservice start"):
        spark_barrier.register(
            spark,
            "http://127.0.0.1:9",
            job="lonely",
            outputs={"ods.lonely": NUMBERS_SCHEMA},
            catalog=service.catalog,
            state_dir=tmp_path,
        )
    assert time.monotonic() - started < 15


def test_register_refuses_an_output_without_schema_that_does_not_exist(spark, service):
    with pytest.raises(BarrierConfigError, match="pass its schema"):
        _register(spark, service, job="no_schema", outputs=["ods.unknown"])
