"""Benchmark a MetaService outage (guarantee G4): backlog drain, and how long a source job
keeps committing while the MetaService is down.

Part ``drain``: the real service (``metaservice start`` in a subprocess) on SQLite and on
PostgreSQL. A backlog of reports is written to a job's outbox while the service is down,
exactly as a source job writes it offline, then the service is started again and the time
until the outbox is fully acknowledged is measured:

- ``claims``: N/2 batches, each a claim record (``OfflineBarriers.barrier_for`` with a
  grant taken while the service was up) and a commit report, i.e. N records;
- ``plain``: N commit reports of N batches whose barriers were assigned while online.

Afterwards every commit must be in the service's barrier-to-snapshot mapping.

Part ``spark``: a real Spark source job (``spark_barrier.register``, a rate source like
the demo's ``generated_orders``, trigger 1 s) against a real service subprocess on SQLite
(which is also the Iceberg catalog). The service is SIGKILLed; the query keeps running
for ``--outage-seconds``: Iceberg snapshots committed during the outage, outbox bytes per
batch. The service is started again: time until the backlog drains, and every snapshot
stamped in the table must be in the service's mapping. Then a second run with a small
outbox bound (``outbox_options={"max_bytes": ...}``) until the query fails with
``OutboxFullError``, and a restart of service and query to check that nothing was lost.

Usage:
    .venv/bin/python -m bench.bench_outage [--out bench/results/outage.json] [--quick]
        [--part drain|spark|all] [--db sqlite|postgres|both] [--records N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.common import host_facts, loadavg, package_version, pg_schema
from metaservice.client import MetaServiceClient
from spark_barrier.offline import OfflineBarriers
from spark_barrier.outbox import DEFAULT_MAX_BYTES, HEADER_BYTES
from spark_barrier.report import OutboxReporter

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SNAPSHOT_BASE = 6_917_529_027_641_081_856  # fake, distinct snapshot ids (the service accepts any)

# --------------------------------------------------------------------------- machine


def machine_facts() -> dict[str, Any]:
    packages = ("pyspark", "pyiceberg", "fastapi", "uvicorn", "sqlalchemy", "psycopg", "httpx")
    return {
        **host_facts(),
        "sqlite": sqlite3.sqlite_version,
        "packages": {p: package_version(p) for p in packages},
    }


class LoadWatch:
    """Samples the 1-minute load average every few seconds, per named phase."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.phases: dict[str, dict[str, Any]] = {}
        self._current: list[float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                if self._current is not None:
                    self._current.append(os.getloadavg()[0])

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        samples = [os.getloadavg()[0]]
        with self._lock:
            self._current = samples
        try:
            yield
        finally:
            with self._lock:
                samples.append(os.getloadavg()[0])
                self._current = None
            self.phases[name] = {
                "min": round(min(samples), 2),
                "median": round(statistics.median(samples), 2),
                "max": round(max(samples), 2),
                "samples": len(samples),
            }

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class LogCounter(logging.Handler):
    """Counts WARNING/ERROR records of the libraries under test and keeps the first few."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelname] += 1
        if len(self.first) < 20:
            self.first.append(f"{record.levelname} {record.name}: {record.getMessage()[:300]}")

    def take(self) -> dict[str, Any]:
        out = {"counts": dict(self.counts), "first": list(self.first)}
        self.counts.clear()
        self.first.clear()
        return out


# --------------------------------------------------------------------------- the service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """``metaservice start --db URL --port P --host 127.0.0.1`` as a subprocess, restartable
    on the same port and database."""

    def __init__(self, db_url: str, workdir: Path, name: str) -> None:
        self.db_url = db_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"service-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        exe = Path(sys.executable).parent / "metaservice"
        if not exe.exists():
            raise SystemExit(f"{exe} not found: run with the project's venv (.venv/bin/python)")
        self.cmd = [str(exe), "start", "--db", db_url, "--port", str(self.port)]
        self.cmd += ["--host", "127.0.0.1", "--log-level", "warning"]

    def start(self, timeout_s: float = 180.0) -> float:
        """Start it and wait for ``/readyz``; return the seconds that took."""
        assert self.proc is None or self.proc.poll() is not None
        began = time.perf_counter()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"service exited: {self.log_tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if http.get(self.url + "/readyz").status_code == 200:
                        return time.perf_counter() - began
                if time.monotonic() > deadline:
                    raise RuntimeError(f"service not ready after {timeout_s} s: {self.log_tail()}")
                time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def tracebacks(self) -> int:
        return self.log.read_text(errors="replace").count("Traceback") if self.log.exists() else 0


def pg_reachable(pg_base: str) -> str | None:
    """None if PostgreSQL answers, else why not."""
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(pg_base, connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None


@contextlib.contextmanager
def database(kind: str, pg_base: str, workdir: Path) -> Iterator[str]:
    """A fresh SQLite file, or a fresh PostgreSQL schema (dropped afterwards)."""
    if kind == "sqlite":
        yield f"sqlite:///{workdir / 'metaservice.db'}"
        return
    with pg_schema(pg_base, "bench_outage") as url:
        yield url


def service_mapping(client: MetaServiceClient, table: str) -> list[Any]:
    """Every row of ``GET /tables/{table}/snapshots``."""
    items: list[Any] = []
    while True:
        page = client.table_snapshots(table, limit=500, offset=len(items))
        items += page.items
        if not page.items or len(items) >= page.total:
            return items


# --------------------------------------------------------------------------- part 1: drain


def commit_report(job: str, table: str, batch_id: int, barrier: int) -> dict[str, Any]:
    """What the barrier sink reports after a commit (``BarrierSink._report``)."""
    return {
        "job": job,
        "batch_id": batch_id,
        "barrier": barrier,
        "table": table,
        "snapshot_id": SNAPSHOT_BASE + 7919 * batch_id,
    }


def wait_drained(reporter: OutboxReporter, ready_at: float, timeout_s: float) -> dict[str, Any]:
    """Poll the outbox until everything appended is acknowledged. Times are from
    ``ready_at`` (the service answering /readyz again)."""
    box = reporter.outbox
    target, acked_before = box.last_seq, box.acked_seq
    first_ack: float | None = None
    deadline = time.perf_counter() + timeout_s
    while True:
        acked = box.acked_seq
        now = time.perf_counter()
        if first_ack is None and acked > acked_before:
            first_ack = now
        if acked >= target:
            break
        if now > deadline:
            return {"drained": False, "acked": acked - acked_before, "target": target}
        time.sleep(0.02)
    done = time.perf_counter()
    records = target - acked_before
    assert first_ack is not None or records == 0
    first = first_ack if first_ack is not None else done
    return {
        "drained": True,
        "records": records,
        "seconds_from_ready": round(done - ready_at, 3),
        "records_per_s_from_ready": round(records / (done - ready_at), 1),
        "first_ack_after_ready_s": round(first - ready_at, 3),
        "seconds_first_to_last_ack": round(done - first, 3),
        # The first acknowledgement covers one delivery batch (100 records), so this rate
        # leaves out the deliverer's backoff wait but also that first batch.
        "records_per_s_after_first_ack": round((records - min(records, 100)) / (done - first), 1)
        if done > first and records > 100
        else None,
    }


def drain_claims(
    svc: Service, workdir: Path, batches: int, watch: LoadWatch, tag: str
) -> dict[str, Any]:
    """A source job offline: per batch a claim and a commit report; then the drain."""
    job, table = "outage_claims", "ods.outage_claims"
    state = workdir / "claims"
    state.mkdir()
    client = MetaServiceClient(svc.url)
    client.put_job(job, outputs=[table], description="bench_outage: offline claims")
    reporter = OutboxReporter(client, state / "outbox")
    offline = OfflineBarriers(client, job, reporter.outbox, state)
    offline.report_in()  # the grant, taken while the service is up
    svc.stop(signal.SIGTERM)
    out: dict[str, Any] = {"batches": batches, "records": 2 * batches}
    print(f"  [{tag}/claims] service stopped; writing {batches} batches (claim + commit) ...")
    with watch.phase(f"{tag}/claims/build"):
        t0 = time.perf_counter()
        claimed = []
        for i in range(batches):
            barrier = offline.barrier_for(i)
            if i == 0:
                out["first_batch_barrier_s"] = round(time.perf_counter() - t0, 3)
                t1 = time.perf_counter()
            reporter.report(commit_report(job, table, i, barrier))
            claimed.append(barrier)
        build_s = time.perf_counter() - t1
    out["build_seconds_after_first"] = round(build_s, 3)
    out["build_batches_per_s"] = round((batches - 1) / build_s, 1)
    out["backlog_records"] = reporter.outbox.backlog
    out["outbox_bytes"] = reporter.outbox.size_bytes
    out["distinct_barriers"] = len(set(claimed))
    print(
        f"  [{tag}/claims] backlog {out['backlog_records']} records, "
        f"{out['outbox_bytes']:,} bytes, written at {out['build_batches_per_s']} batches/s; "
        "starting the service ..."
    )
    with watch.phase(f"{tag}/claims/drain"):
        out["service_start_s"] = round(svc.start(), 3)
        ready = time.perf_counter()
        out["drain"] = wait_drained(reporter, ready, timeout_s=3600)
    print(f"  [{tag}/claims] drain: {out['drain']}")
    offline.close(release=True)
    reporter.flush(60)
    reporter.close()
    mapping = service_mapping(client, table)
    expected = {(i, b, SNAPSHOT_BASE + 7919 * i) for i, b in enumerate(claimed)}
    got = {(m.batch_id, m.barrier, m.snapshot_id) for m in mapping}
    out["verify"] = {
        "service_snapshots_total": client.table_snapshots(table, limit=1).total,
        "expected": batches,
        "all_present_with_claimed_barriers": got == expected,
        "grant_released": client.get_job(job).offline_floor is None,
    }
    print(f"  [{tag}/claims] verify: {out['verify']}")
    client.close()
    return out


def drain_plain(
    svc: Service, workdir: Path, batches: int, watch: LoadWatch, tag: str
) -> dict[str, Any]:
    """Batches whose barriers were assigned online, whose commit reports wait offline."""
    job, table = "outage_plain", "ods.outage_plain"
    client = MetaServiceClient(svc.url)
    client.put_job(job, outputs=[table], description="bench_outage: plain commit reports")
    out: dict[str, Any] = {"batches": batches, "records": batches}
    print(f"  [{tag}/plain] assigning {batches} barriers online ...")
    with watch.phase(f"{tag}/plain/assign"):
        t0 = time.perf_counter()
        barriers = [client.batch_barrier(job, i).barrier for i in range(batches)]
        out["online_barrier_assignments_per_s"] = round(batches / (time.perf_counter() - t0), 1)
    reporter = OutboxReporter(client, workdir / "plain" / "outbox")
    svc.stop(signal.SIGTERM)
    print(f"  [{tag}/plain] service stopped; writing {batches} commit reports ...")
    with watch.phase(f"{tag}/plain/build"):
        t0 = time.perf_counter()
        for i, barrier in enumerate(barriers):
            reporter.report(commit_report(job, table, i, barrier))
        out["build_reports_per_s"] = round(batches / (time.perf_counter() - t0), 1)
    out["backlog_records"] = reporter.outbox.backlog
    out["outbox_bytes"] = reporter.outbox.size_bytes
    with watch.phase(f"{tag}/plain/drain"):
        out["service_start_s"] = round(svc.start(), 3)
        ready = time.perf_counter()
        out["drain"] = wait_drained(reporter, ready, timeout_s=3600)
    print(f"  [{tag}/plain] drain: {out['drain']}")
    reporter.close()
    mapping = service_mapping(client, table)
    expected = {(i, b, SNAPSHOT_BASE + 7919 * i) for i, b in enumerate(barriers)}
    got = {(m.batch_id, m.barrier, m.snapshot_id) for m in mapping}
    out["verify"] = {
        "service_snapshots_total": client.table_snapshots(table, limit=1).total,
        "expected": batches,
        "all_present": got == expected,
    }
    print(f"  [{tag}/plain] verify: {out['verify']}")
    client.close()
    return out


def part_drain(
    kinds: list[str], pg_base: str, records: int, watch: LoadWatch, logs: LogCounter
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for kind in kinds:
        if kind == "postgres":
            why = pg_reachable(pg_base)
            if why is not None:
                print(f"  PostgreSQL at {pg_base} is unreachable ({why}): skipped")
                results[kind] = {"skipped": why}
                continue
        print(f"drain into the real MetaService on {kind} ...")
        res: dict[str, Any] = {"loadavg_start": loadavg()}
        with (
            tempfile.TemporaryDirectory(prefix=f"bench-outage-{kind}-") as tmp,
            database(kind, pg_base, Path(tmp)) as url,
        ):
            root = Path(tmp)
            svc = Service(url, root, kind)
            try:
                res["service_first_start_s"] = round(svc.start(), 3)
                res["claims"] = drain_claims(svc, root, records // 2, watch, kind)
                res["plain"] = drain_plain(svc, root, records, watch, kind)
            finally:
                svc.stop(signal.SIGTERM)
                res["service_log_tracebacks"] = svc.tracebacks()
                if res["service_log_tracebacks"]:
                    print(f"  ! the service logged tracebacks:\n{svc.log_tail()}")
        res["loadavg_end"] = loadavg()
        res["client_log"] = logs.take()
        results[kind] = res
    return results


# --------------------------------------------------------------------------- part 2: Spark


class SparkRun:
    """One source job (rate source -> Iceberg) against a service subprocess on SQLite."""

    def __init__(
        self, spark: Any, root: Path, job: str, rows_per_second: int, outbox_options: Any
    ) -> None:
        root.mkdir(parents=True)
        self.spark = spark
        self.root = root
        self.db_url = f"sqlite:///{root / 'metaservice.db'}"
        self.warehouse = str(root / "tables")
        self.state = root / "state"
        self.job_name = job
        self.table_name = f"ods.{job}"
        self.rows_per_second = rows_per_second
        self.outbox_options = outbox_options
        self.svc = Service(self.db_url, root, job)
        self.job: Any = None
        self.query: Any = None

    def register_and_start(self) -> None:
        import spark_barrier
        from examples.warehouse_pipeline import ORDERS_SCHEMA, order_changes

        self.job = spark_barrier.register(
            self.spark,
            self.svc.url,
            job=self.job_name,
            outputs={self.table_name: ORDERS_SCHEMA},
            description="bench_outage source job",
            catalog_uri=self.db_url,
            warehouse=self.warehouse,
            state_dir=self.state,
            outbox_options=self.outbox_options,
        )
        # The demo's order feed, its change records taken as plain appends.
        stream = order_changes(self.spark, self.rows_per_second).select(*ORDERS_SCHEMA.fieldNames())
        self.query = self.job.start(stream, self.job.sink(), trigger_seconds=1.0)

    @property
    def outbox(self) -> Any:
        return self.job.reporter.outbox

    def stamped(self) -> list[Any]:
        from spark_barrier.iceberg.stamps import list_stamped_snapshots

        return list_stamped_snapshots(self.job.catalog.load_table(self.table_name))

    def wait_for_snapshots(self, n: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while (count := len(self.stamped())) < n:
            if not self.query.isActive:
                raise RuntimeError(f"query stopped: {self.query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {count} snapshots after {timeout_s} s")
            time.sleep(0.5)
        return count

    def stop_query(self) -> None:
        import spark_barrier

        if self.query is not None and self.query.isActive:
            spark_barrier.stop_between_batches(self.query)

    def verify(self, client: MetaServiceClient) -> dict[str, Any]:
        """Every snapshot stamped in the table is in the service's mapping, same barrier."""
        stamped = {(s.snapshot_id, s.barrier, s.batch) for s in self.stamped()}
        mapped = {
            (m.snapshot_id, m.barrier, m.batch_id)
            for m in service_mapping(client, self.table_name)
            if m.snapshot_id is not None
        }
        return {
            "iceberg_stamped_snapshots": len(stamped),
            "service_mapping_snapshots": len(mapped),
            "missing_from_service": len(stamped - mapped),
            "unknown_to_iceberg": len(mapped - stamped),
            "every_snapshot_reported": stamped == mapped,
        }


def outbox_records_after(outbox: Any, seq: int) -> dict[str, Any]:
    """Records appended after ``seq`` (still unacknowledged): counts and frame bytes by kind."""
    counts: Counter[str] = Counter()
    frame_bytes: Counter[str] = Counter()
    for entry in outbox.pending():
        if entry.seq <= seq:
            continue
        kind = entry.record.get("kind", "commit")
        payload = json.dumps(entry.record, ensure_ascii=False, separators=(",", ":"))
        counts[kind] += 1
        frame_bytes[kind] += HEADER_BYTES + len(payload.encode())
    return {
        "records": dict(counts),
        "frame_bytes": dict(frame_bytes),
        "mean_frame_bytes": {k: round(frame_bytes[k] / counts[k], 1) for k in counts},
    }


def first_error_line(error: Any) -> str | None:
    if error is None:
        return None
    text = str(error)
    for line in text.splitlines():
        if "OutboxFullError:" in line:  # the exception line, not the `raise` in the traceback
            return line.strip()[:1000]
    return text.splitlines()[0][:1000] if text else repr(error)


def spark_outage(
    spark: Any, root: Path, outage_s: float, rows_per_second: int, watch: LoadWatch
) -> dict[str, Any]:
    """Run 1: default outbox bound; SIGKILL the service for ``outage_s``, then restart."""
    run = SparkRun(spark, root, "outage_orders", rows_per_second, None)
    out: dict[str, Any] = {"outage_target_s": outage_s, "rows_per_second": rows_per_second}
    try:
        run.svc.start()
        run.register_and_start()
        print("  [spark] query started; waiting for 5 batches committed online ...")
        with watch.phase("spark/online"):
            t0 = time.monotonic()
            online_start = run.wait_for_snapshots(1, 300)
            t_first = time.monotonic()
            run.wait_for_snapshots(online_start + 5, 300)
            online_n = len(run.stamped())
            out["online"] = {
                "first_snapshot_after_start_s": round(t_first - t0, 1),
                "batches_per_s": round((online_n - online_start) / (time.monotonic() - t_first), 3),
            }
        box = run.outbox
        before = run.stamped()
        seq0, size0 = box.last_seq, box.size_bytes
        run.svc.stop(signal.SIGKILL)
        killed = time.monotonic()
        print(f"  [spark] MetaService SIGKILLed with {len(before)} snapshots in the table")
        samples = []
        with watch.phase("spark/outage"):
            while (elapsed := time.monotonic() - killed) < outage_s:
                time.sleep(min(2.0, max(0.0, outage_s - elapsed)))
                n = len(run.stamped())
                samples.append(
                    {
                        "t_s": round(time.monotonic() - killed, 1),
                        "snapshots_since_kill": n - len(before),
                        "outbox_bytes": box.size_bytes,
                        "outbox_backlog": box.backlog,
                        "load_1m": round(os.getloadavg()[0], 2),
                        "query_active": run.query.isActive,
                    }
                )
                if not run.query.isActive:
                    break
            after = run.stamped()
            seq1, size1, duration = box.last_seq, box.size_bytes, time.monotonic() - killed
        new = after[len(before) :]
        batches = len(new)
        growth = size1 - size0
        records = outbox_records_after(box, seq0)
        claims = records["records"].get("claim", 0)
        mean = records["mean_frame_bytes"]
        per_batch_exact = mean.get("claim", 0) + mean.get("commit", 0)
        per_batch = growth / batches if batches else None
        out["outage"] = {
            "seconds": round(duration, 1),
            "query_active_throughout": run.query.isActive,
            "query_exception": first_error_line(run.query.exception()),
            "snapshots_committed_during_outage": batches,
            "batches_per_s_during_outage": round(batches / duration, 3),
            "distinct_barriers_during_outage": len({s.barrier for s in new}),
            "outbox_records_appended": seq1 - seq0,
            "outbox_records_by_kind": records["records"],
            "claims": claims,
            "outbox_bytes_at_kill": size0,
            "outbox_bytes_at_end": size1,
            "outbox_bytes_growth": growth,
            "outbox_bytes_per_batch": round(per_batch, 1) if per_batch else None,
            "mean_frame_bytes_by_kind": mean,
            "claim_plus_commit_frame_bytes": round(per_batch_exact, 1),
            "samples": samples,
        }
        print(
            f"  [spark] outage of {duration:.0f} s: {batches} snapshots committed, "
            f"{claims} claims, outbox +{growth:,} bytes ({out['outage']['outbox_bytes_per_batch']} "
            f"bytes/batch), query active: {run.query.isActive}"
        )
        if per_batch:
            out["projection_default_bound"] = {
                "note": "computed from the measured bytes per batch, not measured",
                "max_bytes": DEFAULT_MAX_BYTES,
                "bytes_per_batch": round(per_batch, 1),
                "batches": int(DEFAULT_MAX_BYTES // per_batch),
                "days_at_1_batch_per_s": round(DEFAULT_MAX_BYTES / per_batch / 86400, 1),
                "days_at_measured_batch_rate": round(
                    DEFAULT_MAX_BYTES / per_batch / (batches / duration) / 86400, 1
                )
                if batches
                else None,
            }
        # The service comes back: the backlog drains, every snapshot is reported.
        with watch.phase("spark/recovery"):
            out["service_restart_s"] = round(run.svc.start(), 3)
            ready = time.perf_counter()
            backlog_at_ready = box.backlog
            out["recovery"] = {
                "backlog_at_restart": backlog_at_ready,
                **wait_drained(run.job.reporter, ready, timeout_s=900),
            }
            print(f"  [spark] service back: {out['recovery']}")
            # A few batches online again: the job reported in, the frontier moved on.
            n = len(run.stamped())
            with contextlib.suppress(RuntimeError):
                run.wait_for_snapshots(n + 3, 120)
            pending_after_drain = run.job.offline.controls_pending()
            client = MetaServiceClient(run.svc.url)
            frontier = client.get_table(run.table_name).frontier
            last_outage_barrier = max((s.barrier for s in new), default=None)
            out["recovery"]["frontier_after_recovery"] = frontier
            out["recovery"]["last_barrier_claimed_in_outage"] = last_outage_barrier
            out["recovery"]["frontier_passed_the_outage"] = (
                frontier is not None
                and last_outage_barrier is not None
                and frontier >= last_outage_barrier
            )
            run.stop_query()
            run.job.close()
            out["verify"] = run.verify(client)
            out["verify"]["claims_undelivered_before_stop"] = pending_after_drain
            out["verify"]["grant_released"] = client.get_job(run.job_name).offline_floor is None
            client.close()
            print(f"  [spark] verify: {out['verify']}")
    finally:
        run.stop_query()
        run.svc.stop(signal.SIGTERM)
        out["service_log_tracebacks"] = run.svc.tracebacks()
    return out


def spark_small_bound(
    spark: Any,
    root: Path,
    max_bytes: int,
    timeout_s: float,
    rows_per_second: int,
    watch: LoadWatch,
) -> dict[str, Any]:
    """Run 2: a small outbox bound; keep the service down until the query fails."""
    run = SparkRun(spark, root, "outage_small", rows_per_second, {"max_bytes": max_bytes})
    out: dict[str, Any] = {"max_bytes": max_bytes, "timeout_s": timeout_s}
    try:
        run.svc.start()
        run.register_and_start()
        print(f"  [small bound {max_bytes:,} bytes] query started; 3 batches online ...")
        run.wait_for_snapshots(3, 300)
        run.wait_for_snapshots(len(run.stamped()) + 3, 300)
        box = run.outbox
        before = run.stamped()
        size0 = box.size_bytes
        run.svc.stop(signal.SIGKILL)
        killed = time.monotonic()
        print("  [small bound] MetaService SIGKILLed; running until OutboxFullError ...")
        with watch.phase("spark_small/outage"):
            last_print = killed
            while run.query.isActive and time.monotonic() - killed < timeout_s:
                time.sleep(0.5)
                if time.monotonic() - last_print > 30:
                    last_print = time.monotonic()
                    print(
                        f"    {last_print - killed:5.0f} s: outbox {box.size_bytes:,} bytes, "
                        f"backlog {box.backlog}"
                    )
            stopped = time.monotonic()
        after = run.stamped()
        error = run.query.exception()
        text = str(error) if error is not None else ""
        new = after[len(before) :]
        records = outbox_records_after(box, 0)
        commits_in_outbox = {
            (e.record["batch_id"])
            for e in box.pending()
            if e.record.get("kind", "commit") == "commit"
        }
        unreported = [s.batch for s in new if s.batch not in commits_in_outbox]
        out["failure"] = {
            "query_failed": not run.query.isActive,
            "seconds_until_failure": round(stopped - killed, 1),
            "snapshots_committed_during_outage": len(new),
            "error": first_error_line(error),
            "error_is_outbox_full": "OutboxFullError" in text,
            "failed_in": (
                "claim (before the Iceberg commit)"
                if "barrier_for" in text or "in claim" in text
                else "commit report (after the Iceberg commit)"
                if "_report" in text
                else "unknown"
            ),
            "outbox_bytes_at_kill": size0,
            "outbox_bytes_at_failure": box.size_bytes,
            "outbox_backlog_at_failure": box.backlog,
            "outbox_records_by_kind": records["records"],
            "snapshots_committed_but_not_in_outbox": unreported,
        }
        print(f"  [small bound] {out['failure']}")
        if not run.query.isActive:
            # Recovery: service back, job closed (drains), registered and started again
            # from its checkpoint (the failed batch is replayed), then verified.
            with watch.phase("spark_small/recovery"):
                run.svc.start()
                ready = time.perf_counter()
                out["recovery"] = wait_drained(run.job.reporter, ready, timeout_s=900)
                run.job.close(timeout=600)  # release (the outbox has room again), close
                run.register_and_start()
                n = len(run.stamped())
                with contextlib.suppress(RuntimeError):
                    run.wait_for_snapshots(n + 3, 180)
                run.stop_query()
                run.job.close()
                client = MetaServiceClient(run.svc.url)
                out["recovery"]["verify"] = run.verify(client)
                client.close()
            print(f"  [small bound] after restart: {out['recovery']}")
    finally:
        run.stop_query()
        run.svc.stop(signal.SIGTERM)
        out["service_log_tracebacks"] = run.svc.tracebacks()
    return out


def part_spark(
    outage_s: float,
    small_bytes: int,
    small_timeout_s: float,
    rows_per_second: int,
    watch: LoadWatch,
    logs: LogCounter,
) -> dict[str, Any]:
    import spark_barrier

    res: dict[str, Any] = {"loadavg_start": loadavg()}
    spark = spark_barrier.local_spark_builder("bench-outage").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-outage-spark-") as tmp:
            print("a Spark source job through an outage ...")
            res["run_default_bound"] = spark_outage(
                spark, Path(tmp) / "run1", outage_s, rows_per_second, watch
            )
            res["client_log_run_default_bound"] = logs.take()
            print(f"a Spark source job with max_bytes={small_bytes:,} until the outbox is full ...")
            res["run_small_bound"] = spark_small_bound(
                spark, Path(tmp) / "run2", small_bytes, small_timeout_s, rows_per_second, watch
            )
            res["client_log_run_small_bound"] = logs.take()
    finally:
        spark.stop()
    res["loadavg_end"] = loadavg()
    return res


# --------------------------------------------------------------------------- main


def project_full_outbox(out: dict[str, Any]) -> dict[str, Any] | None:
    """How long a full default-bound outbox of offline batches would take to drain, from
    the measured bytes per batch (Spark part) and claims drain rate (drain part)."""
    try:
        per_batch = out["spark"]["run_default_bound"]["outage"]["outbox_bytes_per_batch"]
    except (KeyError, TypeError):
        return None
    if not per_batch:
        return None
    records = 2 * DEFAULT_MAX_BYTES / per_batch  # a claim and a commit report per batch
    result: dict[str, Any] = {
        "note": "computed from measured figures, not measured",
        "bytes_per_offline_batch": per_batch,
        "records_in_a_full_1_GiB_outbox": int(records),
    }
    for kind, res in out.get("drain", {}).items():
        rate = res.get("claims", {}).get("drain", {}).get("records_per_s_after_first_ack")
        if rate:
            result[f"drain_hours_at_{kind}_claims_rate"] = round(records / rate / 3600, 1)
            result[f"{kind}_claims_rate_records_per_s"] = rate
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/outage.json"))
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--part", choices=["drain", "spark", "all"], default="all")
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg-url", default=os.environ.get("METASERVICE_TEST_PG_URL", DEFAULT_PG))
    parser.add_argument("--records", type=int, help="backlog records (default 10,000; quick 1,000)")
    parser.add_argument("--outage-seconds", type=float, help="default 60; quick 20")
    parser.add_argument("--small-max-bytes", type=int, help="default 64 KiB; quick 8 KiB")
    parser.add_argument("--small-timeout", type=float, help="seconds; default 1800, quick 300")
    parser.add_argument("--rows-per-second", type=int, default=50, help="rate source (demo: 50)")
    args = parser.parse_args(argv)
    records = args.records or (1_000 if args.quick else 10_000)
    outage_s = args.outage_seconds or (20.0 if args.quick else 60.0)
    small_bytes = args.small_max_bytes or (8 * 1024 if args.quick else 64 * 1024)
    small_timeout = args.small_timeout or (300.0 if args.quick else 1800.0)

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logs = LogCounter()
    for name in ("spark_barrier", "metaservice"):
        logging.getLogger(name).addHandler(logs)

    out: dict[str, Any] = {
        "benchmark": "bench_outage",
        "mode": "quick" if args.quick else "full",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_facts(),
        "loadavg": {"start": loadavg()},
        "settings": {
            "records": records,
            "outage_seconds": outage_s,
            "small_max_bytes": small_bytes,
            "small_timeout_s": small_timeout,
            "rows_per_second": args.rows_per_second,
            "service": "metaservice start --log-level warning (one uvicorn worker)",
            "outbox": "defaults: fsync=always, segment 4 MiB, delivery batches of 100",
        },
    }
    m = out["machine"]
    print(f"machine: {m['nproc']} CPUs, {m['cpu_model']}; load {out['loadavg']['start']}")
    watch = LoadWatch()
    try:
        if args.part in ("drain", "all"):
            kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
            out["drain"] = part_drain(kinds, args.pg_url, records, watch, logs)
            out["loadavg"]["after_drain"] = loadavg()
        if args.part in ("spark", "all"):
            out["spark"] = part_spark(
                outage_s, small_bytes, small_timeout, args.rows_per_second, watch, logs
            )
        out["projection_full_outbox"] = project_full_outbox(out)
    finally:
        watch.close()
        out["loadavg"]["end"] = loadavg()
        out["loadavg_1m_by_phase"] = watch.phases
        out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
