"""Revise a table of the running demo pipeline, and its downstream, while a reader watches.

    python -m examples.revise_order_detail [--warehouse ./demo-revision] [--backlog 10]

The demo's pipeline runs (see `examples.warehouse_pipeline`). Then it turns out that
`dwd.order_detail` priced order lines without the 10 % discount the shop gives, since a
barrier BACKLOG seconds back. A revision re-derives `dwd.order_detail` from that
barrier with the corrected logic, and `dws.item_revenue` downstream with its code
unchanged, on mirror tables (metadata only, no data copied) while the original jobs go
on; once the mirrors have caught up, the swap makes them the tables in one step.

A reader samples the consistent version of orders, detail and revenue every 200 ms
throughout and classifies each sample: ``old`` (every line at list price), ``new``
(every order placed after the barrier discounted) or ``mixed``, and checks it against
the pipeline's invariant (revenue per item is the sum of the live orders' amounts).
The run prints what the reader saw and how long the revision took to catch up, and
exits with status 1 if a sample was mixed or wrong, or a reader went back from new to
old.
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import spark_barrier
from examples import warehouse_pipeline as wp
from examples.embedded import EmbeddedMetaService
from metaservice.client import ConflictError, MetaServiceClient
from metaservice.settings import Settings
from spark_barrier.iceberg.catalog import load_catalog

DISCOUNT = Decimal("0.9")  # the corrected logic: order lines cost 10 % less
SAMPLE_EVERY_S = 0.2
TABLES = [wp.ORDERS, wp.DETAIL, wp.REVENUE]
CENT = Decimal("0.01")


def discounted_amount(quantity: Column, price: Column) -> Column:
    """The revision's corrected logic for the detail table."""
    return (quantity * price * F.lit(DISCOUNT)).cast(wp.MONEY_SQL)


def line_kind(row: dict[str, Any]) -> str:
    """``old`` if a detail row is at list price, ``new`` if discounted, else ``wrong``
    (Spark's cast to a decimal rounds half up). A line whose item had no price yet at
    its barrier has no amount either, before and after the revision: ``unpriced``."""
    if row["price"] is None:
        return "unpriced" if row["amount"] is None else "wrong"
    listed = row["quantity"] * row["price"]
    if row["amount"] == listed.quantize(CENT, ROUND_HALF_UP):
        return "old"
    if row["amount"] == (listed * DISCOUNT).quantize(CENT, ROUND_HALF_UP):
        return "new"
    return "wrong"


@dataclass
class Sample:
    barrier: int
    kind: str  # old, new, mixed, wrong (the invariant fails), incomplete (no version yet)
    note: str = ""


class Reader(threading.Thread):
    """Samples the consistent version of orders, detail and revenue every 200 ms,
    reading the tables by name with pyiceberg, as any reader of the catalog would."""

    def __init__(self, client: MetaServiceClient, catalog: Catalog) -> None:
        super().__init__(daemon=True, name="revision-reader")
        self.client = client
        self.catalog = catalog
        self.placed_after: int | None = None  # order ids above it came after the barrier
        self.samples: list[Sample] = []
        self.errors: list[str] = []  # reads that raced the swap's renaming (retried)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_EVERY_S):
            try:
                self.samples.append(self.sample())
            except ConflictError:
                continue
            except Exception as exc:  # kept for the caller to count; the next sample retries
                self.errors.append(repr(exc)[:300])

    def rows(self, table: str, snapshot: int | None) -> list[dict[str, Any]]:
        if snapshot is None:
            return []
        scan = self.catalog.load_table(table).scan(snapshot_id=snapshot)
        return scan.to_arrow().to_pylist()  # type: ignore[no-any-return]

    def sample(self) -> Sample:
        version = self.client.consistent_version(TABLES)
        rows = {t: self.rows(t, version.snapshots[t]) for t in TABLES}
        return classify(version.barrier, rows, self.placed_after)


def classify(
    barrier: int, rows: dict[str, list[dict[str, Any]]], placed_after: int | None
) -> Sample:
    """One sample against the invariant, then old (all at list price) or new (every
    order placed after the revision's barrier discounted)."""
    found = wp.check_rows(rows[wp.ORDERS], rows[wp.DETAIL], rows[wp.REVENUE])
    if not found.ok:
        return Sample(barrier, "wrong", found.describe())
    lines = {row["order_id"]: line_kind(row) for row in rows[wp.DETAIL]}
    kinds = Counter(lines.values())
    if kinds["wrong"]:
        return Sample(barrier, "wrong", f"{kinds['wrong']} lines at neither price")
    if not kinds["new"]:
        return Sample(barrier, "old")
    late = [k for order, k in lines.items() if placed_after is not None and order > placed_after]
    if "old" in late:
        return Sample(barrier, "mixed", f"{late.count('old')} late orders at list price")
    return Sample(barrier, "new")


