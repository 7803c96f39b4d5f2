"""A streaming warehouse on barrier-aligned Spark jobs, on its own embedded defaults.

    python -m examples.streaming_warehouse [--warehouse ./demo-warehouse] [--duration 60]

Four streaming queries in one Spark driver, coordinated by an embedded MetaService:

    ingest_orders  (rate source)  -> ods.orders        append
    ingest_items   (rate source)  -> ods.items         upsert on item_id (price updates)
    build_order_detail  ods.orders + ods.items(as of the barrier) -> dwd.order_detail
    aggregate_revenue   dwd.order_detail -> dws.item_revenue        upsert on item_id

While it runs it prints progress and, a few times, checks that revenue per item in
dws.item_revenue equals the sum of amounts in dwd.order_detail: at the consistent
version (always equal) and on the latest snapshots (often not).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

import spark_barrier
from examples.embedded import EmbeddedMetaService
from metaservice.client import ConflictError, MetaServiceClient
from metaservice.settings import Settings
from spark_barrier import BatchContext
from spark_barrier.iceberg_io import open_catalog, read_snapshot

ITEMS = 20
MONEY = T.DecimalType(18, 2)
ORDERS_SCHEMA = T.StructType(
    [
        T.StructField("order_id", T.LongType()),
        T.StructField("item_id", T.LongType()),
        T.StructField("quantity", T.IntegerType()),
        T.StructField("ordered_at", T.TimestampType()),
    ]
)
ITEMS_SCHEMA = T.StructType(
    [
        T.StructField("item_id", T.LongType()),
        T.StructField("price", MONEY),
        T.StructField("updated_at", T.TimestampType()),
    ]
)
DETAIL_SCHEMA = T.StructType(
    [
        T.StructField("order_id", T.LongType()),
        T.StructField("item_id", T.LongType()),
        T.StructField("quantity", T.IntegerType()),
        T.StructField("price", MONEY),
        T.StructField("amount", MONEY),
    ]
)
REVENUE_SCHEMA = T.StructType(
    [
        T.StructField("item_id", T.LongType()),
        T.StructField("revenue", MONEY),
        T.StructField("order_count", T.LongType()),
    ]
)
DETAIL, REVENUE = "dwd.order_detail", "dws.item_revenue"


def generated_orders(spark: SparkSession, rows_per_second: int) -> DataFrame:
    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rows_per_second)
        .load()
        .select(
            F.col("value").alias("order_id"),
            ((F.col("value") * 7) % ITEMS).alias("item_id"),
            ((F.col("value") % 5) + 1).cast("int").alias("quantity"),
            F.col("timestamp").alias("ordered_at"),
        )
    )


def generated_prices(spark: SparkSession) -> DataFrame:
    # Every item gets a price in its first seconds, then prices keep changing.
    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 5)
        .load()
        .select(
            (F.col("value") % ITEMS).alias("item_id"),
            (F.lit(5) + (F.col("value") * 37 % 400) / 4).cast(MONEY).alias("price"),
            F.col("timestamp").alias("updated_at"),
        )
    )


def enrich(orders: DataFrame, ctx: BatchContext) -> DataFrame:
    """Join the batch's orders with item prices as of the same barrier."""
    items = ctx.read("ods.items").select("item_id", "price")
    return orders.join(items, "item_id").select(
        "order_id",
        "item_id",
        "quantity",
        "price",
        (F.col("quantity") * F.col("price")).cast(MONEY).alias("amount"),
    )


def accumulate(details: DataFrame, ctx: BatchContext) -> DataFrame:
    """New totals for the items this batch touched: old totals plus the batch's amounts."""
    delta = details.groupBy("item_id").agg(
        F.sum("amount").alias("added"), F.count("*").alias("orders")
    )
    current = ctx.read(REVENUE)
    return delta.join(current, "item_id", "left").select(
        "item_id",
        (F.coalesce("revenue", F.lit(0)) + F.col("added")).cast(MONEY).alias("revenue"),
        (F.coalesce("order_count", F.lit(0)) + F.col("orders")).alias("order_count"),
    )


