"""Changelog reads end to end: a CDC source job (a real streaming query applying
inserts, updates and deletes), a derived job reading its changelog, and an aggregate
maintained from it; real Spark, real Iceberg, a real MetaService over HTTP.

The expected changes of each derived batch come from an oracle that reads the source
table with pyiceberg at the batch's two ends and compares by key: whatever the batch
boundaries, the batch must get exactly those rows (updates paired, deletes, no
carry-over rows of the files an update rewrote, nothing for an update that changed
nothing).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.table import Table
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import spark_barrier
from spark_barrier import BatchContext
from spark_barrier.iceberg.stamps import list_stamped_snapshots, snapshot_at
from tests.spark_barrier.pipeline import Service

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SOURCE, TOTALS = "ods.orders", "dws.totals"
ORDERS = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("status", T.StringType()),
        T.StructField("qty", T.IntegerType()),
    ]
)
FEED = T.StructType(
    [*ORDERS.fields, T.StructField("op", T.StringType()), T.StructField("seq", T.LongType())]
)
TOTALS_SCHEMA = T.StructType(
    [
        T.StructField("status", T.StringType()),
        T.StructField("qty", T.LongType()),
        T.StructField("orders", T.LongType()),
    ]
)
# One file of the feed per step: (id, status, qty, op).
STEPS: list[list[tuple[int, str | None, int | None, str]]] = [
    [(i, "placed", i, "I") for i in range(1, 7)],
    [(2, "shipped", 20, "U"), (3, None, None, "D"), (7, "placed", 7, "I")],
    [
        (2, "delivered", 20, "U"),
        (4, "shipped", 4, "U"),
        (5, None, None, "D"),
        (8, "placed", 8, "I"),
        (9, "placed", 9, "I"),
        (9, None, None, "D"),  # inserted and deleted in one batch: no change
    ],
    [(8, "shipped", 8, "update"), (1, None, None, "delete"), (3, "placed", 30, "insert")],
    # Key 6 "updated" to what it was: its file is rewritten, but nothing changed.
    [(10, "placed", 10, "I"), (10, "shipped", 11, "U"), (6, "placed", 6, "U")],
]
Row = tuple[str, int, str | None, int | None]  # (change type, id, status, qty)
LIVE = ("INSERT", "UPDATE_AFTER")


def register(spark: Any, service: Service, **kwargs: Any) -> Any:
    return spark_barrier.register(
        spark,
        service.url,
        catalog_uri=service.db_url,
        warehouse=service.warehouse,
        catalog=service.catalog,
        state_dir=service.state_dir,
        **kwargs,
    )


def wait_for(condition: Callable[[], bool], queries: list[Any], what: str) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        for query in queries:
            assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def state(table: Table, snapshot: int | None) -> dict[int, tuple[str | None, int | None]]:
    """The table at `snapshot`, read by pyiceberg (not by the code under test)."""
    if snapshot is None:
        return {}
    rows = table.scan(snapshot_id=snapshot).to_arrow().to_pylist()
    return {r["id"]: (r["status"], r["qty"]) for r in rows}


def expected_changes(before: dict[int, Any], after: dict[int, Any]) -> Counter[Row]:
    changes: Counter[Row] = Counter()
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if old is None:
            changes[("INSERT", key, *new)] += 1
        elif new is None:
            changes[("DELETE", key, *old)] += 1
        else:
            changes[("UPDATE_BEFORE", key, *old)] += 1
            changes[("UPDATE_AFTER", key, *new)] += 1
    return changes


def maintain_totals(changes: DataFrame, ctx: BatchContext) -> DataFrame:
    """Totals per status from the batch's changes: the totals before the batch plus
    the new images minus the old ones."""
    sign = F.when(F.col("_change_type").isin(*LIVE), 1).otherwise(-1)
    delta = changes.groupBy("status").agg(
        F.sum(sign * F.col("qty")).alias("dq"), F.sum(sign).alias("dn")
    )
    return delta.join(ctx.read(TOTALS), "status", "left").select(
        "status",
        (F.coalesce("qty", F.lit(0)) + F.col("dq")).cast("long").alias("qty"),
        (F.coalesce("orders", F.lit(0)) + F.col("dn")).cast("long").alias("orders"),
    )


def totals_match(spark: Any, service: Service) -> int:
    """At the consistent version of both tables, the maintained totals equal the totals
    recomputed from the orders; returns the version's barrier."""
    read = spark_barrier.read_consistent(spark, service.client, service.catalog, [SOURCE, TOTALS])
    recomputed = (
        read[SOURCE]
        .groupBy("status")
        .agg(F.sum("qty").cast("long").alias("qty"), F.count("*").alias("orders"))
    )
    maintained = read[TOTALS].where(F.col("orders") != 0)
    want = sorted(tuple(r) for r in recomputed.collect())
    got = sorted(tuple(r) for r in maintained.collect())
    assert got == want, f"at barrier {read.version.barrier}: maintained {got}, recomputed {want}"
    return read.version.barrier


