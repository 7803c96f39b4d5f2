"""A streaming warehouse on barrier-aligned Spark jobs, on its own embedded defaults.

    python -m examples.streaming_warehouse [--warehouse ./demo-warehouse] [--duration 60]
                                           [--master spark://host:7077]
                                           [--tables s3://bucket/wh --catalog-property s3.endpoint=...]

Four streaming queries in one Spark driver, coordinated by an embedded MetaService
(see `examples.warehouse_pipeline` for the story):

    ingest_orders  (order CDC: place, ship, cancel) -> ods.orders   (partitioned by day)
    ingest_items   (price CDC)                      -> ods.items    (partitioned by day)
    build_order_detail  ods.orders changelog + ods.items as of the barrier -> dwd.order_detail
    aggregate_revenue   dwd.order_detail changelog                          -> dws.item_revenue

While it runs it shows a live status (per table its delay and its writer's last batch,
and the age of the consistent version; redrawn in place on a terminal, a line every
5 s when piped; Spark's own log lines are kept to errors) and, every 15 s, checks at the consistent
version of all four tables that revenue per item equals the sum of the amounts of the
live orders, that order counts match and that the detail holds exactly the live orders
(always true), and the same on the latest snapshots (often not). It ends with a
summary of those checks, and exits with status 1 if a check at a consistent version
failed (2 if it never found a consistent version to check).

The embedded MetaService expires the tables' snapshots older than five minutes every
minute (`--expire-every`, `--keep-history`): at one snapshot a second, a table whose
history only grows pays for all of it at every commit, and the demo would slowly fall
behind. Expiry keeps every snapshot a check or a job still reads (leases, the jobs'
next batches).

`kill -USR1 <pid>` makes a running demo print every Python thread's stack to stderr (a
query that stalls shows where it waits); `jstack` does the same for its JVM.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from rich.live import Live
from rich.table import Table

import spark_barrier
from examples import warehouse_pipeline as wp
from examples.embedded import EmbeddedMetaService
from metaservice.client import ConflictError, MetaServiceClient
from metaservice.iceberg_rest.cli import Engine, attach_lines
from metaservice.settings import Settings
from spark_barrier.iceberg.catalog import load_catalog
from spark_barrier.iceberg.read import read_snapshot

CHECK_EVERY_S = 15.0
EXPIRE_EVERY_S = 60.0
KEEP_HISTORY_S = 300
MIN_CHECKS_GRACE_S = 300.0


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.root = Path(args.warehouse).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.db_url = f"sqlite:///{self.root / 'metaservice.db'}"
        self.tables = args.tables or str(self.root / "tables")
        self.state_dir = self.root / "state"
        self.duration = args.duration
        self.rate = args.orders_per_second
        self.master = args.master
        self.check_every = args.check_every
        self.min_checks = args.min_checks
        self.consistent_checks: list[bool] = []  # outcome of each check at a consistent version
        self.checks_with_data = 0  # of those, the ones whose tables held revenue
        # The catalog: a SQL catalog in the MetaService's database, tables under
        # --tables (a folder or s3://), plus whatever --catalog-property says.
        self.catalog_properties = {
            "type": "sql",
            "uri": self.db_url,
            "warehouse": self.tables,
            **dict(p.split("=", 1) for p in args.catalog_property),
        }
        self.settings = Settings(
            db_url=self.db_url,
            warehouse=self.tables,
            barrier_interval_ms=args.barrier_interval_ms,
            port=args.port,
            # Expiry opens the tables' catalog as the jobs do (an object store's
            # endpoint and credentials are among its properties).
            catalog_properties=self.catalog_properties,
            expire_every_seconds=args.expire_every,
            retention_keep_for_seconds=args.keep_history,
        )

    def run(self) -> int:
        """Run the pipeline for the duration; the exit status (see the module docstring)."""
        print(f"everything is kept under {self.root}")
        print(f"  MetaService database and Iceberg catalog: {self.db_url}")
        print(f"  Iceberg tables: {self.tables}")
        print(f"  Spark checkpoints and report outboxes: {self.state_dir}")
        with EmbeddedMetaService(self.settings) as url:
            print(f"MetaService running at {url}: web console {url}/ui, API docs {url}/docs")
            builder = spark_barrier.local_spark_builder(
                "streaming-warehouse", master=self.master, quiet=True
            )
            spark = builder.getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            print(f"Spark master: {spark.sparkContext.master}")
            self.client = MetaServiceClient(url)
            self.catalog = load_catalog(self.catalog_properties)
            register = wp.registrar(
                spark, url, catalog_properties=self.catalog_properties, state_dir=self.state_dir
            )
            self.pipeline = wp.build(spark, register, orders_per_second=self.rate)
            self.queries = {name: self.pipeline.start(name) for name in self.pipeline.launchers}
            print(f"started {len(self.queries)} streaming queries: {', '.join(self.queries)}")
            try:
                self.watch(spark)
            finally:
                print("stopping the streaming queries between batches ...")
                for q in self.queries.values():
                    spark_barrier.stop_between_batches(q)
                self.pipeline.close()
            self.report(spark)
            self.read_with_duckdb(url)
            spark.stop()
        print(
            f"\nthe run is kept in {self.root}; to query it later:\n"
            f"  metaservice start --db {self.db_url}\n"
            f"  metaservice lineage {wp.REVENUE}"
        )
        return self.summary()

    def summary(self) -> int:
        checks = self.consistent_checks
        failed = checks.count(False)
        print(f"\nchecks at consistent versions: {len(checks)}, failed: {failed}")
        if failed:
            return 1
        return 0 if checks else 2

    def supervise(self) -> None:
        for name, query in list(self.queries.items()):
            if not query.isActive:
                error = query.exception()
                first_line = str(error).splitlines()[0] if error else "stopped"
                print(
                    f"  query {name} failed ({first_line[:160]}); restarting it from its checkpoint"
                )
                self.queries[name] = self.pipeline.start(name)

    def watch(self, spark: SparkSession) -> None:
        start = time.monotonic()
        next_check = start + self.check_every
        with StatusBoard(self.client, live=sys.stdout.isatty()) as board:
            while self._keep_running(elapsed := time.monotonic() - start):
                time.sleep(board.every_s)
                self.supervise()
                board.update(elapsed)
                if time.monotonic() >= next_check:
                    self.check(spark)
                    next_check = time.monotonic() + self.check_every

    def _keep_running(self, elapsed: float) -> bool:
        """Until the duration is over and, with --min-checks, until that many checks at
        consistent versions with data were made (a slow machine takes longer), but
        never longer than MIN_CHECKS_GRACE_S after the duration."""
        if elapsed < self.duration:
            return True
        missing = self.checks_with_data < self.min_checks
        return missing and elapsed < self.duration + MIN_CHECKS_GRACE_S

    @staticmethod
    def _lag(delay_ms: int | None) -> str:
        return lag(delay_ms)

    def check(self, spark: SparkSession) -> None:
        started = time.monotonic()
        try:
            read = spark_barrier.read_consistent(spark, self.client, self.catalog, wp.ALL_TABLES)
        except ConflictError:
            print("  consistent version: none yet (the jobs have not committed a common barrier)")
            return
        found = wp.check({name: read[name] for name in wp.ALL_TABLES})
        self.consistent_checks.append(found.ok)
        if found.items:
            self.checks_with_data += 1
        age = (time.time() * 1000 - read.version.barrier) / 1000
        print(
            f"  consistent version at barrier {read.version.barrier} ({age:.1f}s old): "
            f"{found.describe()}"
        )
        latest = wp.check({name: self._latest(spark, name) for name in wp.ALL_TABLES})
        print(
            f"  latest snapshots (no coordination): {latest.describe()}"
            + ("" if latest.ok else " - expected, they are not a consistent set")
        )
        print(f"  (both checks took {time.monotonic() - started:.1f}s)", flush=True)

    def _latest(self, spark: SparkSession, name: str) -> DataFrame:
        table = self.catalog.load_table(name)
        current = table.current_snapshot()
        return read_snapshot(spark, table, current.snapshot_id if current else None)

    def report(self, spark: SparkSession) -> None:
        print(f"\n== lineage of {wp.REVENUE} (upstream) ==")
        graph = self.client.lineage(wp.REVENUE, direction="upstream")
        for edge in graph.edges:
            print(f"  {edge.source} -> {edge.target}")
        print("\n== frontiers and delays ==")
        for t in self.client.all_tables():
            print(
                f"  {t.name:18} writer {t.writer:20} frontier {t.frontier}  delay {self._lag(t.delay_ms)}"
                f"  latest snapshot {t.latest_snapshot}"
            )
        delay = self.client.delay(wp.REVENUE)
        print(f"\n== critical path of {wp.REVENUE} ({self._lag(delay.delay_ms)} behind) ==")
        for step in delay.critical_path:
            print(
                f"  {step.job:20} waits on {step.slowest_input or 'the wall clock':18} "
                f"contributes {self._lag(step.contribution_ms)}"
            )
        print("\n== final check ==")
        self.check(spark)
        try:
            version = self.client.consistent_version([wp.DETAIL, wp.REVENUE])
            snapshot = version.snapshots[wp.REVENUE]
            if snapshot is None:
                return
            lineage = self.client.snapshot_lineage(wp.REVENUE, snapshot)
            print(f"\n== data lineage of {wp.REVENUE} snapshot {lineage.snapshot_id} ==")
            print(f"  made by {lineage.job} batch {lineage.batch_id} at barrier {lineage.barrier}")
            for rng in lineage.inputs:
                print(f"  consumed {rng.table} snapshots ({rng.from_snapshot}, {rng.to_snapshot}]")
        except ConflictError:
            pass

    def read_with_duckdb(self, url: str) -> None:
        """Any engine reads the tables at one consistent version through the MetaService's
        Iceberg REST catalog: DuckDB's lines, and the demo's check as one SQL query."""
        print(f"\n== any engine: DuckDB through the Iceberg REST catalog at {url}/iceberg ==")
        for line in attach_lines(Engine.duckdb, url, "consistent", auth=False):
            print(f"  {line}")
        print("  (metaservice catalog prints the lines for pyiceberg, ClickHouse, Spark, Trino)")
        try:
            import duckdb
            import duckdb_extensions
        except ImportError:
            print("  DuckDB is not installed here (pip install duckdb duckdb-extension-iceberg)")
            return
        con = duckdb.connect()
        try:
            for name in ("httpfs", "avro", "iceberg"):
                duckdb_extensions.import_extension(name, con)
            con.execute(
                f"ATTACH 'consistent' AS ms (TYPE iceberg, ENDPOINT '{url}/iceberg', "
                "AUTHORIZATION_TYPE 'none')"
            )
            items, wrong = con.execute(DUCKDB_CHECK).fetchone() or (0, 0)
        except duckdb.Error as exc:  # the demo's own checks above stand; say what failed
            print(f"  DuckDB could not read the tables through the catalog: {exc}")
            return
        print(
            f"  revenue per item == sum of the detail's amounts, read by DuckDB at the "
            f"consistent version: {items - wrong} of {items} items agree"
            + ("" if wrong == 0 else f" ({wrong} do NOT)")
        )


# The demo's check of dws.item_revenue against dwd.order_detail, in DuckDB's SQL.
DUCKDB_CHECK = f"""
SELECT count(*), count(*) FILTER (WHERE coalesce(d.total, 0) <> coalesce(r.revenue, 0))
FROM (SELECT item_id, sum(amount) AS total FROM ms.{wp.DETAIL} GROUP BY item_id) d
FULL JOIN ms.{wp.REVENUE} r USING (item_id)
"""


def lag(delay_ms: int | None) -> str:
    if delay_ms is None or delay_ms > 10**9:
        return "(no data yet)"
    return f"{delay_ms / 1000:.1f}s"


class StatusBoard:
    """What the pipeline is doing: per table its delay (now minus its frontier) and its
    writer's last batch, and how old the consistent version of all four tables is. On a
    terminal one block redrawn in place every second (lines printed meanwhile, the
    checks', appear above it); piped, one line every five seconds."""

    def __init__(self, client: MetaServiceClient, *, live: bool) -> None:
        self.client = client
        self.live = Live(refresh_per_second=4, redirect_stdout=True) if live else None
        self.every_s = 1.0 if live else 5.0

    def __enter__(self) -> StatusBoard:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self, elapsed: float) -> None:
        tables = {t.name: t for t in self.client.all_tables()}
        jobs = {j.name: j for j in self.client.all_jobs()}
        try:
            barrier = self.client.consistent_version(wp.ALL_TABLES).barrier
            version = f"{(time.time() * 1000 - barrier) / 1000:.1f}s old"
        except ConflictError:
            version = "none yet"
        rows = []
        for name in wp.ALL_TABLES:
            table = tables[name]
            writer = jobs.get(table.writer or "")
            batch = writer.last_batch_id if writer is not None else None
            rows.append((name, lag(table.delay_ms), "-" if batch is None else str(batch)))
        if self.live is None:
            cells = "  ".join(f"{n} {d} (batch {b})" for n, d, b in rows)
            print(f"[{elapsed:5.0f}s] consistent version {version}; delay: {cells}", flush=True)
            return
        board = Table(title=f"{elapsed:.0f}s: consistent version of all four tables {version}")
        for column in ("table", "delay", "last batch"):
            board.add_column(column, justify="left" if column == "table" else "right")
        for row in rows:
            board.add_row(*row)
        self.live.update(board)


