"""Benchmark the Spark side: barrier-hook overhead per batch, and freshness of the demo.

1. **Hook overhead.** For batches of 10k and 1M rows, the time of one barrier-sink batch
   (``BarrierSink.__call__`` of a registered source job, called directly with increasing
   batch ids against an embedded MetaService over loopback HTTP: batch barrier request,
   catalog load, ``find_batch_snapshot``, ``commit_batch`` (append), report appended
   durably to the outbox) against a plain ``df.write.mode("append").parquet(folder)``
   of the same cached DataFrame in the same SparkSession (``local_spark_builder``).
   Plain and hook runs alternate (their order flips every repetition), one warm-up
   of each is discarded, medians are reported. The hook run is broken down by timing
   wrappers installed around the spark_barrier / pyiceberg / pyspark functions it calls
   (the library code itself is unchanged).
2. **Freshness of the demo.** The pipeline of ``examples.streaming_warehouse`` (its
   ``Demo`` class: four streaming queries, embedded MetaService, 1 s barrier interval)
   runs in this process; every second ``now_ms - consistent_version([dwd.order_detail,
   dws.item_revenue]).barrier`` is sampled through the MetaService client. The first
   ``--warmup-seconds`` (default 20) are excluded from the percentiles.

Usage: python bench/bench_spark.py [--out bench/results/spark.json] [--quick]
                                    [--freshness-seconds 90]

Everything runs on loopback, in temporary folders that are removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import pyiceberg
import pyspark
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table
from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
from pyspark.sql import functions as F

import spark_barrier
import spark_barrier.iceberg.catalog as iceberg_catalog
import spark_barrier.iceberg.commit as iceberg_commit
import spark_barrier.job as job_module
from bench.common import host_facts, loadavg
from examples import streaming_warehouse as demo_module
from examples.embedded import EmbeddedMetaService
from metaservice.client import ConflictError, MetaServiceClient
from metaservice.settings import Settings

CONSISTENT_TABLES = [demo_module.DETAIL, demo_module.REVENUE]


# --------------------------------------------------------------------------- machine


def machine_facts() -> dict[str, Any]:
    return {
        **host_facts(),
        "pyspark": pyspark.__version__,
        "pyiceberg": pyiceberg.__version__,
        "spark_master": "local[2] (local_spark_builder)",
    }


# --------------------------------------------------------------------------- timing wrappers


class Probe:
    """Accumulates wall time per named step for the batch being measured."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: dict[str, float] = defaultdict(float)
        self.enabled = False

    def reset(self) -> None:
        with self._lock:
            self.current = defaultdict(float)

    def add(self, key: str, seconds: float) -> None:
        if self.enabled:
            with self._lock:
                self.current[key] += seconds

    def wrap(self, key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(key, time.perf_counter() - start)

        return timed


PROBE = Probe()


@contextlib.contextmanager
def patched(target: Any, name: str, key: str) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, PROBE.wrap(key, original))
    try:
        yield
    finally:
        setattr(target, name, original)


@contextlib.contextmanager
def instrumented(job: spark_barrier.BarrierJob) -> Iterator[None]:
    """Timing wrappers around every step of BarrierSink.__call__ (library code unchanged)."""
    targets = [
        (job.client, "batch_barrier", "barrier_request"),
        (job, "table", "catalog_load_table"),
        (job_module, "find_batch_snapshot", "find_batch_snapshot"),
        (job_module, "commit_batch", "commit_batch"),
        (job.reporter, "report", "report_outbox_append"),
        # inside commit_batch
        (Table, "refresh", "commit.table_refresh"),
        (iceberg_commit, "find_batch_snapshot", "commit.find_batch_snapshot"),
        (iceberg_commit, "write_data_files", "commit.write_data_files"),
        (DataFrameWriter, "parquet", "commit.write.spark_parquet_write"),
        (iceberg_commit, "commit_files", "commit.pyiceberg_commit"),
        (SqlCatalog, "commit_table", "commit.pyiceberg_commit.catalog_commit_table"),
    ]
    with contextlib.ExitStack() as stack:
        for target, name, key in targets:
            stack.enter_context(patched(target, name, key))
        yield