def test_a_changelog_reader_of_a_cdc_table_gets_exactly_the_changes_of_each_batch(
    spark: Any, service: Service, tmp_path: Path
) -> None:
    feed = tmp_path / "feed"
    feed.mkdir()
    ingest = register(spark, service, job="ingest_orders", outputs={SOURCE: ORDERS})
    totals = register(
        spark, service, job="order_totals", inputs=[SOURCE], outputs={TOTALS: TOTALS_SCHEMA}
    )
    batches: list[tuple[int | None, int, Counter[Row]]] = []
    plans: list[str] = []

    def record_and_total(changes: DataFrame, ctx: BatchContext) -> DataFrame:
        rows = changes.select("_change_type", "id", "status", "qty").collect()
        batches.append((ctx.start_barrier, ctx.barrier, Counter(tuple(r) for r in rows)))
        plans.append(changes._jdf.queryExecution().executedPlan().toString())
        assert ctx.input(SOURCE) is changes
        return maintain_totals(changes, ctx)

    stream = spark.readStream.schema(FEED).option("maxFilesPerTrigger", 1).json(str(feed))
    cdc_sink = ingest.sink(mode="cdc", key_columns=["id"], op_column="op", order_by="seq")
    queries = [
        ingest.start(stream, cdc_sink, trigger_seconds=0.3),
        totals.start(
            totals.source(SOURCE, changelog=True),
            totals.sink(mode="upsert", key_columns=["status"], transform=record_and_total),
            trigger_seconds=0.3,
        ),
    ]
    source = service.catalog.load_table(SOURCE)
    checked: list[int] = []
    try:
        seq = 0
        for step, records in enumerate(STEPS):
            lines = []
            for id_, status, qty, op in records:
                seq += 1
                record = {"id": id_, "status": status, "qty": qty, "op": op, "seq": seq}
                lines.append(json.dumps(record))
            (feed / f"{step}.json").write_text("\n".join(lines) + "\n")

            def committed(step: int = step) -> bool:
                source.refresh()
                return len(list_stamped_snapshots(source)) > step

            wait_for(committed, queries, f"the CDC batch of step {step}")
            last = max(s.barrier for s in list_stamped_snapshots(source))
            wait_for(
                lambda last=last: service.client.get_job("order_totals").frontier >= last,
                queries,
                f"the changelog reader to read step {step}",
            )
            checked.append(totals_match(spark, service))
    finally:
        for query in queries:
            spark_barrier.stop_between_batches(query)
        ingest.close()
        totals.close()

    source.refresh()
    assert len(batches) >= 3, f"only {len(batches)} changelog batches"
    seen: Counter[str] = Counter()
    for start, barrier, got in batches:
        before = snapshot_at(source, start) if start else None
        after = snapshot_at(source, barrier)
        want = expected_changes(state(source, before), state(source, after))
        assert got == want, f"batch ({start}, {barrier}]: got {got}, expected {want}"
        seen.update(kind for kind, *_ in got.elements())
    assert {"INSERT", "DELETE", "UPDATE_BEFORE", "UPDATE_AFTER"} <= set(seen), seen
    # Rows were read by Spark's Parquet reader, not by Python workers.
    assert plans and all("Python" not in plan for plan in plans), plans
    assert any("FileScan parquet" in plan for plan in plans), plans
    assert len(checked) == len(STEPS) and checked == sorted(checked), checked
    assert state(source, source.current_snapshot().snapshot_id) == {  # type: ignore[union-attr]
        2: ("delivered", 20),
        3: ("placed", 30),
        4: ("shipped", 4),
        6: ("placed", 6),
        7: ("placed", 7),
        8: ("shipped", 8),
        10: ("shipped", 11),
    }
