"""A reader registered while a revision runs, with real Spark on real Iceberg tables: the
demo pipeline (examples/revise_order_detail.py) revises `dwd.order_detail`; a job that
asks to read it meanwhile is refused (409 `revision_running`: it would be left on the
replaced table at the swap) and nothing is registered; after the swap the same job
registers, and what it computes is from the revised table, so a consistent version
pairs it with the revised detail, never with the replaced one."""

from __future__ import annotations

import functools
import time
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from examples import revise_order_detail as rev
from examples import warehouse_pipeline as wp
from metaservice.client import NotFoundError
from spark_barrier import BatchContext
from spark_barrier.job import BarrierConfigError
from tests.spark_barrier.pipeline import Service

TOTALS = "dws.detail_totals"
TOTALS_SCHEMA = T.StructType(
    [
        T.StructField("k", T.IntegerType()),
        T.StructField("revenue", wp.MONEY),
        T.StructField("order_count", T.LongType()),
    ]
)


def totals(changes: DataFrame, ctx: BatchContext) -> DataFrame:
    """The detail's total amount and line count (one row, key 0), kept up to date from
    the detail's changelog as the demo's revenue is."""
    delta = (
        changes.selectExpr(
            "0 AS k",
            f"CASE WHEN _change_type IN {wp.LIVE_SQL} THEN 1 ELSE -1 END * coalesce(amount, 0)"
            " AS added",
            "CASE _change_type WHEN 'INSERT' THEN 1 WHEN 'DELETE' THEN -1 ELSE 0 END AS lines",
        )
        .groupBy("k")
        .agg(F.expr("sum(added) AS added"), F.expr("sum(lines) AS lines"))
    )
    current = ctx.read(TOTALS)
    return delta.join(current, "k", "left").selectExpr(
        "k",
        f"CAST(coalesce(revenue, 0) + added AS {wp.MONEY_SQL}) AS revenue",
        "CAST(coalesce(order_count, 0) + lines AS long) AS order_count",
    )


def register_reader(run: rev.Run) -> Any:
    return run.register(
        job="detail_totals",
        inputs=[wp.DETAIL],
        outputs={TOTALS: TOTALS_SCHEMA},
        description="the detail's totals, registered while it is revised",
    )


@pytest.mark.spark
@pytest.mark.slow
def test_a_reader_registered_during_a_revision_is_refused_and_after_the_swap_reads_it(
    spark: Any, service: Service
) -> None:
    run = rev.Run(
        spark,
        service.url,
        catalog_properties=service.catalog_properties,
        state_dir=service.state_dir,
        orders_per_second=20,
    )
    reader = rev.Reader(run.client, run.catalog)
    run.start(run.pipeline)
    try:
        run.wait("revenue committed", lambda: bool(run.frontier("aggregate_revenue")), 180)
        start = run.client.consistent_version(rev.TABLES)
        orders = reader.rows(wp.ORDERS, start.snapshots[wp.ORDERS])
        placed_after = max((r["order_id"] for r in orders), default=-1)
        time.sleep(3)
        revision = run.client.create_revision(wp.DETAIL, start.barrier)
        revised_register = functools.partial(run.register, revision=revision.id)
        revised = wp.build_derived(revised_register, amount=rev.discounted_amount)
        run.pipeline.jobs |= {f"{n} (revision)": job for n, job in revised.jobs.items()}
        for name in revised.launchers:
            run.queries[f"{name} (revision)"] = revised.start(name)

        # While it runs: refused, with the ways forward, and nothing registered
        with pytest.raises(BarrierConfigError) as refused:
            register_reader(run)
        message = str(refused.value)
        assert f"'{wp.DETAIL}' is being revised (revision {revision.id})" in message, message
        assert f"POST /api/v1/revisions/{revision.id}/swap" in message, message
        assert f"DELETE /api/v1/revisions/{revision.id}" in message, message
        with pytest.raises(NotFoundError):
            run.client.get_job("detail_totals")

        ready = lambda: run.client.get_revision(revision.id).state == "ready"  # noqa: E731
        run.wait("revision ready", ready, 300)
        rev._swap_once_ready(run, revision.id, ready)
        rev._restart_after_swap(run, revised, revised_register)

        # After the swap: the same registration is accepted and reads the revised table
        job = register_reader(run)
        run.queries["detail_totals"] = job.start(
            job.source(wp.DETAIL, changelog=True),
            job.sink(mode="upsert", key_columns=["k"], transform=totals),
        )
        target = run.frontier(f"build_order_detail__rev{revision.id}")
        run.wait("the new reader to catch up", lambda: run.frontier("detail_totals") >= target, 180)
        assert run.client.get_job("detail_totals").inputs == [wp.DETAIL]
    finally:
        run.stop()

    version = run.client.consistent_version([wp.ORDERS, wp.DETAIL, TOTALS])
    detail = reader.rows(wp.DETAIL, version.snapshots[wp.DETAIL])
    [total] = reader.rows(TOTALS, version.snapshots[TOTALS])
    # the detail is the revised one: every order placed after the barrier discounted
    kinds = {rev.line_kind(row) for row in detail if row["order_id"] > placed_after}
    assert "new" in kinds and kinds <= {"new", "unpriced"}, kinds
    # and the reader's totals are computed from it, not from the replaced table
    assert total["order_count"] == len(detail), (total, len(detail))
    assert total["revenue"] == sum((r["amount"] or Decimal(0) for r in detail), Decimal(0))