# --------------------------------------------------------------------------- part 1


def batch_frame(spark: SparkSession, rows: int) -> DataFrame:
    """Deterministic, typed rows (long, int, decimal, timestamp, string), cached."""
    df = spark.range(rows).select(
        F.col("id").alias("order_id"),
        (F.col("id") % 1000).alias("item_id"),
        ((F.col("id") % 5) + 1).cast("int").alias("quantity"),
        ((F.col("id") * 37 % 40000) / 100).cast("decimal(18,2)").alias("amount"),
        F.timestamp_seconds(F.lit(1_767_225_600) + F.col("id") % 86400).alias("ordered_at"),
        F.concat(F.lit("order-"), F.col("id").cast("string")).alias("note"),
    )
    df = df.cache()
    df.count()
    return df


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2)


def measure_overhead(
    spark: SparkSession,
    root: Path,
    sizes: list[int],
    reps: dict[int, int],
) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{root / 'metaservice.db'}"
    tables_dir = root / "tables"
    settings = Settings(db_url=db_url, warehouse=str(tables_dir), barrier_interval_ms=1000)
    results: dict[str, Any] = {}
    with EmbeddedMetaService(settings) as url:
        for rows in sizes:
            df = batch_frame(spark, rows)
            table = f"bench.batch_{rows}"
            job = spark_barrier.register(
                spark,
                url,
                job=f"bench_source_{rows}",
                outputs={table: df.schema},
                catalog_uri=db_url,
                warehouse=str(tables_dir),
                state_dir=root / "state",
                outbox=True,
            )
            sink = job.sink(table)
            plain_folder = str(root / "plain" / f"rows_{rows}")
            plain: list[float] = []
            hooks: list[float] = []
            steps: list[dict[str, float]] = []
            loads: list[float] = []
            batch_id = 0
            n = reps[rows]
            print(f"  {rows:>9,} rows: 1 warm-up + {n} repetitions of plain and hooks", flush=True)
            with instrumented(job):
                for rep in range(n + 1):
                    order = ("plain", "hooks") if rep % 2 == 0 else ("hooks", "plain")
                    for kind in order:
                        if kind == "plain":
                            start = time.perf_counter()
                            df.write.mode("append").parquet(plain_folder)
                            elapsed = time.perf_counter() - start
                            if rep:
                                plain.append(elapsed)
                        else:
                            PROBE.reset()
                            PROBE.enabled = True
                            start = time.perf_counter()
                            sink(df, batch_id)
                            elapsed = time.perf_counter() - start
                            PROBE.enabled = False
                            batch_id += 1
                            if rep:
                                hooks.append(elapsed)
                                step = dict(PROBE.current)
                                step["total"] = elapsed
                                steps.append(step)
                    if rep:
                        loads.append(os.getloadavg()[0])
            job.close()
            df.unpersist()
            results[str(rows)] = summarize_overhead(rows, plain, hooks, steps, loads)
            snapshots = len(job.catalog.load_table(table).snapshots())
            results[str(rows)]["snapshots_in_table_at_end"] = snapshots
    return results