@dataclass
class Outcome:
    """What a revision run saw (see `revise`)."""

    revision_id: int = 0
    from_barrier: int = 0
    backlog_ms: int = 0  # the original detail's frontier minus from_barrier at the start
    catch_up_s: float = 0.0  # revision jobs started -> the revision was ready
    ready_at_ms: int = 0  # when it was ready (epoch ms)
    swap_s: float = 0.0  # swap asked -> swapped
    samples: list[Sample] = field(default_factory=list)
    read_errors: list[str] = field(default_factory=list)
    final: Sample | None = None
    final_barrier_after_swap_ms: int = 0  # how far the pipeline went on after the swap

    @property
    def kinds(self) -> Counter[str]:
        return Counter(s.kind for s in self.samples)

    @property
    def went_back(self) -> bool:
        kinds = [s.kind for s in self.samples]
        return "new" in kinds and "old" in kinds[kinds.index("new") :]

    @property
    def ok(self) -> bool:
        kinds = self.kinds
        return (
            not (kinds["mixed"] or kinds["wrong"] or self.went_back)
            and self.final is not None
            and self.final.kind == "new"
        )

    def describe(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        return (
            f"revision from barrier {self.from_barrier} with a backlog of "
            f"{self.backlog_ms / 1000:.1f}s caught up in {self.catch_up_s:.1f}s "
            f"(ratio {self.catch_up_s * 1000 / max(self.backlog_ms, 1):.2f}); swap took "
            f"{self.swap_s:.1f}s\nreader samples: {kinds}; read errors racing the swap: "
            f"{len(self.read_errors)}; went back to old: {self.went_back}\nfinal: "
            f"{self.final.kind if self.final else 'none'}, pipeline went on "
            f"{self.final_barrier_after_swap_ms / 1000:.1f}s past the swap"
        )


class Run:
    """The demo pipeline in one Spark driver, against a MetaService at ``url``."""

    def __init__(
        self,
        spark: SparkSession,
        url: str,
        *,
        catalog_properties: dict[str, str],
        state_dir: Path,
        orders_per_second: int = 20,
        say: Callable[[str], None] = print,
    ) -> None:
        self.spark = spark
        self.client = MetaServiceClient(url)
        self.catalog = load_catalog(catalog_properties)
        self.register = wp.registrar(
            spark, url, catalog_properties=catalog_properties, state_dir=state_dir
        )
        self.say = say
        self.pipeline = wp.build(spark, self.register, orders_per_second=orders_per_second)
        self.queries: dict[str, StreamingQuery] = {}

    def start(self, pipeline: wp.Pipeline, *names: str) -> None:
        for name in names or pipeline.launchers:
            self.queries[name] = pipeline.start(name)

    def wait(self, what: str, until: Callable[[], bool], timeout_s: float) -> float:
        """Wait for ``until`` while every query runs; the seconds it took."""
        started = time.monotonic()
        while not until():
            for name, query in self.queries.items():
                if not query.isActive:
                    raise RuntimeError(f"query {name} stopped: {query.exception()}")
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"no {what} after {timeout_s:.0f}s")
            time.sleep(0.5)
        return time.monotonic() - started

    def frontier(self, job: str) -> int:
        return self.client.get_job(job).frontier or 0

    def stop(self) -> None:
        for query in self.queries.values():
            if query.isActive:
                spark_barrier.stop_between_batches(query)
        self.pipeline.close()


