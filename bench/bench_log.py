"""The log store: how soon a row reaches a reader, beside the table's consistent version.

    .venv/bin/python -m bench.bench_log [--seconds 45] [--warmup 15] [--rows-per-second 200]
        [--triggers 1,0.25]

Part ``latency`` (one run, one Spark driver on local[2], an embedded MetaService with
1 s barriers): a source job ingests a rate stream into a table with an embedded log.
In the same run, three readers follow the table:

- a ``LogReader`` on the log (what ``read_log`` uses);
- a ``LogReader`` without a log address, reading only the table's snapshots (the
  floor a reader has without the log);
- the table's consistent version, sampled every 0.5 s (now minus its barrier).

A row's latency is the time a reader got it minus the time the rate source stamped it
(its ``timestamp``: when the row entered the job). The log's memory (its ``bytes`` in
the log service's status) is sampled too, and each batch's steps on the driver (the
``spark_barrier.steps`` log records: the rows reach the log inside ``write``). The part
runs once per source trigger in ``--triggers`` (a source job may run several batches
per 1 s barrier slot), one after the other in the same process.

Part ``throughput`` (no Spark): appends of Arrow batches of 10,000 rows to an embedded
log service from two threads, offered at 1,000,000 rows/s for a few seconds, with a
writer marking batches persisted as it goes: rows/s accepted and the latency of an
append.

Results go to ``bench/results/log.json``. Run it alone (no test suite or other Spark
job beside it).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.common import host_facts, loadavg, package_version, spread

TABLE = "ods.events"
SAMPLE_EVERY_S = 0.5


class Follower:
    """Polls a LogReader in a thread; keeps (delivered at, created at) per row."""

    def __init__(self, reader: Any, interval: float = 0.05) -> None:
        self.reader = reader
        self.latencies: list[tuple[float, float]] = []  # (delivered s, latency ms)
        self.from_log = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        for rows in self.reader.follow(interval=interval, stop=self._stop.is_set):
            now_ms = time.time() * 1000
            created = rows.column("created_ms").to_pylist()
            self.latencies.extend((now_ms / 1000, now_ms - c) for c in created if c is not None)
            self.from_log += sum(1 for s in rows.column("_log_seq").to_pylist() if s is not None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.reader.close()

    def measured(self, since_s: float) -> list[float]:
        return [lat for at, lat in self.latencies if at >= since_s]


class StepRecorder(logging.Handler):
    """Collects each batch's step durations (``spark_barrier.steps`` records)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.batches: list[tuple[float, dict[str, float]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        steps = dict(getattr(record, "steps", {}))
        total = getattr(record, "total_ms", None)
        if total is not None:
            steps["total"] = float(total)
        self.batches.append((record.created, steps))

    def spreads(self, since_s: float) -> dict[str, Any]:
        names = sorted({name for _, steps in self.batches for name in steps})
        measured = [steps for at, steps in self.batches if at >= since_s]
        return {n: spread([s[n] for s in measured if n in s]) for n in names}


def run_latency(args: argparse.Namespace, trigger_s: float) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    import spark_barrier
    from examples.embedded import EmbeddedMetaService
    from metaservice.client import ConflictError, MetaServiceClient
    from metaservice.logstore import LogClient, LogReader
    from metaservice.settings import Settings

    root = Path(tempfile.mkdtemp(prefix="bench-log-"))
    db_url = f"sqlite:///{root / 'metaservice.db'}"
    tables = str(root / "tables")
    settings = Settings(db_url=db_url, warehouse=tables, barrier_interval_ms=1000, port=0)
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("created_ms", T.LongType())]
    )
    with EmbeddedMetaService(settings) as url, MetaServiceClient(url) as client:
        spark = spark_barrier.local_spark_builder("bench-log").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        job = spark_barrier.register(
            spark,
            url,
            job="ingest_events",
            outputs={TABLE: schema},
            catalog_uri=db_url,
            warehouse=tables,
            state_dir=root / "state",
            log="embedded",
        )
        stream = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", args.rows_per_second)
            .load()
            .select(
                F.col("value").alias("id"), F.expr("unix_millis(timestamp)").alias("created_ms")
            )
        )
        query = job.start(stream, job.sink(), trigger_seconds=trigger_s)
        recorder = StepRecorder()
        steps_log = logging.getLogger("spark_barrier.steps")
        steps_log.addHandler(recorder)
        steps_log.setLevel(logging.INFO)
        steps_log.propagate = False
        log_reader = LogReader.from_metaservice(TABLE, client, catalog=job.catalog)
        snapshot_reader = LogReader(TABLE, log_url=None, catalog=job.catalog)
        on_log, on_snapshots = Follower(log_reader), Follower(snapshot_reader)
        started = time.time()
        versions: list[tuple[float, float | None]] = []
        memory: list[tuple[float, int]] = []
        log_client = LogClient(job.log.url) if job.log else None
        print(f"  {args.warmup} s warm-up + {args.seconds} s measured", flush=True)
        try:
            while time.time() - started < args.warmup + args.seconds:
                assert query.exception() is None, query.exception()
                now = time.time()
                try:
                    barrier = client.consistent_version([TABLE]).barrier
                    versions.append((now, now * 1000 - barrier))
                except ConflictError:
                    versions.append((now, None))
                if log_client is not None:
                    (status,) = log_client.status(TABLE)
                    memory.append((now, status["bytes"]))
                time.sleep(SAMPLE_EVERY_S)
        finally:
            steps_log.removeHandler(recorder)
            spark_barrier.stop_between_batches(query)
            on_log.stop()
            on_snapshots.stop()
            if log_client is not None:
                log_client.close()
            job.close()
            spark.stop()
    since = started + args.warmup
    measured_versions = [v for at, v in versions if at >= since]
    return {
        "rows_per_second_offered": args.rows_per_second,
        "warmup_seconds_excluded": args.warmup,
        "measured_seconds": args.seconds,
        "source_trigger_s": trigger_s,
        "row_to_log_reader_ms": spread(on_log.measured(since)),
        "rows_the_log_reader_got_from_the_log": on_log.from_log,
        "row_to_snapshot_reader_ms": spread(on_snapshots.measured(since)),
        "now_minus_consistent_version_ms": spread([v for v in measured_versions if v is not None]),
        "samples_without_consistent_version": sum(1 for v in measured_versions if v is None),
        "log_bytes_held": spread([float(b) for at, b in memory if at >= since]),
        "source_batch_steps_ms": recorder.spreads(since),
    }