def summarize_overhead(
    rows: int,
    plain: list[float],
    hooks: list[float],
    steps: list[dict[str, float]],
    loads: list[float],
) -> dict[str, Any]:
    keys = sorted({k for s in steps for k in s})
    step_median = {k: median_ms([s.get(k, 0.0) for s in steps]) for k in keys}
    # Derived steps, per batch, then their median.
    derived: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        g = s.get
        spark_write = g("commit.write.spark_parquet_write", 0.0)
        derived["commit.pyiceberg_commit.manifests_and_metadata"].append(
            g("commit.pyiceberg_commit", 0.0)
            - g("commit.pyiceberg_commit.catalog_commit_table", 0.0)
        )
        derived["hooks_minus_spark_parquet_write"].append(s["total"] - spark_write)
        accounted = (
            g("barrier_request", 0.0)
            + g("catalog_load_table", 0.0)
            + g("find_batch_snapshot", 0.0)
            + g("commit_batch", 0.0)
            + g("report_outbox_append", 0.0)
        )
        derived["unaccounted"].append(s["total"] - accounted)
    for k, v in derived.items():
        step_median[k] = median_ms(v)
    plain_ms, hooks_ms = median_ms(plain), median_ms(hooks)
    # Paired ratios (each hook run against the plain run next to it) are less sensitive
    # to load drift than the ratio of medians; both are reported.
    paired = [h / p for h, p in zip(hooks, plain, strict=True)]
    return {
        "rows": rows,
        "repetitions": len(plain),
        "plain_median_ms": plain_ms,
        "hooks_median_ms": hooks_ms,
        "ratio_hooks_over_plain": round(hooks_ms / plain_ms, 3),
        "overhead_pct": round((hooks_ms / plain_ms - 1) * 100, 1),
        "paired_ratio_median": round(statistics.median(paired), 3),
        "overhead_median_ms": round(hooks_ms - plain_ms, 2),
        "plain_ms": [round(x * 1000, 1) for x in plain],
        "hooks_ms": [round(x * 1000, 1) for x in hooks],
        "steps_median_ms": step_median,
        "loadavg_1m_during": {
            "min": round(min(loads), 2),
            "median": round(statistics.median(loads), 2),
            "max": round(max(loads), 2),
        },
    }


# --------------------------------------------------------------------------- part 2


def measure_freshness(spark: SparkSession, root: Path, seconds: int, warmup: int) -> dict[str, Any]:
    args = argparse.Namespace(
        warehouse=str(root / "demo"),
        duration=seconds + warmup,
        orders_per_second=50,
        barrier_interval_ms=1000,
        port=0,
    )
    demo = demo_module.Demo(args)
    samples: list[dict[str, Any]] = []
    restarts = 0
    failures: dict[str, int] = defaultdict(int)
    import_s = worker_import_seconds()
    print(
        f"    a fresh interpreter imports the streaming-source runner in {import_s:.1f} s",
        flush=True,
    )
    with EmbeddedMetaService(demo.settings) as url:
        demo.client = MetaServiceClient(url)
        demo.catalog = iceberg_catalog.open_catalog(demo.db_url, str(demo.tables_dir))
        started = time.monotonic()
        jobs, _ = demo.start_jobs(spark, url)
        start_jobs_s = time.monotonic() - started
        try:
            t0 = time.monotonic()
            total = warmup + seconds
            for i in range(total + 1):
                delay = t0 + i - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if i and i % 5 == 0:
                    restarts += supervise(demo, failures)
                sample: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 2)}
                try:
                    version = demo.client.consistent_version(CONSISTENT_TABLES)
                    now_ms = time.time() * 1000
                    sample["freshness_ms"] = round(now_ms - version.barrier)
                except ConflictError:
                    sample["freshness_ms"] = None
                try:
                    sample["table_delay_ms"] = {
                        t.name: t.delay_ms for t in demo.client.all_tables()
                    }
                except Exception as exc:
                    sample["table_delay_ms"] = {"error": str(exc)[:200]}
                sample["load_1m"] = round(os.getloadavg()[0], 2)
                samples.append(sample)
                if i % 10 == 0:
                    f = sample["freshness_ms"]
                    shown = "none" if f is None else f"{f / 1000:.1f}s"
                    phase = "warm-up" if sample["t_s"] < warmup else "measuring"
                    print(f"    [{sample['t_s']:5.0f}s {phase}] freshness {shown}", flush=True)
        finally:
            for q in demo.queries.values():
                spark_barrier.stop_between_batches(q)
            for job in jobs:
                job.close()
            demo.client.close()
    result = summarize_freshness(samples, seconds, warmup, restarts)
    result["start_jobs_seconds"] = round(start_jobs_s, 1)
    result["query_failures"] = dict(failures)
    result["fresh_interpreter_import_source_runner_s"] = round(import_s, 2)
    first = next((s["t_s"] for s in samples if s["freshness_ms"] is not None), None)
    result["first_consistent_version_after_s"] = first
    return result


