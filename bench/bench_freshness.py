"""Freshness of the demo's consistent version, and where the time of a batch goes.

The demo's pipeline (`examples.warehouse_pipeline`: two CDC source jobs, two derived
jobs reading changelogs) runs in this process against an embedded MetaService with
1 s barriers. Every half second the benchmark samples

    now_ms - consistent_version(all four tables).barrier

through the MetaService client; the first ``--warmup`` seconds are left out of the
percentiles, and a sample with no consistent version after warm-up is counted.

Afterwards it breaks the derived batches down from the MetaService's own records
(`batches.created_ms` is the sink's barrier request, `committed_ms` its report):

- ``inputs_final``: from the barrier to the moment every input was final there (the
  slot closed for a source, the upstream batch reported for a derived input);
- ``start``: from then to the sink's barrier request (the trigger noticing the new
  batch: next-barrier long poll, Spark's planning, the Python source's offsets);
- ``run``: from the barrier request to the commit report (read, transform, write,
  commit, report), split further by the sink's own step timings (``spark_barrier.steps``:
  every job's batches, sources included, collected from their log records).

Per job it also counts what a batch costs the driver: the Py4J calls its sink made
(``py4j_calls``: the calls on the sink's thread between two of its batches' ends), and
the Spark jobs its batch ran with their time from submission to completion
(``spark_jobs``: from the driver's status store, by the batch each job's description
names).

    python -m bench.bench_freshness [--seconds 90] [--warmup 30] [--cluster]
                                    [--out bench/results/freshness.json]

``--cluster`` runs the Spark side on a standalone cluster (a master and two workers
started on loopback from the installed pyspark, as the tests do) instead of local[2].
Run it alone: no test suite or other Spark job beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from sqlalchemy import create_engine, text

import spark_barrier
from bench import jvm_profile
from bench.common import host_facts, loadavg, package_version, process_cpu_s, spread
from examples import warehouse_pipeline as wp
from examples.embedded import EmbeddedMetaService
from metaservice.client import ConflictError, MetaServiceClient
from metaservice.settings import Settings

INTERVAL_MS = 1000
SAMPLE_EVERY_S = 0.5


@contextlib.contextmanager
def spark_master(cluster: bool) -> Iterator[tuple[str, dict[str, str]]]:
    """The master URL to use, and the environment a driver needs for it."""
    if not cluster:
        yield "local[2]", {}
        return
    from tests.cluster import StandaloneCluster

    with StandaloneCluster(workers=2) as started:
        yield started.master_url, started.driver_env()


def sample_freshness(
    client: MetaServiceClient, pipeline: wp.Pipeline, queries: dict[str, Any], total_s: float
) -> tuple[list[dict[str, Any]], int]:
    samples: list[dict[str, Any]] = []
    restarts = 0
    t0 = time.monotonic()
    i = 0
    while (elapsed := time.monotonic() - t0) < total_s:
        time.sleep(max(0.0, t0 + i * SAMPLE_EVERY_S - time.monotonic()))
        i += 1
        for name, query in list(queries.items()):
            if not query.isActive:
                error = query.exception()
                print(
                    f"    query {name} stopped ({str(error).splitlines()[0][:160] if error else 'stopped'}); restarting"
                )
                queries[name] = pipeline.start(name)
                restarts += 1
        sample: dict[str, Any] = {"t_s": round(elapsed, 2), "load_1m": round(os.getloadavg()[0], 2)}
        try:
            version = client.consistent_version(wp.ALL_TABLES)
            sample["freshness_ms"] = round(time.time() * 1000 - version.barrier)
        except ConflictError:
            sample["freshness_ms"] = None
        samples.append(sample)
        if i % 20 == 0:
            f = sample["freshness_ms"]
            print(
                f"    [{elapsed:5.0f}s] freshness {'none' if f is None else f'{f / 1000:.1f}s'}",
                flush=True,
            )
    return samples, restarts


def spark_phases(queries: dict[str, Any], since_ms: int) -> dict[str, Any]:
    """Per query, Spark's own phases of the micro-batches it ran since ``since_ms`` (from the
    query's recent progress, its last 100 batches): ``latestOffset`` (for a derived
    job, its barrier sources' next-barrier long polls), ``walCommit`` (the offset log),
    ``queryPlanning``, ``addBatch`` (the sink: everything ``batch_steps_ms`` times),
    ``commitOffsets`` and the whole ``triggerExecution``."""
    result: dict[str, Any] = {}
    for name, query in queries.items():
        phases: dict[str, list[float]] = defaultdict(list)
        for progress in query.recentProgress:
            at = dt.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00"))
            durations = progress.durationMs or {}
            if at.timestamp() * 1000 >= since_ms and "addBatch" in durations:  # a batch ran
                for phase, ms in durations.items():
                    phases[phase].append(float(ms))
        result[name] = {phase: spread(values) for phase, values in sorted(phases.items())}
    return result


def batch_breakdown(db_url: str, since_ms: int) -> dict[str, Any]:
    """Per derived job, the three parts of its batches (see the module docstring)."""
    engine = create_engine(db_url)
    with engine.connect() as conn:
        jobs = {r.id: r for r in conn.execute(text("SELECT id, name, kind FROM jobs"))}
        batches = conn.execute(
            text(
                "SELECT job_id, barrier, created_ms, committed_ms FROM batches "
                "WHERE committed AND NOT advanced AND NOT abandoned AND created_ms >= :since"
            ),
            {"since": since_ms},
        ).all()
        inputs = conn.execute(
            text(
                "SELECT ji.job_id, t.writer_id FROM job_inputs ji JOIN tables t ON t.id = ji.table_id"
            )
        ).all()
    engine.dispose()
    upstream: dict[int, set[int]] = defaultdict(set)
    for job_id, writer_id in inputs:
        if writer_id is not None:
            upstream[job_id].add(writer_id)
    done_at: dict[int, list[tuple[int, int]]] = defaultdict(list)  # job -> (barrier, reported)
    for b in batches:
        done_at[b.job_id].append((b.barrier, b.committed_ms))

    def final_at(job_id: int, barrier: int) -> int | None:
        """When job ``job_id``'s output was final at ``barrier``."""
        reported = [ms for bb, ms in done_at[job_id] if bb >= barrier]
        if not reported:
            return None
        first = min(reported)
        if jobs[job_id].kind == "source":
            return max(first, barrier + INTERVAL_MS)  # a source's slot must close too
        return first

    result: dict[str, Any] = {}
    for job_id, job in jobs.items():
        if job.kind == "source" or not upstream[job_id]:
            continue
        parts: dict[str, list[float]] = defaultdict(list)
        for b in (b for b in batches if b.job_id == job_id):
            finals = [final_at(u, b.barrier) for u in upstream[job_id]]
            if any(f is None for f in finals):
                continue
            ready = max(f for f in finals if f is not None)
            parts["inputs_final_ms"].append(ready - b.barrier)
            parts["start_ms"].append(max(0, b.created_ms - ready))
            parts["run_ms"].append(b.committed_ms - b.created_ms)
            parts["barrier_to_report_ms"].append(b.committed_ms - b.barrier)
        result[job.name] = {k: spread(v) for k, v in parts.items()}
    return result