def revenue_mismatches(detail: DataFrame, revenue: DataFrame) -> tuple[int, int]:
    """(items compared, items whose revenue differs from the sum of their amounts)."""
    expected = detail.groupBy("item_id").agg(F.sum("amount").alias("expected"))
    joined = expected.join(revenue, "item_id", "full")
    differ = joined.where(
        ~F.coalesce(F.col("expected"), F.lit(0)).eqNullSafe(F.coalesce(F.col("revenue"), F.lit(0)))
    )
    return joined.count(), differ.count()


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.root = Path(args.warehouse).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.db_url = f"sqlite:///{self.root / 'metaservice.db'}"
        self.tables_dir = self.root / "tables"
        self.state_dir = self.root / "state"
        self.duration = args.duration
        self.rate = args.orders_per_second
        self.settings = Settings(
            db_url=self.db_url,
            warehouse=str(self.tables_dir),
            barrier_interval_ms=args.barrier_interval_ms,
            port=args.port,
        )

    def run(self) -> None:
        print(f"everything is kept under {self.root}")
        print(f"  MetaService database and Iceberg catalog: {self.db_url}")
        print(f"  Iceberg tables: {self.tables_dir}")
        print(f"  Spark checkpoints and report outboxes: {self.state_dir}")
        with EmbeddedMetaService(self.settings) as url:
            print(f"MetaService running at {url} (API docs at {url}/docs)")
            spark = spark_barrier.local_spark_builder("streaming-warehouse").getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            self.client = MetaServiceClient(url)
            self.catalog = open_catalog(self.db_url, str(self.tables_dir))
            jobs, _ = self.start_jobs(spark, url)
            try:
                self.watch(spark)
            finally:
                print("stopping the streaming queries between batches ...")
                for q in self.queries.values():
                    spark_barrier.stop_between_batches(q)
                for job in jobs:
                    job.close()
            self.report(spark)
            spark.stop()
        print(
            f"\nthe run is kept in {self.root}; to query it later:\n"
            f"  metaservice start --db {self.db_url}\n"
            f"  metaservice lineage {REVENUE}"
        )

    def register(self, spark: SparkSession, url: str, **kwargs):  # type: ignore[no-untyped-def]
        return spark_barrier.register(
            spark,
            url,
            catalog_uri=self.db_url,
            warehouse=str(self.tables_dir),
            catalog=self.catalog,
            state_dir=self.state_dir,
            **kwargs,
        )

    def start_jobs(self, spark: SparkSession, url: str):  # type: ignore[no-untyped-def]
        items = self.register(
            spark,
            url,
            job="ingest_items",
            outputs={"ods.items": ITEMS_SCHEMA},
            description="item prices from the catalogue feed",
        )
        orders = self.register(
            spark,
            url,
            job="ingest_orders",
            outputs={"ods.orders": ORDERS_SCHEMA},
            description="orders from the shop's CDC stream",
        )
        detail = self.register(
            spark,
            url,
            job="build_order_detail",
            inputs=["ods.orders"],
            lookups=["ods.items"],  # an upsert table: read at each batch's barrier, not streamed
            outputs={DETAIL: DETAIL_SCHEMA},
            description="orders priced at their barrier",
        )
        revenue = self.register(
            spark,
            url,
            job="aggregate_revenue",
            inputs=[DETAIL],
            outputs={REVENUE: REVENUE_SCHEMA},
            description="revenue per item",
        )
        # How to (re)start each query: a failed one restarts from its checkpoint, and
        # the barrier sink makes the replayed batch exactly-once.
        self.launchers = {
            "ingest_items": lambda: items.start(
                generated_prices(spark), items.sink(mode="upsert", key_columns=["item_id"])
            ),
            "ingest_orders": lambda: orders.start(
                generated_orders(spark, self.rate), orders.sink()
            ),
            "build_order_detail": lambda: detail.start(
                detail.source("ods.orders"), detail.sink(transform=enrich)
            ),
            "aggregate_revenue": lambda: revenue.start(
                revenue.source(DETAIL),
                revenue.sink(mode="upsert", key_columns=["item_id"], transform=accumulate),
            ),
        }
        self.queries = {name: launch() for name, launch in self.launchers.items()}
        print(f"started {len(self.queries)} streaming queries: {', '.join(self.queries)}")
        return [items, orders, detail, revenue], self.queries

    def supervise(self) -> None:
        for name, query in list(self.queries.items()):
            if not query.isActive:
                error = query.exception()
                first_line = str(error).splitlines()[0] if error else "stopped"
                print(
                    f"  query {name} failed ({first_line[:160]}); restarting it from its checkpoint"
                )
                self.queries[name] = self.launchers[name]()

    def watch(self, spark: SparkSession) -> None:
        start = time.monotonic()
        next_check = start + 15
        while (elapsed := time.monotonic() - start) < self.duration:
            time.sleep(5)
            self.supervise()
            tables = {t.name: t for t in self.client.all_tables()}
            line = "  ".join(
                f"{name} {self._lag(tables[name].delay_ms)}"
                for name in ("ods.orders", "ods.items", DETAIL, REVENUE)
            )
            print(f"[{elapsed:5.0f}s] delay: {line}", flush=True)
            if time.monotonic() >= next_check:
                self.check(spark)
                next_check = time.monotonic() + 15

    @staticmethod
    def _lag(delay_ms: int | None) -> str:
        if delay_ms is None or delay_ms > 10**9:
            return "(no data yet)"
        return f"{delay_ms / 1000:.1f}s"

    def check(self, spark: SparkSession) -> None:
        try:
            read = spark_barrier.read_consistent(
                spark, self.client, self.catalog, [DETAIL, REVENUE]
            )
        except ConflictError:
            print("  consistent version: none yet (the jobs have not committed a common barrier)")
            return
        compared, wrong = revenue_mismatches(read[DETAIL], read[REVENUE])
        age = (time.time() * 1000 - read.version.barrier) / 1000
        verdict = "OK" if wrong == 0 else f"MISMATCH on {wrong} items"
        print(
            f"  consistent version at barrier {read.version.barrier} ({age:.1f}s old), "
            f"snapshots {read.version.snapshots}: revenue == sum(amount) for {compared} items: {verdict}"
        )
        detail_latest = self._latest(spark, DETAIL)
        revenue_latest = self._latest(spark, REVENUE)
        compared, wrong = revenue_mismatches(detail_latest, revenue_latest)
        print(
            f"  latest snapshots (no coordination): {wrong} of {compared} items disagree"
            + (" - expected, they are not a consistent pair" if wrong else "")
        )

    def _latest(self, spark: SparkSession, name: str) -> DataFrame:
        table = self.catalog.load_table(name)
        current = table.current_snapshot()
        return read_snapshot(spark, table, current.snapshot_id if current else None)

    def report(self, spark: SparkSession) -> None:
        print("\n== lineage of dws.item_revenue (upstream) ==")
        graph = self.client.lineage(REVENUE, direction="upstream")
        for edge in graph.edges:
            print(f"  {edge.source} -> {edge.target}")
        print("\n== frontiers and delays ==")
        for t in self.client.all_tables():
            print(
                f"  {t.name:18} writer {t.writer:20} frontier {t.frontier}  delay {self._lag(t.delay_ms)}"
                f"  latest snapshot {t.latest_snapshot}"
            )
        delay = self.client.delay(REVENUE)
        print(f"\n== critical path of {REVENUE} ({delay.delay_ms / 1000:.1f}s behind) ==")
        for lag in delay.critical_path:
            print(
                f"  {lag.job:20} waits on {lag.slowest_input or 'the wall clock':18} "
                f"contributes {lag.contribution_ms / 1000:.1f}s"
            )
        print("\n== final check ==")
        self.check(spark)
        try:
            version = self.client.consistent_version([DETAIL, REVENUE])
            lineage = self.client.snapshot_lineage(REVENUE, version.snapshots[REVENUE])  # type: ignore[arg-type]
            print(f"\n== data lineage of {REVENUE} snapshot {lineage.snapshot_id} ==")
            print(f"  made by {lineage.job} batch {lineage.batch_id} at barrier {lineage.barrier}")
            for rng in lineage.inputs:
                print(f"  consumed {rng.table} snapshots ({rng.from_snapshot}, {rng.to_snapshot}]")
        except (ConflictError, KeyError, TypeError):
            pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--warehouse", default="./demo-warehouse", help="folder for everything the run keeps"
    )
    parser.add_argument("--duration", type=float, default=60, help="seconds to run the pipeline")
    parser.add_argument("--orders-per-second", type=int, default=50)
    parser.add_argument("--barrier-interval-ms", type=int, default=1000)
    parser.add_argument(
        "--port", type=int, default=0, help="MetaService port (default: a free one)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A batch interrupted at shutdown is replayed on the next run; its trace is noise.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    Demo(args).run()


if __name__ == "__main__":
    main()