def revise(run: Run, *, warm_up_s: float, backlog_s: float, after_s: float) -> Outcome:
    """Run the pipeline, revise the detail from the barrier ``backlog_s`` back, swap,
    and go on ``after_s``; the reader samples throughout (see the module doc)."""
    out = Outcome()
    run.start(run.pipeline)
    reader = Reader(run.client, run.catalog)
    try:
        revenue_written = lambda: bool(run.frontier("aggregate_revenue"))  # noqa: E731
        run.wait("revenue committed", revenue_written, 180)
        time.sleep(warm_up_s)
        start = run.client.consistent_version(TABLES)
        out.from_barrier = start.barrier
        orders = reader.rows(wp.ORDERS, start.snapshots[wp.ORDERS])
        reader.placed_after = max((r["order_id"] for r in orders), default=-1)
        run.say(
            f"the revision will start at barrier {start.barrier}; running {backlog_s:.0f}s more"
        )
        time.sleep(backlog_s)
        # On a loaded machine the detail's job may not have committed past the start in
        # that time: the revision has a backlog to catch up only once it has.
        backlog = lambda: run.frontier("build_order_detail") > start.barrier  # noqa: E731
        run.wait("commit of the detail's job past the revision's start", backlog, 180)

        reader.start()
        revision = run.client.create_revision(wp.DETAIL, out.from_barrier)
        out.revision_id = revision.id
        out.backlog_ms = run.frontier("build_order_detail") - out.from_barrier
        run.say(
            f"revision {revision.id} of {wp.DETAIL} from barrier {out.from_barrier} "
            f"({out.backlog_ms / 1000:.1f}s of history): mirrors "
            + ", ".join(m.mirror for m in revision.tables)
        )
        revised_register = functools.partial(run.register, revision=revision.id)
        revised = wp.build_derived(revised_register, amount=discounted_amount)
        run.pipeline.jobs |= {f"{n} (revision)": job for n, job in revised.jobs.items()}
        for name in revised.launchers:
            run.queries[f"{name} (revision)"] = revised.start(name)
        ready = lambda: run.client.get_revision(revision.id).state == "ready"  # noqa: E731
        started = time.monotonic()
        run.wait("revision ready", ready, 300)
        out.catch_up_s = time.monotonic() - started
        out.ready_at_ms = int(time.time() * 1000)
        run.say(f"the mirrors caught up in {out.catch_up_s:.1f}s; swapping")

        asked = time.monotonic()
        _swap_once_ready(run, revision.id, ready)
        out.swap_s = time.monotonic() - asked
        swap_barrier = run.client.consistent_version(TABLES).barrier
        _restart_after_swap(run, revised, revised_register)
        run.say(f"swapped in {out.swap_s:.1f}s; the revision's jobs now write the tables")

        time.sleep(after_s)
        target = run.frontier("ingest_orders")
        caught = lambda: run.frontier(f"aggregate_revenue__rev{revision.id}") >= target  # noqa: E731
        run.wait("the revised pipeline to go on", caught, 180)
    finally:
        reader.done.set()
        run.stop()
    reader.join(10)
    out.samples, out.read_errors = reader.samples, reader.errors
    end = run.client.consistent_version(TABLES)
    out.final = reader.sample()
    out.final_barrier_after_swap_ms = end.barrier - swap_barrier
    return out


def _swap_once_ready(run: Run, revision_id: int, ready: Callable[[], bool]) -> None:
    """Swap; a revision that fell behind again since it was ready (its jobs share the
    machine with the originals) is 409 not_ready and nothing changed: wait and retry."""
    deadline = time.monotonic() + 300
    while True:
        try:
            swapped = run.client.swap_revision(revision_id, wait_seconds=120)
        except ConflictError as exc:
            if exc.code != "not_ready" or time.monotonic() > deadline:
                raise
            run.say("the revision fell behind again; waiting until it is ready")
            run.wait("revision ready", ready, 300)
            continue
        if swapped.state != "swapped":
            raise RuntimeError(f"revision {revision_id} is {swapped.state} after 120s")
        return


def _restart_after_swap(run: Run, revised: wp.Pipeline, register: Callable[..., Any]) -> None:
    """The originals stop (superseded); the revision's queries named the mirrors, now
    renamed, so they stop too at their next batch and start again under the same
    registration (see the user guide, "Revision")."""
    stopping = ["build_order_detail", "aggregate_revenue"]
    stopping += [f"{name} (revision)" for name in revised.launchers]
    deadline = time.monotonic() + 120
    while any(run.queries[n].isActive for n in stopping) and time.monotonic() < deadline:
        time.sleep(0.5)
    for name in stopping:
        query = run.queries.pop(name)
        if query.isActive:
            raise RuntimeError(f"query {name} still runs 120s after the swap")
    revised.close()
    again = wp.build_derived(register, amount=discounted_amount)
    run.pipeline.jobs |= {f"{n} (revision)": job for n, job in again.jobs.items()}
    for name in again.launchers:
        run.queries[f"{name} (revision)"] = again.start(name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warehouse", default="./demo-revision", help="folder for everything")
    parser.add_argument("--warm-up", type=float, default=15, help="seconds the pipeline runs first")
    parser.add_argument(
        "--backlog", type=float, default=10, help="how far back the revision starts, in seconds"
    )
    parser.add_argument("--after", type=float, default=10, help="seconds to run after the swap")
    parser.add_argument("--orders-per-second", type=int, default=20)
    args = parser.parse_args(argv)
    sys.exit(0 if run_standalone(args).ok else 1)


def run_standalone(args: argparse.Namespace) -> Outcome:
    """On an embedded MetaService (SQLite, also the Iceberg catalog) and local Spark."""
    root = Path(args.warehouse).resolve()
    root.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{root / 'metaservice.db'}"
    tables = str(root / "tables")
    settings = Settings(db_url=db_url, warehouse=tables, port=0)
    print(f"everything is kept under {root}")
    with EmbeddedMetaService(settings) as url:
        spark = spark_barrier.local_spark_builder("revise-order-detail").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        run = Run(
            spark,
            url,
            catalog_properties={"type": "sql", "uri": db_url, "warehouse": tables},
            state_dir=root / "state",
            orders_per_second=args.orders_per_second,
        )
        outcome = revise(run, warm_up_s=args.warm_up, backlog_s=args.backlog, after_s=args.after)
        spark.stop()
    print(outcome.describe())
    print("OK" if outcome.ok else "FAILED: a reader saw a mixed or wrong version")
    return outcome


if __name__ == "__main__":
    main()