class Py4jCalls:
    """Counts the Py4J calls each Python thread makes (pyspark's pinned threads: a
    query's ``foreachBatch`` runs on one Python thread, batch after batch)."""

    def __init__(self, callers: bool = False) -> None:
        self._local = threading.local()
        self._patched: Any = None
        # With callers: the calls by the first frame outside pyspark and py4j that made them.
        self.callers: Counter[str] | None = Counter() if callers else None

    def install(self) -> None:
        from py4j.clientserver import ClientServerConnection

        original = ClientServerConnection.send_command
        local = self._local
        callers = self.callers

        def send_command(connection: Any, command: str) -> Any:
            local.calls = getattr(local, "calls", 0) + 1
            if callers is not None:
                callers[_caller()] += 1
            return original(connection, command)

        self._patched = (ClientServerConnection, original)
        ClientServerConnection.send_command = send_command

    def uninstall(self) -> None:
        if self._patched is not None:
            cls, original = self._patched
            cls.send_command = original

    def take(self) -> int:
        """The calls this thread made since the last take."""
        calls = getattr(self._local, "calls", 0)
        self._local.calls = 0
        return int(calls)


_LIBRARIES = ("/pyspark/", "/py4j/")


def _caller() -> str:
    """Where a Py4J call comes from: the first frame outside pyspark and py4j, and the
    pyspark function it called."""
    frame = sys._getframe(2)
    called = "?"
    while frame is not None and any(lib in frame.f_code.co_filename for lib in _LIBRARIES):
        called = frame.f_code.co_name
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return f"(pyspark) {called}"
    code = frame.f_code
    return f"{Path(code.co_filename).name}:{code.co_name}:{frame.f_lineno} -> {called}"