def main(argv: list[str] | None = None) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--warehouse",
        default="./demo-warehouse",
        help="local folder for the MetaService database, checkpoints and (by default) the tables",
    )
    parser.add_argument(
        "--tables", default=None, help="where the tables live: a folder or s3://bucket/path"
    )
    parser.add_argument(
        "--catalog-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a pyiceberg catalog property, e.g. s3.endpoint=http://127.0.0.1:9000 (repeatable)",
    )
    parser.add_argument(
        "--master", default="local[2]", help="Spark master, e.g. spark://127.0.0.1:7077"
    )
    parser.add_argument("--duration", type=float, default=60, help="seconds to run the pipeline")
    parser.add_argument(
        "--check-every",
        type=float,
        default=CHECK_EVERY_S,
        help="seconds between checks of the consistent version (default %(default)s)",
    )
    parser.add_argument(
        "--min-checks",
        type=int,
        default=0,
        help="keep running after --duration until this many checks at consistent versions "
        "with data (items with revenue) were made "
        f"(at most {MIN_CHECKS_GRACE_S:.0f} s more; default %(default)s)",
    )
    parser.add_argument(
        "--expire-every",
        type=float,
        default=EXPIRE_EVERY_S,
        metavar="SECONDS",
        help="expire the tables' unused snapshots this often (0: never; default %(default)s)",
    )
    parser.add_argument(
        "--keep-history",
        type=int,
        default=KEEP_HISTORY_S,
        metavar="SECONDS",
        help="snapshots younger than this are kept by expiry (default %(default)s)",
    )
    parser.add_argument("--orders-per-second", type=int, default=50)
    parser.add_argument("--barrier-interval-ms", type=int, default=1000)
    parser.add_argument(
        "--port", type=int, default=0, help="MetaService port (default: a free one)"
    )
    args = parser.parse_args(argv)
    bad = [p for p in args.catalog_property if "=" not in p]
    if bad:
        parser.error(f"--catalog-property takes KEY=VALUE, not {bad[0]!r}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A batch interrupted at shutdown is replayed on the next run; its trace is noise.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    sys.exit(Demo(args).run())


if __name__ == "__main__":
    main()
