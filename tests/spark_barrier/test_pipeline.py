"""The whole system: real Spark jobs writing real Iceberg tables, a real MetaService over HTTP."""

from __future__ import annotations

import time

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import spark_barrier
from examples import streaming_warehouse as demo
from metaservice.client import ConflictError
from spark_barrier import BarrierConfigError, BatchContext
from spark_barrier.snapshots import snapshot_at
from tests.spark_barrier.pipeline import (
    NUMBERS_SCHEMA,
    DrivenSource,
    Service,
    with_input,
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


@pytest.mark.slow
def test_demo_topology_revenue_equals_sum_of_amounts_at_every_consistent_version(spark, service):
    items = _register(spark, service, job="ingest_items", outputs={"ods.items": demo.ITEMS_SCHEMA})
    orders = _register(
        spark, service, job="ingest_orders", outputs={"ods.orders": demo.ORDERS_SCHEMA}
    )
    detail = _register(
        spark,
        service,
        job="build_order_detail",
        inputs=["ods.orders"],
        lookups=["ods.items"],
        outputs={demo.DETAIL: demo.DETAIL_SCHEMA},
    )
    revenue = _register(
        spark,
        service,
        job="aggregate_revenue",
        inputs=[demo.DETAIL],
        outputs={demo.REVENUE: demo.REVENUE_SCHEMA},
    )
    queries = [
        items.start(
            demo.generated_prices(spark), items.sink(mode="upsert", key_columns=["item_id"])
        ),
        orders.start(demo.generated_orders(spark, 20), orders.sink()),
        detail.start(detail.source("ods.orders"), detail.sink(transform=demo.enrich)),
        revenue.start(
            revenue.source(demo.DETAIL),
            revenue.sink(mode="upsert", key_columns=["item_id"], transform=demo.accumulate),
        ),
    ]
    checked: dict[int, int] = {}  # barrier -> items compared
    try:
        deadline = time.monotonic() + 150
        while len(checked) < 3 and time.monotonic() < deadline:
            time.sleep(3)
            for q in queries:
                assert q.exception() is None, q.exception()
            try:
                read = spark_barrier.read_consistent(
                    spark, service.client, service.catalog, [demo.DETAIL, demo.REVENUE]
                )
            except ConflictError:
                continue
            compared, wrong = demo.revenue_mismatches(read[demo.DETAIL], read[demo.REVENUE])
            assert wrong == 0, f"revenue != sum(amount) at barrier {read.version.barrier}"
            if compared:
                checked[read.version.barrier] = compared
        assert len(checked) >= 3, f"only {len(checked)} non-empty consistent versions in 150 s"
        version = service.client.consistent_version([demo.DETAIL, demo.REVENUE])
    finally:
        _stop(queries, [items, orders, detail, revenue])

    snapshot = version.snapshots[demo.REVENUE]
    assert snapshot is not None
    lineage = service.client.snapshot_lineage(demo.REVENUE, snapshot)
    assert lineage.job == "aggregate_revenue"
    (consumed,) = lineage.inputs
    assert consumed.table == demo.DETAIL
    detail_table = service.catalog.load_table(demo.DETAIL)
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

    def record(frame: DataFrame, ctx: BatchContext) -> DataFrame:
        stats = (
            frame.groupBy("input").agg(F.count("*"), F.min("barrier"), F.max("barrier")).collect()
        )
        batches.append((ctx.barrier, ctx.start_barrier, {r[0]: (r[1], r[2], r[3]) for r in stats}))
        return frame

    stream = with_input(joined.source("ods.fast"), "fast").unionByName(
        with_input(joined.source("ods.slow"), "slow")
    )
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