def supervise(demo: Any, failures: dict[str, int]) -> int:
    """Demo.supervise, counting restarts and their reasons."""
    restarted = 0
    for name, query in list(demo.queries.items()):
        if not query.isActive:
            error = query.exception()
            reason = str(error).splitlines()[0][:160] if error else "stopped"
            failures[f"{name}: {reason}"] += 1
            print(f"    query {name} failed ({reason}); restarting it from its checkpoint")
            demo.queries[name] = demo.launchers[name]()
            restarted += 1
    return restarted


def worker_import_seconds() -> float:
    """Wall time for a fresh interpreter to import PySpark's streaming-source runner module.

    That import is what the Python worker of a barrier source does before it connects
    back to the JVM, and Spark gives it 10 s (PythonWorkerFactory.createSimpleWorker,
    not configurable): on a saturated machine this is what fails the derived queries.
    """
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import pyspark.sql.streaming.python_streaming_source_runner"],
        check=True,
        timeout=120,
    )
    return time.perf_counter() - start


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def summarize_freshness(
    samples: list[dict[str, Any]], seconds: int, warmup: int, restarts: int
) -> dict[str, Any]:
    measured = [s for s in samples if s["t_s"] >= warmup]
    values = [s["freshness_ms"] for s in measured if s["freshness_ms"] is not None]
    result: dict[str, Any] = {
        "barrier_interval_ms": 1000,
        "orders_per_second": 50,
        "warmup_seconds_excluded": warmup,
        "measured_seconds": seconds,
        "samples": len(measured),
        "samples_without_consistent_version": len(measured) - len(values),
        "warmup_samples_without_consistent_version": sum(
            s["freshness_ms"] is None for s in samples if s["t_s"] < warmup
        ),
        "query_restarts": restarts,
        "loadavg_1m_during": {
            "min": min(s["load_1m"] for s in measured),
            "median": statistics.median(s["load_1m"] for s in measured),
            "max": max(s["load_1m"] for s in measured),
        },
    }
    if values:
        result.update(
            p50_ms=percentile(values, 50),
            p99_ms=percentile(values, 99),
            max_ms=max(values),
            min_ms=min(values),
        )
    per_table: dict[str, list[int]] = defaultdict(list)
    for s in measured:
        for name, d in s["table_delay_ms"].items():
            if isinstance(d, int) and d < 10**9:
                per_table[name].append(d)
    result["table_delay_p50_ms"] = {n: percentile(v, 50) for n, v in sorted(per_table.items())}
    result["timeline"] = samples
    return result


# --------------------------------------------------------------------------- report