class StepCollector(logging.Handler):
    """Collects the per-batch step timings the sinks log (``spark_barrier.steps``), with
    the Py4J calls of each batch (see :class:`Py4jCalls`)."""

    def __init__(self, calls: Py4jCalls | None = None) -> None:
        super().__init__(level=logging.INFO)
        self.batches: list[tuple[float, str, dict[str, float]]] = []
        self.calls = calls

    def emit(self, record: logging.LogRecord) -> None:
        steps = getattr(record, "steps", None)
        if steps is not None:
            steps = dict(steps)
            if self.calls is not None:  # the sink logs on its own thread, as the batch ends
                steps["py4j_calls"] = self.calls.take()
            if getattr(record, "total_ms", None) is not None:
                steps["total"] = record.total_ms  # type: ignore[attr-defined]
            self.batches.append((record.created, str(getattr(record, "job", "?")), steps))

    def summary(self, since: float) -> dict[str, Any]:
        per_job: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for created, job, steps in self.batches:
            if created >= since:
                for name, ms in steps.items():
                    per_job[job][name].append(round(ms, 1))
        return {
            job: {name: spread(values) for name, values in sorted(steps.items())}
            for job, steps in sorted(per_job.items())
        }


_BATCH_DESCRIPTION = re.compile(
    r"^(?P<query>[^\n]*)\nid = [^\n]*\nrunId = [^\n]*\nbatch = (?P<batch>\d+)"
)