def run_throughput(seconds: float = 5.0, offered_rows_per_s: int = 1_000_000) -> dict[str, Any]:
    from metaservice.logstore import LogWriter
    from metaservice.logstore.server import LogService

    rows_per_append = 10_000
    batch = pa.table(
        {
            "id": pa.array(range(rows_per_append), pa.int64()),
            "created_ms": pa.array([0] * rows_per_append, pa.int64()),
        }
    )
    appends_per_s = offered_rows_per_s / rows_per_append
    latencies: list[float] = []
    accepted = [0]
    lock = threading.Lock()
    with LogService() as service:

        def writer(thread: int, threads: int) -> None:
            with LogWriter(service.url) as log:
                start = time.monotonic()
                n = 0
                while time.monotonic() - start < seconds:
                    due = start + (n * threads + thread) / appends_per_s
                    if due > time.monotonic():
                        time.sleep(due - time.monotonic())
                    batch_id = n * threads + thread
                    t0 = time.perf_counter()
                    log.append("bench.throughput", barrier=batch_id, batch_id=batch_id, rows=batch)
                    elapsed = (time.perf_counter() - t0) * 1000
                    with lock:
                        latencies.append(elapsed)
                        accepted[0] += rows_per_append
                    n += 1

        def persist() -> None:  # the driver's marks, so retention can drop what is old
            with LogWriter(service.url) as log:
                start = time.monotonic()
                while time.monotonic() - start < seconds:
                    time.sleep(0.5)
                    if "bench.throughput" not in service.store.names():
                        continue
                    last = service.store.existing("bench.throughput").status().last
                    if last is not None:
                        # Behind the newest append: a batch still being appended to is
                        # not committed yet (the log would refuse its next chunk).
                        batch_id = last[1] - 10
                        if batch_id >= 0:
                            log.persisted(
                                "bench.throughput",
                                barrier=batch_id,
                                batch_id=batch_id,
                                snapshot_id=batch_id + 1,
                            )

        threads = [threading.Thread(target=writer, args=(i, 2)) for i in range(2)]
        threads.append(threading.Thread(target=persist))
        began = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - began
    return {
        "offered_rows_per_s": offered_rows_per_s,
        "rows_per_append": rows_per_append,
        "writer_threads": 2,
        "seconds": round(took, 2),
        "accepted_rows_per_s": round(accepted[0] / took),
        "append_ms": spread(latencies),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=45, help="measured seconds")
    parser.add_argument("--warmup", type=int, default=15, help="seconds left out first")
    parser.add_argument("--rows-per-second", type=int, default=200)
    parser.add_argument(
        "--triggers",
        default="1,0.25",
        help="source triggers in seconds, comma-separated: one latency run each",
    )
    parser.add_argument("--part", choices=("latency", "throughput", "all"), default="all")
    parser.add_argument("--out", default="bench/results/log.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    out: dict[str, Any] = {
        "benchmark": "bench/bench_log.py",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**host_facts(), "pyspark": package_version("pyspark")},
        "loadavg_start": loadavg(),
    }
    triggers = [float(t) for t in args.triggers.split(",")]
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "latency": lambda: {f"trigger_{t:g}s": run_latency(args, t) for t in triggers},
        "throughput": run_throughput,
    }
    for name, part in parts.items():
        if args.part in (name, "all"):
            print(f"{name}...", flush=True)
            out[name] = part()
            print(json.dumps(out[name], indent=1), flush=True)
    out["loadavg_end"] = loadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