def print_tables(out: dict[str, Any]) -> None:
    print()
    print("== barrier-hook overhead per batch (medians) ==")
    header = f"{'rows':>10} {'reps':>4} {'plain ms':>9} {'hooks ms':>9} {'ratio':>6} {'paired':>6} {'over ms':>8} {'load1m':>6}"
    print(header)
    for r in out["overhead"].values():
        print(
            f"{r['rows']:>10,} {r['repetitions']:>4} {r['plain_median_ms']:>9.1f} "
            f"{r['hooks_median_ms']:>9.1f} {r['ratio_hooks_over_plain']:>6.2f} "
            f"{r['paired_ratio_median']:>6.2f} {r['overhead_median_ms']:>8.1f} "
            f"{r['loadavg_1m_during']['median']:>6.1f}"
        )
    print()
    print("== hook batch breakdown (median ms per step) ==")
    keys: list[str] = []
    for r in out["overhead"].values():
        keys += [k for k in r["steps_median_ms"] if k not in keys]
    sizes = list(out["overhead"])
    print(f"{'step':<52}" + "".join(f"{int(s):>12,}" for s in sizes))
    for k in keys:
        print(
            f"{k:<52}"
            + "".join(f"{out['overhead'][s]['steps_median_ms'].get(k, 0.0):>12.1f}" for s in sizes)
        )
    fr = out.get("freshness")
    if fr:
        print()
        print(
            f"== demo freshness: now - consistent_version(dwd.order_detail, dws.item_revenue).barrier "
            f"({fr['samples']} samples over {fr['measured_seconds']} s, first "
            f"{fr['warmup_seconds_excluded']} s excluded) =="
        )
        if "p50_ms" in fr:
            print(
                f"p50 {fr['p50_ms'] / 1000:.2f} s   p99 {fr['p99_ms'] / 1000:.2f} s   "
                f"max {fr['max_ms'] / 1000:.2f} s   min {fr['min_ms'] / 1000:.2f} s"
            )
        print(
            f"samples without a consistent version: {fr['samples_without_consistent_version']} "
            f"(during warm-up: {fr['warmup_samples_without_consistent_version']}); "
            f"query restarts: {fr['query_restarts']}"
        )
        for reason, count in fr.get("query_failures", {}).items():
            print(f"  {count} x {reason}")
        print(
            f"first consistent version after {fr.get('first_consistent_version_after_s')} s of sampling "
            f"(start_jobs took {fr.get('start_jobs_seconds')} s); a fresh interpreter imports the "
            f"streaming-source runner in {fr.get('fresh_interpreter_import_source_runner_s')} s "
            "(Spark allows 10 s to connect back)"
        )
        print(
            "per-table delay p50 (s): "
            + ", ".join(f"{n} {v / 1000:.1f}" for n, v in fr["table_delay_p50_ms"].items())
        )
    print()
    print(
        f"load average: start {out['loadavg']['start']}, after overhead {out['loadavg'].get('after_overhead')}, "
        f"end {out['loadavg']['end']} on {out['machine']['nproc']} CPUs"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="bench/results/spark.json")
    parser.add_argument("--quick", action="store_true", help="small smoke run (a minute or two)")
    parser.add_argument("--freshness-seconds", type=int, default=90)
    parser.add_argument("--warmup-seconds", type=int, default=20)
    parser.add_argument("--skip-freshness", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    if args.quick:
        sizes, reps = [10_000, 200_000], {10_000: 3, 200_000: 2}
        fresh_s, warmup = min(args.freshness_seconds, 20), min(args.warmup_seconds, 15)
    else:
        sizes, reps = [10_000, 1_000_000], {10_000: 21, 1_000_000: 9}
        fresh_s, warmup = args.freshness_seconds, args.warmup_seconds

    out: dict[str, Any] = {
        "benchmark": "bench/bench_spark.py",
        "quick": args.quick,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_facts(),
        "loadavg": {"start": loadavg()},
    }
    print(
        f"machine: {out['machine']['nproc']} CPUs, {out['machine']['cpu_model']}; load {out['loadavg']['start']}"
    )
    spark = (
        spark_barrier.local_spark_builder("bench-spark")
        .config("spark.ui.showConsoleProgress", "false")  # keeps the output readable
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
            root = Path(tmp)
            if not args.skip_overhead:
                print("part 1: barrier-hook overhead per batch", flush=True)
                out["overhead"] = measure_overhead(spark, root / "overhead", sizes, reps)
                out["loadavg"]["after_overhead"] = loadavg()
            if not args.skip_freshness:
                print(
                    f"part 2: demo freshness ({warmup} s warm-up + {fresh_s} s measured)",
                    flush=True,
                )
                out["freshness"] = measure_freshness(spark, root / "freshness", fresh_s, warmup)
    finally:
        spark.stop()
    out["loadavg"]["end"] = loadavg()
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    out.setdefault("overhead", {})
    print_tables(out)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