def spark_jobs_per_batch(spark: Any, since_ms: int) -> dict[str, Any]:
    """Per query, the Spark jobs of its batches submitted after ``since_ms``: how many a
    batch ran and their time (submission to completion) summed per batch. Read from the
    driver's status store (``spark.ui.retainedJobs`` must hold the run's jobs); a job's
    description names its query and batch (Spark sets it on the query's thread)."""
    jobs = spark._jsc.sc().statusStore().jobsList(None)
    per_batch: dict[tuple[str, int], list[float]] = defaultdict(list)
    for i in range(jobs.size()):
        job = jobs.apply(i)
        described, submitted, completed = (
            job.description(),
            job.submissionTime(),
            job.completionTime(),
        )
        if described.isEmpty() or submitted.isEmpty() or completed.isEmpty():
            continue
        started = submitted.get().getTime()
        if started < since_ms:
            continue
        match = _BATCH_DESCRIPTION.match(str(described.get()))
        if match is None:
            continue
        key = (match["query"], int(match["batch"]))
        per_batch[key].append(completed.get().getTime() - started)
    by_query: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (query, _), times in per_batch.items():
        by_query[query]["jobs_per_batch"].append(len(times))
        by_query[query]["job_ms_per_batch"].append(sum(times))
    return {
        query: {
            "batches": len(parts["jobs_per_batch"]),
            "jobs_per_batch_mean": round(
                sum(parts["jobs_per_batch"]) / len(parts["jobs_per_batch"]), 2
            ),
            "jobs_per_batch": spread(parts["jobs_per_batch"]),
            "job_ms_per_batch": spread(parts["job_ms_per_batch"]),
        }
        for query, parts in sorted(by_query.items())
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    db_url = f"sqlite:///{root / 'metaservice.db'}"
    tables = str(root / "tables")
    settings = Settings(db_url=db_url, warehouse=tables, barrier_interval_ms=INTERVAL_MS, port=0)
    catalog = {"type": "sql", "uri": db_url, "warehouse": tables}
    out: dict[str, Any] = {
        "benchmark": "bench/bench_freshness.py",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**host_facts(), "pyspark": package_version("pyspark")},
        "loadavg_start": loadavg(),
    }
    calls = Py4jCalls(callers=args.py4j_callers)
    calls.install()
    collector = StepCollector(calls)
    steps_log = logging.getLogger("spark_barrier.steps")
    steps_log.setLevel(logging.INFO)
    steps_log.addHandler(collector)
    steps_log.propagate = False  # collected here, not printed
    recording = root / "driver.jfr"
    with spark_master(args.cluster) as (master, env), EmbeddedMetaService(settings) as url:
        os.environ.update(env)
        with _jvm_options(recording if args.jvm_profile else None, args):
            spark = (
                spark_barrier.local_spark_builder("bench-freshness", master=master)
                .config("spark.ui.retainedJobs", "20000")  # the run's jobs, for the counts
                .getOrCreate()
            )
        spark.sparkContext.setLogLevel("ERROR")
        out["spark_master"] = spark.sparkContext.master
        cpu = DriverCpu(int(spark._jvm.java.lang.ProcessHandle.current().pid()))  # type: ignore[union-attr]
        threading.Timer(args.warmup, cpu.start).start()
        register = wp.registrar(spark, url, catalog_properties=catalog, state_dir=root / "state")
        pipeline = wp.build(spark, register, orders_per_second=args.orders_per_second)
        started_ms = int(time.time() * 1000)
        queries = {name: pipeline.start(name) for name in pipeline.launchers}
        client = MetaServiceClient(url)
        print(
            f"  {len(queries)} queries on {out['spark_master']}; {args.warmup} s warm-up + {args.seconds} s measured",
            flush=True,
        )
        try:
            samples, restarts = sample_freshness(
                client, pipeline, queries, args.warmup + args.seconds
            )
            out["driver_cpu_cores"] = cpu.cores()
            out["spark_phases_ms"] = spark_phases(queries, started_ms + args.warmup * 1000)
        finally:
            for q in queries.values():
                spark_barrier.stop_between_batches(q)
            pipeline.close()
            client.close()
        try:
            out["spark_jobs"] = spark_jobs_per_batch(spark, started_ms + args.warmup * 1000)
        except Exception as exc:  # Spark's internals: the figures stand without the counts
            out["spark_jobs"] = {"error": repr(exc)[:300]}
        spark.stop()
        calls.uninstall()
        measured = [s for s in samples if s["t_s"] >= args.warmup]
        values = [s["freshness_ms"] for s in measured if s["freshness_ms"] is not None]
        out["freshness"] = {
            "barrier_interval_ms": INTERVAL_MS,
            "orders_per_second": args.orders_per_second,
            "warmup_seconds_excluded": args.warmup,
            "measured_seconds": args.seconds,
            "samples": len(measured),
            "samples_without_consistent_version": len(measured) - len(values),
            "query_restarts": restarts,
            "ms": spread(values),
            "loadavg_1m_during": spread([s["load_1m"] for s in measured]),
        }
        if calls.callers is not None:
            out["py4j_callers"] = dict(calls.callers.most_common(150))
        out["batches"] = batch_breakdown(db_url, started_ms + args.warmup * 1000)
        out["batch_steps_ms"] = collector.summary(started_ms / 1000 + args.warmup)
        out["timeline"] = samples
    if args.jvm_profile:
        out["driver_jvm_profile"] = (
            jvm_profile.summarize(recording) if recording.exists() else {"error": "no recording"}
        )
    out["loadavg_end"] = loadavg()
    return out


