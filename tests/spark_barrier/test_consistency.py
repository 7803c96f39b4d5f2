"""G1 and G3 on every path, with real Spark jobs, real Iceberg tables and a real
MetaService over HTTP (the consistency issue's Spark tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import spark_barrier
from metaservice.client import NotFoundError
from spark_barrier import BatchContext
from spark_barrier.iceberg.commit import commit_batch
from spark_barrier.iceberg.stamps import list_stamped_snapshots
from tests.spark_barrier.gate import ReportGate
from tests.spark_barrier.pipeline import (
    NUMBERS_SCHEMA,
    DrivenSource,
    Service,
    labelled,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

LABELLED = T.StructType([*NUMBERS_SCHEMA.fields, T.StructField("input", T.StringType())])


def register(spark: Any, service: Service, url: str | None = None, **kwargs: Any) -> Any:
    return spark_barrier.register(
        spark,
        url or service.url,
        catalog_uri=service.db_url,
        warehouse=service.warehouse,
        catalog=service.catalog,
        state_dir=service.state_dir,
        **kwargs,
    )


def source_job(spark: Any, service: Service, job: str, table: str) -> DrivenSource:
    register(spark, service, job=job, outputs={table: NUMBERS_SCHEMA}, outbox=False).close()
    return DrivenSource(spark, service, job, table)


def wait_for(condition: Callable[[], bool], query: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def wait_for_failure(query: Any, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while query.isActive and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not query.isActive, f"the query still runs after {timeout} s"
    error = query.exception()
    assert error is not None, "the query stopped without an error"
    return str(error)


def frontier(service: Service, job: str) -> int:
    return service.client.get_job(job).frontier


def test_two_input_job_whose_reports_are_held_back_reads_both_inputs_to_the_same_barrier(
    spark: Any, service: Service
) -> None:
    fast = source_job(spark, service, "src_fast", "ods.fast")
    slow = source_job(spark, service, "src_slow", "ods.slow")
    batches: list[tuple[int, int | None, dict[str, tuple[int, int, int]]]] = []

    def record(batch: DataFrame, ctx: BatchContext) -> DataFrame:
        frame = labelled(batch)
        stats = frame.groupBy("input").agg(F.count("*"), F.min("barrier"), F.max("barrier"))
        found = {r[0]: (r[1], r[2], r[3]) for r in stats.collect()}
        batches.append((ctx.barrier, ctx.start_barrier, found))
        return frame

    gate = ReportGate(service.url)
    with gate as gated:
        # Every commit report of the join lands between its sources' next-barrier calls.
        join = register(
            spark,
            service,
            gated,
            job="join_held",
            inputs=["ods.fast", "ods.slow"],
            outputs={"dwd.held": LABELLED},
        )
        # The sink reads both inputs; a row's input is in its _table column.
        stream = join.source("ods.fast").unionByName(join.source("ods.slow"))
        query = join.start(stream, join.sink(transform=record), trigger_seconds=0.3)
        try:
            for step in range(10):
                fast.batch(rows=3)
                if step % 2 == 0:
                    slow.batch(rows=2)
                time.sleep(0.6)
            last = max(b for _, b in fast.rows + slow.rows)
            wait_for(lambda: frontier(service, "join_held") >= last, query, 120, "the join")
        finally:
            gate.open()
            spark_barrier.stop_between_batches(query)
            join.close()

    assert len(batches) >= 3, batches
    for barrier, start, stats in batches:
        for name, source in (("fast", fast), ("slow", slow)):
            expected = [i for i, b in source.rows if (start or 0) < b <= barrier]
            count, low, high = stats.get(name, (0, None, None))
            assert count == len(expected), (name, barrier, start, stats)
            if count:
                assert (start or 0) < low and high <= barrier, (name, barrier, start, stats)
    output = service.catalog.load_table("dwd.held").scan().to_arrow().to_pylist()
    assert sorted((r["input"], r["id"]) for r in output) == sorted(
        [("fast", i) for i, _ in fast.rows] + [("slow", i) for i, _ in slow.rows]
    )
    assert gate.raced >= 2, f"reports landed between the sources' calls {gate.raced} times"


def copy_job(spark: Any, service: Service, job: str, source: str, target: str) -> Any:
    return register(spark, service, job=job, inputs=[source], outputs={target: NUMBERS_SCHEMA})


def test_a_job_registered_after_its_inputs_early_snapshots_expired_reads_their_full_state(
    spark: Any, service: Service
) -> None:
    numbers = source_job(spark, service, "src_old", "ods.old")
    for _ in range(3):
        numbers.batch(rows=4)
    table = service.catalog.load_table("ods.old")
    early = [s.snapshot_id for s in table.snapshots()][:2]
    table.maintenance.expire_snapshots().by_ids(early).commit()
    assert len(service.catalog.load_table("ods.old").snapshots()) == 1

    late = copy_job(spark, service, "late_reader", "ods.old", "dwd.old_copy")
    query = late.start(late.source("ods.old"), late.sink(), trigger_seconds=0.5)
    try:
        last = max(b for _, b in numbers.rows)
        wait_for(lambda: frontier(service, "late_reader") >= last, query, 120, "the reader")
    finally:
        spark_barrier.stop_between_batches(query)
        late.close()

    copied = service.catalog.load_table("dwd.old_copy").scan().to_arrow()
    assert sorted(copied.column("id").to_pylist()) == sorted(i for i, _ in numbers.rows)


def test_a_job_whose_input_is_upserted_fails_with_how_to_read_it(
    spark: Any, service: Service
) -> None:
    register(spark, service, job="src_up", outputs={"ods.up": NUMBERS_SCHEMA}, outbox=False).close()
    table = service.catalog.load_table("ods.up")

    def upsert(batch_id: int, rows: list[tuple[int, int]]) -> int:
        barrier = service.client.batch_barrier("src_up", batch_id).barrier
        frame = spark.createDataFrame([(i, barrier) for i, _ in rows], NUMBERS_SCHEMA)
        snapshot = commit_batch(
            frame, table, barrier=barrier, job="src_up", batch_id=batch_id,
            mode="upsert", key_columns=["id"],
        )  # fmt: skip
        service.client.report_commit("src_up", batch_id, barrier, "ods.up", snapshot)
        return barrier

    first = upsert(0, [(1, 0), (2, 0)])  # into an empty table: an append
    reader = copy_job(spark, service, "up_reader", "ods.up", "dwd.up_copy")
    query = reader.start(reader.source("ods.up"), reader.sink(), trigger_seconds=0.5)
    try:
        wait_for(lambda: frontier(service, "up_reader") >= first, query, 120, "the first read")
        upsert(1, [(2, 0), (3, 0)])  # replaces key 2: an overwrite snapshot
        message = wait_for_failure(query, 120)
    finally:
        spark_barrier.stop_between_batches(query)
        reader.close()

    assert "table ods.up is not append-only" in message
    assert "job.source('ods.up', changelog=True)" in message
    assert "lookups=['ods.up']" in message and "ctx.read('ods.up')" in message
    copied = service.catalog.load_table("dwd.up_copy").scan().to_arrow()
    assert sorted(copied.column("id").to_pylist()) == [1, 2]  # nothing of the upsert


def test_a_reset_checkpoint_fails_fast_and_commits_nothing(
    spark: Any, service: Service, tmp_path: Path
) -> None:
    ingest = register(spark, service, job="ingest_reset", outputs={"ods.reset": NUMBERS_SCHEMA})
    rate = spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    rows = rate.select(F.col("value").alias("id"), F.lit(0).cast("long").alias("barrier"))
    query = ingest.start(rows, ingest.sink(), trigger_seconds=0.5)
    try:
        wait_for(
            lambda: len(list_stamped_snapshots(service.catalog.load_table("ods.reset"))) >= 2,
            query, 120, "two batches",
        )  # fmt: skip
    finally:
        spark_barrier.stop_between_batches(query)
    before = list_stamped_snapshots(service.catalog.load_table("ods.reset"))
    # The last batch's report waits in the outbox for the next batch's barrier request
    # (one request per batch): delivered first, so that it is counted here.
    assert ingest.reporter.flush(30)
    reported = service.client.table_snapshots("ods.reset", limit=1000).total

    # The same job, a new checkpoint: Spark numbers its batches from 0 again.
    started = time.monotonic()
    again = ingest.start(rows, ingest.sink(), trigger_seconds=0.5, checkpoint=str(tmp_path / "new"))
    try:
        message = wait_for_failure(again, 120)
    finally:
        spark_barrier.stop_between_batches(again)
        ingest.close()

    assert time.monotonic() - started < 60
    assert "checkpoint was reset" in message and "original checkpoint" in message
    assert list_stamped_snapshots(service.catalog.load_table("ods.reset")) == before
    assert service.client.table_snapshots("ods.reset", limit=1000).total == reported
    assert {s.query for s in before} == {str(query.id)}


def test_a_lookup_is_read_at_the_batch_barrier_and_leased_while_the_batch_runs(
    spark: Any, service: Service
) -> None:
    orders = source_job(spark, service, "src_orders", "ods.orders")
    items = source_job(spark, service, "src_items", "ods.items")
    lookup = register(
        spark,
        service,
        job="with_lookup",
        inputs=["ods.orders"],
        lookups=["ods.items"],
        outputs={"dwd.looked_up": LABELLED},
    )
    seen: list[tuple[int, list[int], list[str], bool]] = []

    def join_items(frame: DataFrame, ctx: BatchContext) -> DataFrame:
        known = ctx.read("ods.items")
        barriers = sorted({r.barrier for r in known.select("barrier").collect()})
        kept = service.client.expirable("ods.items").kept
        leased = any(f"lease {ctx.leases[0]} " in " ".join(k.reasons) for k in kept)
        seen.append((ctx.barrier, barriers, list(ctx.leases), leased))
        return frame.withColumn("input", F.lit(str(known.count())))

    sink = lookup.sink(transform=join_items)
    query = lookup.start(lookup.source("ods.orders"), sink, trigger_seconds=0.5)
    try:
        for _ in range(4):
            items.batch(rows=1)
            orders.batch(rows=2)
            time.sleep(0.5)
        last = max(b for _, b in orders.rows + items.rows)
        wait_for(lambda: frontier(service, "with_lookup") >= last, query, 120, "the lookups")
    finally:
        spark_barrier.stop_between_batches(query)
        lookup.close()

    assert seen
    for barrier, barriers, leases, leased in seen:
        # Every item committed at or before the batch's barrier, none after it.
        assert barriers == sorted({b for _, b in items.rows if b <= barrier}), (barrier, barriers)
        assert len(leases) == 1 and leased
        with pytest.raises(NotFoundError):  # released when the batch ended
            service.client.delete_lease(leases[0])