@contextlib.contextmanager
def _jvm_options(recording: Path | None, args: argparse.Namespace) -> Iterator[None]:
    """JAVA_TOOL_OPTIONS for the driver JVM pyspark launches here: a JFR recording of
    the measured part (after the warm-up, up to a minute) when ``recording`` is given."""
    if recording is None:
        yield
        return
    before = os.environ.get("JAVA_TOOL_OPTIONS")
    duration = min(60, max(10, args.seconds - 10))
    options = jvm_profile.recording_options(recording, args.warmup + 5, duration)
    os.environ["JAVA_TOOL_OPTIONS"] = f"{before} {options}" if before else options
    try:
        yield
    finally:
        if before is None:
            del os.environ["JAVA_TOOL_OPTIONS"]
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = before


class DriverCpu:
    """CPU the driver used from :meth:`start` to :meth:`cores`, in cores: its JVM, and
    this Python process (the sinks, the embedded MetaService, the sampling)."""

    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid
        self.started: tuple[float, float, float] | None = None

    def _now(self) -> tuple[float, float, float]:
        return time.monotonic(), process_cpu_s(self.jvm_pid), process_cpu_s(os.getpid())

    def start(self) -> None:
        self.started = self._now()

    def cores(self) -> dict[str, float] | None:
        if self.started is None:
            return None
        (t0, jvm0, py0), (t1, jvm1, py1) = self.started, self._now()
        return {
            "seconds": round(t1 - t0, 1),
            "jvm": round((jvm1 - jvm0) / (t1 - t0), 2),
            "python": round((py1 - py0) / (t1 - t0), 2),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=90, help="measured seconds")
    parser.add_argument("--warmup", type=int, default=30, help="seconds left out first")
    parser.add_argument("--orders-per-second", type=int, default=50)
    parser.add_argument("--cluster", action="store_true", help="run on a standalone cluster")
    parser.add_argument("--out", default="bench/results/freshness.json")
    parser.add_argument(
        "--py4j-callers",
        action="store_true",
        help="count the driver's Py4J calls by the code that made them (a profile: slower)",
    )
    parser.add_argument(
        "--jvm-profile",
        action="store_true",
        help="record the driver JVM with Java Flight Recorder over the measured part and "
        "say where its CPU went (needs the JDK's jfr tool)",
    )
    args = parser.parse_args(argv)
    if args.jvm_profile and not jvm_profile.available():
        parser.error("--jvm-profile needs the JDK's jfr tool on PATH (it ships with JDK 11+)")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    out = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    fr = out["freshness"]
    print(f"\n== now - consistent version of {', '.join(wp.ALL_TABLES)} ==")
    print(json.dumps(fr, indent=1))
    print("\n== derived batches (ms) ==")
    print(json.dumps(out["batches"], indent=1))
    print("\n== steps of every job's batches, p50 ms ==")
    for job, steps in out["batch_steps_ms"].items():
        shown = ", ".join(f"{n} {s['p50']:.0f}" for n, s in steps.items() if s)
        print(f"  {job}: {shown}")
    print("\n== Spark jobs per batch (mean; job time per batch p50 ms) ==")
    for job, jobs in out["spark_jobs"].items():
        if not isinstance(jobs, dict):
            print(f"  {job}: {jobs}")
            continue
        took = jobs["job_ms_per_batch"]
        print(
            f"  {job}: {jobs['jobs_per_batch_mean']} jobs, "
            f"{took['p50'] if took else 0:.0f} ms ({jobs['batches']} batches)"
        )
    if out.get("driver_cpu_cores"):
        cores = out["driver_cpu_cores"]
        print(
            f"\n== driver CPU over the measured part: JVM {cores['jvm']} cores, Python {cores['python']} =="
        )
    profile = out.get("driver_jvm_profile")
    if profile and "activities" in profile:
        print(f"\n== driver JVM: where its CPU went ({profile['samples']} samples) ==")
        for activity, share in profile["activities"].items():
            print(f"  {share:6.1%}  {activity}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
