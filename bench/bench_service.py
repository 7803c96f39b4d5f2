"""Benchmark the MetaService over HTTP on loopback, against a real service process.

Writes (per database, SQLite and/or PostgreSQL):

- barrier assignments per second (``POST /jobs/{job}/batches/{id}/barrier``), 1 and 16
  concurrent clients, each client a thread with its own keep-alive ``httpx.Client`` and
  its own source jobs (64 jobs, so clients never queue on one job row);
- commit reports per second, single (``POST /commits``) and batched (``POST
  /commits/batch`` with 100 or 500 reports), 1 and 16 clients. A report needs a batch
  with a barrier, so barriers are assigned first (timed as above) and the reports after.

Reads, on a topology of 10,000 jobs and 10,000 tables bulk-inserted with SQLAlchemy Core
(a layered DAG: sources, then five derived layers, fan-in 1-3, five committed barriers
with some jobs lagging one barrier behind):

- ``GET /versions/consistent`` latency p50/p99 for random sets of 2, 10 and 50 tables;
- ``GET /lineage`` upstream latency, depth unlimited and depth 3, from the top layers;
- the first lineage call, which builds the service's cached graph of 20,000 nodes.

Cycles (``--part cycles``), 16 clients on one service with 100 ms barrier slots, each
client looping for a fixed time; every figure is a request rate set against the
``GET /healthz`` rate measured at the same concurrency in the same run (the floor of
HTTP, routing and JSON on this machine):

- source batch cycles: a new batch's barrier, then its commit report (each client owns
  its own source jobs);
- derived batch cycles: ``next-barrier``, the batch's barrier, its report, with the
  client's own source advanced in between (those two requests counted too);
- ``next-barrier`` polls of a derived job whose source is idle (the service seals the
  source and advances the job each slot, as for any idle pipeline);
- beside them, the floors of SQL alone on the service's own path (``bench/floor_app.py``,
  the factory this part runs the service from): one ``SELECT 1`` outside a transaction,
  four in a read transaction, five and an ``UPDATE`` in a write transaction, and those
  six on a Core connection (no ORM Session) and on a raw DB-API connection.

Growth (``--part growth``, results in ``bench/results/service-growth.json``): the same
layered topology at 1,000, 10,000 and 100,000 tables, its history grown (bulk
``INSERT ... SELECT``) to about 10,000, 1 million and 10 million commits, and at each
point the p50/p99 latency of the hot requests next to ``GET /healthz`` from the same
service in the same run: a source batch's barrier and report, a derived batch's
next-barrier, barrier and report, the consistent version of 10 tables, lineage upstream
at depth 3, a table, its snapshots in the newest slots, a page of tables. ``--quick``
stops at 10,000 tables and 1 million commits. See bench/README.md.

Fleet (``--part fleet``, results in ``bench/results/service-fleet.json``), PostgreSQL: a
simulated driver per job of build_topology's layered DAG (``--jobs``, 40 % sources) at
1 s barriers, each sending what spark_barrier sends: a source each second its batch's
barrier, carrying the last batch's report, progress and offline-grant promise (one
request per batch; the grant's heartbeat only in a slot no request reported in); a
derived job long-polling ``next-barrier`` until its sources agree on a new end, then
the barrier (carrying its last progress) and the report. Beside them, real
spark_barrier client code (``bench/requests_per_batch.py``: two sources and a derived
job of two inputs) counts the requests it sends per batch (goal: source 1, derived
<= 3); ``--part requests`` runs that count alone. Measured over ``--seconds`` after a
warm-up: barrier latency
p50/p99 (goal p99 <= 50 ms), requests served per second by kind, batches per job per
second and the slots they skipped, CPU of the load generator, the service and
PostgreSQL, beside ``GET /healthz`` of the same service. ``--part replicas``: the
same at the largest ``--jobs`` against one and then two single-worker replicas of the
service on one database (drivers split between them), and their ratio (goal >= 1.7).

Latencies are measured by one client, sequentially, and include HTTP and JSON on
loopback. The service runs as ``uvicorn --factory metaservice.app:create_app`` (what
``metaservice start`` runs), started and stopped by this script on a free port.

Usage:
    python -m bench.bench_service [--out bench/results/service.json] [--quick]
                                  [--db sqlite|postgres|both] [--workers 1]
                                  [--part writes|cycles|reads|growth|fleet|replicas|requests|all]
                                  [--label NAME] [--tables 1000,...] [--commits 10000,...]
                                  [--jobs 1000,...] [--seconds 60] [--wait-ms 2000]
PostgreSQL URL: --pg-url, else METASERVICE_TEST_PG_URL, else
postgresql+psycopg://postgres@127.0.0.1:5432/test. Each part runs in its own schema,
dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from sqlalchemy import create_engine, event, insert, text, update

from bench.common import package_version, pg_schema, process_cpu_s
from bench.floor_app import FACTORY as PROBE_FACTORY
from bench.floor_app import create_probe_rows
from bench.requests_per_batch import print_requests_per_batch, requests_per_batch
from metaservice.db import make_engine, normalise_url
from metaservice.migrate import upgrade
from metaservice.models import DERIVED, SOURCE, Batch, ClockState, Commit, Job, JobInput, Table

API = "/api/v1"
INTERVAL_MS = 1000
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
WRITE_JOBS = 64
# Extra arguments for every service's uvicorn (--uvicorn-http, --uvicorn-loop); without
# them uvicorn picks httptools and uvloop when they are installed (its "auto").
UVICORN_ARGS: list[str] = []


# --------------------------------------------------------------------------- machine


def machine_facts(pg_base: str | None, dbs: list[str]) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "packages": {
            p: package_version(p)
            for p in (
                "fastapi",
                "starlette",
                "uvicorn",
                "httptools",  # uvicorn's HTTP parser when installed, else h11
                "uvloop",  # uvicorn's event loop when installed, else asyncio
                "sqlalchemy",
                "psycopg",
                "httpx",
                "pydantic",
            )
        },
        "uvicorn_args": UVICORN_ARGS,
        "loadavg_at_start": _loadavg(),
        "calibration_ms_at_start": calibration_ms(),
        "cpu_share_at_start": cpu_share(),
    }
    if "postgres" in dbs and pg_base:
        engine = create_engine(pg_base)
        try:
            with engine.connect() as conn:
                facts["postgresql"] = conn.execute(text("SHOW server_version")).scalar_one()
                facts["postgresql_settings"] = {
                    name: conn.execute(text(f"SHOW {name}")).scalar_one()
                    for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections")
                }
        finally:
            engine.dispose()
    return facts


def calibration_ms() -> float:
    """Best of 5 of ``sum(range(10**6))``: about 12-15 ms on an idle modern core; more
    means this process got less CPU (a shared or loaded machine), and every figure with it."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        sum(range(10**6))
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def cpu_share(seconds: float = 0.5) -> float:
    """CPU time this process got while spinning for ``seconds`` of wall time: 1.0 on an
    otherwise idle machine; 0.3 means other processes took 70 % of this core meanwhile."""
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        sum(range(10_000))
    return (time.process_time() - c0) / (time.perf_counter() - t0)


def wait_for_idle(limit_s: float) -> None:
    """Wait up to ``limit_s`` for the 1-minute load average to fall below the core count."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        load = _loadavg()
        if load is None or load[0] < (os.cpu_count() or 1):
            return
        print(f"waiting for the machine to calm down: load average {load[0]}", flush=True)
        time.sleep(min(30.0, max(0.0, deadline - time.monotonic())))


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


# --------------------------------------------------------------------------- databases


@contextmanager
def database(kind: str, pg_base: str, workdir: Path, name: str) -> Iterator[str]:
    """An empty database of ``kind``, migrated to head; removed afterwards."""
    if kind == "sqlite":
        url = f"sqlite:///{workdir / (name + '.db')}"
        upgrade(url)
        yield url
        return
    with pg_schema(pg_base, f"bench_{name}") as url:
        upgrade(url)
        yield url


# --------------------------------------------------------------------------- the service


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def service(
    db_url: str,
    workdir: Path,
    workers: int,
    env_extra: dict[str, str] | None = None,
    factory: str = "metaservice.app:create_app",
) -> Iterator[Server]:
    """``uvicorn --factory metaservice.app:create_app`` (or ``factory``) on a free
    loopback port."""
    port = _free_port()
    log = workdir / f"service-{port}.log"
    env = {**os.environ, "METASERVICE_DB_URL": db_url, "PYTHONUNBUFFERED": "1"}
    env.update(env_extra or {})
    # the project's root on the path, after any given (a PYTHONPATH naming another tree
    # still decides which code runs): a factory from bench/ imports as bench.*
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH"), str(Path(__file__).resolve().parents[1])) if p
    )
    cmd = [sys.executable, "-m", "uvicorn", "--factory", factory]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    cmd += ["--workers", str(workers), *UVICORN_ARGS]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=2) as http:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"service exited: {log.read_text(errors='replace')}")
                try:
                    if http.get(server.url + "/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"service not ready: {log.read_text(errors='replace')}")
                time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text_log = log.read_text(errors="replace")
    if "Traceback" in text_log:
        print(f"  ! the service logged errors, see {log}:\n{text_log[-2000:]}", file=sys.stderr)


def in_threads(
    n: int,
    base_url: str,
    work: Callable[[int, httpx.Client], None],
    at_start: Callable[[], None] | None = None,
) -> float:
    """Run ``work(i, client)`` in n threads started together; seconds until all finished.
    ``at_start`` runs once every thread is connected, as the clock starts."""
    start = threading.Barrier(n + 1, action=at_start)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        with httpx.Client(base_url=base_url + API, timeout=120) as client:
            client.get("/jobs", params={"limit": 1})  # connect before the clock starts
            start.wait()
            try:
                work(i, client)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


def _ok(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 300:
        raise RuntimeError(
            f"{response.request.method} {response.request.url} -> {response.status_code}: "
            f"{response.text[:300]}"
        )
    return response.json()  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- writes


class WriteBench:
    """64 source jobs with one output each; client i of c owns jobs i, i+c, i+2c, ..."""

    def __init__(self, server: Server, db: str) -> None:
        self.server = server
        self.db = db
        self.next_batch = dict.fromkeys(range(WRITE_JOBS), 0)
        self.next_snapshot = 1
        self.lock = threading.Lock()
        with httpx.Client(base_url=server.url + API, timeout=60) as http:
            for j in range(WRITE_JOBS):
                _ok(http.put(f"/jobs/w{j:03d}", json={"outputs": [f"bench.w{j:03d}"]}))

    def assign(self, clients: int, count: int) -> tuple[list[list[dict[str, Any]]], float]:
        """Give ``count`` new batches barriers; per client, the reports to send."""
        per_client: list[list[dict[str, Any]]] = [[] for _ in range(clients)]
        plan: list[list[tuple[int, int, int]]] = [[] for _ in range(clients)]
        for k in range(count):
            c = k % clients
            mine = [j for j in range(WRITE_JOBS) if j % clients == c]
            j = mine[(k // clients) % len(mine)]
            plan[c].append((j, self.next_batch[j], self.next_snapshot))
            self.next_batch[j] += 1
            self.next_snapshot += 1

        def work(i: int, http: httpx.Client) -> None:
            for j, batch_id, snapshot in plan[i]:
                body = _ok(http.post(f"/jobs/w{j:03d}/batches/{batch_id}/barrier"))
                per_client[i].append(
                    {
                        "job": f"w{j:03d}",
                        "batch_id": batch_id,
                        "barrier": body["barrier"],
                        "table": f"bench.w{j:03d}",
                        "snapshot_id": snapshot,
                    }
                )

        return per_client, in_threads(clients, self.server.url, work)

    def report(self, per_client: list[list[dict[str, Any]]], batch_size: int | None) -> float:
        def work(i: int, http: httpx.Client) -> None:
            reports = per_client[i]
            if batch_size is None:
                for r in reports:
                    if _ok(http.post("/commits", json=r))["status"] != "recorded":
                        raise RuntimeError(f"not recorded: {r}")
                return
            for k in range(0, len(reports), batch_size):
                chunk = reports[k : k + batch_size]
                body = _ok(http.post("/commits/batch", json={"commits": chunk}))
                if body["recorded"] != len(chunk):
                    raise RuntimeError(f"{body['recorded']} of {len(chunk)} recorded")

        return in_threads(len(per_client), self.server.url, work)


def bench_writes(server: Server, db: str, quick: bool) -> list[dict[str, Any]]:
    bench = WriteBench(server, db)
    # (mode, reports per POST or None, clients, reports)
    if quick:
        plan = [
            ("single", None, 1, 200),
            ("single", None, 16, 320),
            ("batch100", 100, 1, 500),
            ("batch100", 100, 16, 1600),
            ("batch500", 500, 1, 1000),
        ]
    else:
        plan = [
            ("single", None, 1, 1000),
            ("single", None, 16, 2400),
            ("batch100", 100, 1, 3000),
            ("batch100", 100, 16, 4800),  # 3 requests per client
            ("batch500", 500, 1, 5000),
            ("batch500", 500, 16, 8000),  # 1 request per client
        ]
    rows = []
    for mode, size, clients, count in plan:
        per_client, seconds = bench.assign(clients, count)
        rows.append(
            _row(db, "barrier assignments", f"before {mode}", clients, count, seconds, count)
        )
        seconds = bench.report(per_client, size)
        requests = count if size is None else sum(-(-len(p) // size) for p in per_client)
        rows.append(_row(db, "commit reports", mode, clients, count, seconds, requests))
        print(
            f"  {rows[-2]['what']:20} {clients:3} clients {rows[-2]['per_s']:9,.0f}/s   "
            f"{mode:9} reports {rows[-1]['per_s']:9,.0f}/s ({rows[-1]['requests_per_s']:,.0f} req/s)"
        )
    return rows


def _row(
    db: str, what: str, mode: str, clients: int, count: int, seconds: float, requests: int
) -> dict[str, Any]:
    return {
        "db": db,
        "what": what,
        "mode": mode,
        "clients": clients,
        "count": count,
        "seconds": round(seconds, 4),
        "per_s": count / seconds,
        "requests_per_s": requests / seconds,
    }


# --------------------------------------------------------------------------- cycles

CYCLE_CLIENTS = 16
# Short slots, so a derived job may take a batch every 100 ms (with 1 s slots its loop
# would be mostly "not ready" polls); the clock row is then raised 10 times a second.
CYCLE_INTERVAL_MS = 100


def _for_a_while(seconds: float, step: Callable[[], int]) -> int:
    """Call ``step`` (which answers how many requests it made) until the time is up."""
    requests, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        requests += step()
    return requests


def _rate(
    server: Server, seconds: float, step_of: Callable[[int, httpx.Client], Any]
) -> tuple[float, float | None]:
    """Requests per second of 16 clients, client i looping ``step_of(i, http)()``, and
    the service's CPU per request meanwhile (ms; None with several workers)."""
    counts = [0] * CYCLE_CLIENTS
    cpu: list[float | None] = []

    def work(i: int, http: httpx.Client) -> None:
        counts[i] = _for_a_while(seconds, step_of(i, http))

    def start_meter() -> None:
        cpu.append(_proc_cpu_s(server.proc.pid))

    elapsed = in_threads(CYCLE_CLIENTS, server.url, work, start_meter)
    after = _proc_cpu_s(server.proc.pid)
    total = sum(counts)
    per_request = None
    if cpu and cpu[0] is not None and after is not None and total:
        per_request = (after - cpu[0]) * 1000 / total
    return total / elapsed, per_request


class _SourceLoop:
    """A client's source job: each step a new batch's barrier and its report."""

    def __init__(self, http: httpx.Client, job: str, table: str, snapshot_base: int) -> None:
        self.http, self.job, self.table = http, job, table
        self.batch, self.snapshot = 0, snapshot_base

    def __call__(self) -> int:
        b = _ok(self.http.post(f"/jobs/{self.job}/batches/{self.batch}/barrier"))["barrier"]
        report = {"job": self.job, "batch_id": self.batch, "barrier": b, "table": self.table}
        _ok(self.http.post("/commits", json={**report, "snapshot_id": self.snapshot}))
        self.batch += 1
        self.snapshot += 1
        return 2


class _DerivedLoop:
    """A client's derived job reading its own source: advance the source, then
    next-barrier, the batch's barrier and its report once ready."""

    def __init__(self, http: httpx.Client, i: int) -> None:
        self.http, self.job, self.table = http, f"cd{i:02d}", f"bench.cd{i:02d}"
        self.source = _SourceLoop(http, f"cs{i:02d}", f"bench.cs{i:02d}", 10_000_000 * (i + 1))
        self.batch, self.snapshot = 0, 10_000_000 * (i + 1) + 5_000_000

    def __call__(self) -> int:
        requests = self.source()
        nxt = _ok(self.http.get(f"/jobs/{self.job}/next-barrier"))
        requests += 1
        if not nxt["ready"]:
            return requests  # the source's slot is not closed yet
        body = {"start": nxt["start_barrier"], "end": nxt["barrier"]}
        b = _ok(self.http.post(f"/jobs/{self.job}/batches/{self.batch}/barrier", json=body))
        report = {"job": self.job, "batch_id": self.batch, "barrier": b["barrier"]}
        _ok(
            self.http.post(
                "/commits", json={**report, "table": self.table, "snapshot_id": self.snapshot}
            )
        )
        self.batch += 1
        self.snapshot += 1
        return requests + 2


def bench_cycles(server: Server, db: str, quick: bool) -> list[dict[str, Any]]:
    seconds = 3.0 if quick else 15.0
    with httpx.Client(base_url=server.url + API, timeout=60) as http:
        for i in range(CYCLE_CLIENTS):
            _ok(http.put(f"/jobs/cw{i:02d}", json={"outputs": [f"bench.cw{i:02d}"]}))
            _ok(http.put(f"/jobs/cs{i:02d}", json={"outputs": [f"bench.cs{i:02d}"]}))
            _ok(
                http.put(
                    f"/jobs/cd{i:02d}",
                    json={"inputs": [f"bench.cs{i:02d}"], "outputs": [f"bench.cd{i:02d}"]},
                )
            )
            # a derived job polling an idle source (its frontier follows the clock): each
            # slot the service seals the source and advances the idle job
            _ok(http.put(f"/jobs/cq{i:02d}", json={"outputs": [f"bench.cq{i:02d}"]}))
            body = {"inputs": [f"bench.cq{i:02d}"], "outputs": [f"bench.cn{i:02d}"]}
            _ok(http.put(f"/jobs/cn{i:02d}", json=body))

    def healthz(i: int, http: httpx.Client) -> Callable[[], int]:
        url = server.url + "/healthz"
        return lambda: (_ok(http.get(url)), 1)[1]

    def source(i: int, http: httpx.Client) -> Callable[[], int]:
        return _SourceLoop(http, f"cw{i:02d}", f"bench.cw{i:02d}", 1_000_000 * (i + 1))

    loops: list[_DerivedLoop] = []

    def derived(i: int, http: httpx.Client) -> Callable[[], int]:
        loops.append(_DerivedLoop(http, i))
        return loops[-1]

    def poll(i: int, http: httpx.Client) -> Callable[[], int]:
        return lambda: (_ok(http.get(f"/jobs/cn{i:02d}/next-barrier")), 1)[1]

    def events(minimal: bool) -> Callable[[int, httpx.Client], Callable[[], int]]:
        # The listener's progress event; with Prefer: return=minimal as spark_barrier
        # sends it (a service that ignores the preference answers the job's view).
        headers = {"Prefer": "return=minimal"} if minimal else {}

        def step_of(i: int, http: httpx.Client) -> Callable[[], int]:
            path = f"/jobs/cs{i:02d}/events"
            body = {"event": "progress", "run_id": "bench", "batch_id": 1, "num_input_rows": 1}

            def step() -> int:
                response = http.post(path, json=body, headers=headers)
                if response.status_code >= 300:
                    raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
                return 1

            return step

        return step_of

    floor, floor_cpu = _rate(server, seconds, healthz)
    rows = [
        {
            "db": db,
            "what": "GET /healthz",
            "clients": CYCLE_CLIENTS,
            "requests_per_s": floor,
            "service_cpu_ms_per_request": floor_cpu,
        }
    ]

    def probe(method: str, path: str) -> Callable[[int, httpx.Client], Callable[[], int]]:
        def step_of(i: int, http: httpx.Client) -> Callable[[], int]:
            url = server.url + path.format(i=i)
            return lambda: (_ok(http.request(method, url)), 1)[1]

        return step_of

    for what, step_of, goal in (
        # the floors: SQL alone through the service's stack (bench/floor_app.py)
        ("floor: 1 SELECT 1, no transaction", probe("GET", "/probe/one"), None),
        ("floor: 4 SELECT 1 in a read transaction", probe("GET", "/probe/read4"), None),
        (
            "floor: 5 SELECT 1 + 1 UPDATE, write transaction",
            probe("POST", "/probe/write6/{i}"),
            None,
        ),
        ("floor: the same 6 on a Core connection", probe("POST", "/probe/core6/{i}"), None),
        ("floor: the same 6 on a raw DB-API connection", probe("POST", "/probe/raw6/{i}"), None),
        ("source batch cycles (barrier + report)", source, 0.5),
        ("derived batch cycles (source, next-barrier, barrier, report)", derived, 0.5),
        ("next-barrier polls, inputs idle", poll, 0.8),
        ("listener events (POST /jobs/{job}/events)", events(False), None),
        ("listener events, Prefer: return=minimal", events(True), None),
    ):
        rate, cpu_ms = _rate(server, seconds, step_of)
        rows.append(
            {
                "db": db,
                "what": what,
                "clients": CYCLE_CLIENTS,
                "requests_per_s": rate,
                "of_healthz": rate / floor,
                "goal_of_healthz": goal,
                "service_cpu_ms_per_request": cpu_ms,
            }
        )
    derived_row = next(r for r in rows if r["what"].startswith("derived batch cycles"))
    derived_row["derived_batches_per_s"] = sum(loop.batch for loop in loops) / seconds
    floor_after, floor_after_cpu = _rate(server, seconds, healthz)
    rows.append(
        {
            "db": db,
            "what": "GET /healthz, again",
            "clients": CYCLE_CLIENTS,
            "requests_per_s": floor_after,
            "service_cpu_ms_per_request": floor_after_cpu,
        }
    )
    for r in rows:
        share = f"  {r['of_healthz']:.2f} of /healthz" if "of_healthz" in r else ""
        if r.get("goal_of_healthz") is not None:
            share += f" (goal {r['goal_of_healthz']})"
        cpu = r["service_cpu_ms_per_request"]
        cpu_text = f"  service CPU {cpu:.2f} ms/request" if cpu is not None else ""
        print(f"  {r['what']:62} {r['requests_per_s']:8,.0f} req/s{share}{cpu_text}")
    return rows


# --------------------------------------------------------------------------- topology


@dataclass
class Topology:
    layers: list[list[int]]  # job indexes per layer (job i writes table i)
    tables: list[str]
    barriers: list[int]


def build_topology(url: str, n_jobs: int, seed: int = 7) -> Topology:
    """Bulk-insert a layered DAG of ``n_jobs`` jobs, one output table each, and five
    committed barriers per job (derived jobs lag their slowest input by 0 or 1 barrier)."""
    rng = random.Random(seed)
    shares = [0.40, 0.25, 0.16, 0.10, 0.06, 0.03]  # sources, then five derived layers
    sizes = [int(n_jobs * s) for s in shares]
    sizes[0] += n_jobs - sum(sizes)
    layers, start = [], 0
    for size in sizes:
        layers.append(list(range(start, start + size)))
        start += size
    layer_of = {j: k for k, layer in enumerate(layers) for j in layer}
    names = [
        ("ods" if layer_of[j] == 0 else f"l{layer_of[j]}") + f".t{j:05d}" for j in range(n_jobs)
    ]
    inputs: dict[int, list[int]] = {}
    for k in range(1, len(layers)):
        for j in layers[k]:
            fan_in = rng.choice((1, 2, 2, 3))
            chosen: set[int] = set()
            while len(chosen) < fan_in:
                # mostly the layer just below, sometimes any earlier one
                pool = layers[k - 1] if rng.random() < 0.7 else layers[rng.randrange(k)]
                chosen.add(rng.choice(pool))
            inputs[j] = sorted(chosen)
    now = int(time.time() * 1000)
    last = now - now % INTERVAL_MS - 120 * INTERVAL_MS  # two minutes ago, on the grid
    barriers = [last - (4 - i) * INTERVAL_MS for i in range(5)]
    reached: dict[int, int] = {}  # index of the last barrier each job committed
    for layer in layers:
        for j in layer:
            if j not in inputs:
                reached[j] = 4
            else:
                lag = 1 if rng.random() < 0.1 else 0
                reached[j] = max(0, min(reached[i] for i in inputs[j]) - lag)

    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(Job),
                [
                    {
                        "id": j + 1,
                        "name": f"job_{j:05d}",
                        "description": "",
                        "kind": DERIVED if j in inputs else SOURCE,
                        "frontier": barriers[reached[j]],
                        "open_batches": 0,
                        "pending_target": None,
                        "last_barrier": barriers[reached[j]],
                        "last_batch_id": reached[j],
                        "status": "running",
                        "created_ms": now,
                        "updated_ms": now,
                    }
                    for j in range(n_jobs)
                ],
            )
            conn.execute(
                insert(Table),
                [
                    {"id": j + 1, "name": names[j], "writer_id": j + 1, "created_ms": now}
                    for j in range(n_jobs)
                ],
            )
            conn.execute(
                insert(JobInput),
                [{"job_id": j + 1, "table_id": i + 1} for j, ins in inputs.items() for i in ins],
            )
            batches, commits = [], []
            for j in range(n_jobs):
                for b in range(reached[j] + 1):
                    batches.append(
                        {
                            "job_id": j + 1,
                            "batch_id": b,
                            "barrier": barriers[b],
                            "start_barrier": (barriers[b - 1] if b else 0) if j in inputs else None,
                            "committed": True,
                            "created_ms": barriers[b],
                            "committed_ms": barriers[b] + 500,
                        }
                    )
                    commits.append(
                        {
                            "job_id": j + 1,
                            "batch_id": b,
                            "table_id": j + 1,
                            "barrier": barriers[b],
                            "snapshot_id": (j + 1) * 100 + b,
                            "created_ms": barriers[b] + 500,
                        }
                    )
            conn.execute(insert(Batch), batches)
            conn.execute(insert(Commit), commits)
            conn.execute(
                update(ClockState)
                .where(ClockState.id == 1)
                .values(last_issued=barriers[-1], topology_version=ClockState.topology_version + 1)
            )
            if conn.dialect.name == "postgresql":
                for seq, table in (("jobs_id_seq", "jobs"), ("tables_id_seq", "tables")):
                    conn.execute(text(f"SELECT setval('{seq}', (SELECT max(id) FROM {table}))"))
        if engine.dialect.name == "postgresql":  # the statistics autovacuum would gather
            with engine.begin() as conn:
                conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()
    return Topology(layers=layers, tables=names, barriers=barriers)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50_ms": pick(0.50) * 1000,
        "p99_ms": pick(0.99) * 1000,
        "max_ms": ordered[-1] * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
    }


def bench_reads(server: Server, db: str, topo: Topology, quick: bool) -> list[dict[str, Any]]:
    rng = random.Random(11)
    n = 60 if quick else 600
    rows = []
    with httpx.Client(base_url=server.url + API, timeout=120) as http:
        top = topo.layers[-1] + topo.layers[-2]
        t0 = time.perf_counter()
        _ok(http.get("/lineage", params={"table": topo.tables[top[0]], "direction": "upstream"}))
        cold = time.perf_counter() - t0
        rows.append(
            {
                "db": db,
                "what": "lineage, first call (builds the graph)",
                "count": 1,
                "p50_ms": cold * 1000,
                "p99_ms": cold * 1000,
                "max_ms": cold * 1000,
                "mean_ms": cold * 1000,
            }
        )
        samples = []
        for i in range(n + 10):
            t0 = time.perf_counter()
            _ok(http.get(server.url + "/healthz"))
            if i >= 10:
                samples.append(time.perf_counter() - t0)
        rows.append(
            {"db": db, "what": "GET /healthz (HTTP floor)", "count": n, **_percentiles(samples)}
        )
        for size in (2, 10, 50):
            # "random": a new random set per request; "repeated": 20 sets asked in turn,
            # as dashboards do. Both are read-only (idle sources' frontiers come from the
            # watermark); the two kinds show whether repeating a set helps the read.
            fresh = [rng.sample(topo.tables, size) for _ in range(n + 10)]
            fixed = [rng.sample(topo.tables, size) for _ in range(20)]
            repeated = [fixed[i % 20] for i in range(n + 10)]
            for kind, sets in (("random sets", fresh), ("20 sets repeated", repeated)):
                for s in sets[:10]:  # warm-up
                    _ok(http.get("/versions/consistent", params={"tables": ",".join(s)}))
                samples, barriers = [], set()
                for s in sets[10:]:
                    t0 = time.perf_counter()
                    body = _ok(http.get("/versions/consistent", params={"tables": ",".join(s)}))
                    samples.append(time.perf_counter() - t0)
                    barriers.add(body["barrier"])
                rows.append(
                    {
                        "db": db,
                        "what": f"consistent version, {size} tables, {kind}",
                        "count": n,
                        **_percentiles(samples),
                        "barriers_seen": sorted(barriers),
                    }
                )
        for depth in (None, 3):
            params: dict[str, Any] = {"direction": "upstream"}
            if depth is not None:
                params["depth"] = depth
            samples, sizes = [], []
            for i in range(n + 10):
                params["table"] = topo.tables[rng.choice(top)]
                t0 = time.perf_counter()
                body = _ok(http.get("/lineage", params=params))
                if i >= 10:
                    samples.append(time.perf_counter() - t0)
                    sizes.append(len(body["nodes"]))
            label = "unlimited" if depth is None else f"depth {depth}"
            rows.append(
                {
                    "db": db,
                    "what": f"lineage upstream, {label}",
                    "count": n,
                    **_percentiles(samples),
                    "mean_nodes": statistics.fmean(sizes),
                }
            )
    for r in rows:
        print(f"  {r['what']:50} p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms")
    return rows


# --------------------------------------------------------------------------- statements


class _Counter:
    """Counts the SQL statements a unit of work sends, and times it, in this process."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.count = 0
        event.listen(db.engine, "before_cursor_execute", self._seen)

    def _seen(self, *_: Any) -> None:
        self.count += 1

    def measure(self, run: Callable[[], Any], repeat: int) -> tuple[float, float]:
        """(statements, milliseconds) per call: medians over ``repeat`` calls."""
        counts, times = [], []
        for _ in range(repeat):
            before = self.count
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
            counts.append(self.count - before)
        return statistics.median(counts), statistics.median(times) * 1000


def statements_of_writes(url: str, db_kind: str) -> list[dict[str, Any]]:
    """SQL statements per write, by the service functions the endpoints call (in process:
    no HTTP, no FastAPI), with their in-process time."""
    from metaservice.barriers import service as barriers
    from metaservice.barriers.schemas import CommitReport
    from metaservice.context import Context
    from metaservice.db import Database
    from metaservice.settings import Settings
    from metaservice.topology import service as topology
    from metaservice.topology.schemas import JobSpec

    db = Database(url)
    ctx = Context(settings=Settings(db_url=url))
    counter = _Counter(db)
    jobs = [f"s{j:02d}" for j in range(16)]
    for job in jobs:
        db.write(lambda s, job=job: topology.put_job(s, ctx, job, JobSpec(outputs=[f"st.{job}"])))
    next_batch = dict.fromkeys(jobs, 0)
    snapshot = iter(range(1, 10**9))

    def new_batch(job: str) -> CommitReport:
        batch_id = next_batch[job]
        next_batch[job] += 1
        view = db.write(lambda s: barriers.batch_barrier(s, ctx, job, batch_id))
        return CommitReport(
            job=job, batch_id=batch_id, barrier=view.barrier, table=f"st.{job}",
            snapshot_id=next(snapshot),
        )  # fmt: skip

    rows = []
    try:
        turn = iter(range(10**9))
        n, ms = counter.measure(lambda: new_batch(jobs[next(turn) % len(jobs)]), 30)
        rows.append(
            {
                "db": db_kind,
                "operation": "barrier for a new batch",
                "statements": n,
                "in_process_ms": ms,
            }
        )

        def report(pending: list[list[CommitReport]], prefix: str = "") -> Any:
            reports = pending.pop()
            return db.write(lambda s: barriers.report_commits(s, ctx, reports, field_prefix=prefix))

        singles = [[new_batch(jobs[k % len(jobs)])] for k in range(30)]
        n, ms = counter.measure(lambda: report(singles), 30)
        rows.append(
            {
                "db": db_kind,
                "operation": "single commit report",
                "statements": n,
                "in_process_ms": ms,
            }
        )
        for size in (100, 500):
            batches = [[new_batch(jobs[k % len(jobs)]) for k in range(size)] for _ in range(3)]
            n, ms = counter.measure(lambda b=batches: report(b, "commits."), 3)  # type: ignore[misc]
            rows.append(
                {
                    "db": db_kind,
                    "operation": f"batch of {size} reports (16 jobs)",
                    "statements": n,
                    "in_process_ms": ms,
                }
            )
    finally:
        db.dispose()
    return rows


def statements_of_reads(url: str, db_kind: str, topo: Topology) -> list[dict[str, Any]]:
    from metaservice.context import Context
    from metaservice.db import Database
    from metaservice.lineage import service as lineage
    from metaservice.settings import Settings
    from metaservice.versions import service as versions

    db = Database(url)
    ctx = Context(settings=Settings(db_url=url))
    counter = _Counter(db)
    rng = random.Random(5)
    top = topo.layers[-1] + topo.layers[-2]
    rows = []
    try:
        db.write(lambda s: versions.seal_writers(s, ctx, topo.tables[:50]))
        for size in (2, 10, 50):
            n, ms = counter.measure(
                lambda size=size: db.read(
                    lambda s: versions.consistent_version(s, ctx, sorted(rng.sample(topo.tables, size)))
                ),
                30,
            )  # fmt: skip
            rows.append(
                {
                    "db": db_kind,
                    "operation": f"consistent version, {size} tables (read part)",
                    "statements": n,
                    "in_process_ms": ms,
                }
            )
        db.read(lambda s: lineage.table_lineage(s, ctx, topo.tables[top[0]], "upstream", None))
        for depth in (None, 3):
            # as the endpoint answers once its graph is built: one statement, no transaction
            n, ms = counter.measure(
                lambda depth=depth: db.read_single(
                    lambda s: lineage.cached_lineage(s, ctx, topo.tables[rng.choice(top)], "upstream", depth)
                ),
                30,
            )  # fmt: skip
            label = "unlimited" if depth is None else f"depth {depth}"
            rows.append(
                {
                    "db": db_kind,
                    "operation": f"lineage upstream, {label}",
                    "statements": n,
                    "in_process_ms": ms,
                }
            )
    finally:
        db.dispose()
    return rows


# --------------------------------------------------------------------------- growth

# (tables, [commit histories]) measured by --part growth; each table count is built once
# and its history grown in steps. A history needs at least the five recent commits per
# table that build_topology writes, so 10,000 commits only exist for 1,000 tables.
GROWTH_POINTS: list[tuple[int, list[int]]] = [
    (1_000, [10_000, 1_000_000, 10_000_000]),
    (10_000, [1_000_000, 10_000_000]),
    (100_000, [1_000_000, 10_000_000]),
]
GROWTH_POINTS_QUICK: list[tuple[int, list[int]]] = [
    (1_000, [10_000, 1_000_000]),
    (10_000, [1_000_000]),
]
# build_topology numbers each job's batches 0-4; the growth part moves them up to
# BASE + 0-4, so older batches (BASE - k, one slot earlier per k) fit below them: a job
# whose query has run for a long time, as a long history means.
GROWTH_BATCH_BASE = 1_000_000
# Snapshot ids the benchmark's own reports use (history: table id * 10^7 + batch id).
GROWTH_SNAPSHOT_BASE = 5 * 10**15


@dataclass
class GrowthState:
    """What the growth part knows of the database between its points."""

    topo: Topology
    depth: int = 0  # history batches per job below build_topology's five
    newest: dict[int, int] | None = None  # job index -> its newest batch id


def _numbers(lo: int, hi: int) -> str:
    """A CTE ``g(k)`` of the integers lo..hi, portable to SQLite and PostgreSQL."""
    return (
        f"WITH RECURSIVE g(k) AS (SELECT {int(lo)} UNION ALL SELECT k + 1 FROM g "
        f"WHERE k < {int(hi)}) "
    )


# Every 50th job, when derived, writes a "quiet" table: it got a snapshot once, at the
# oldest slot of the history, and every batch since was empty (reported, no snapshot),
# as an error or late-data table. Its snapshot at a recent barrier lies a whole history
# back.
QUIET_EVERY = 50


def is_quiet(topo: Topology, j: int) -> bool:
    return (j + 1) % QUIET_EVERY == 0 and j not in topo.layers[0]


def grow_history(url: str, state: GrowthState, commits: int) -> dict[str, Any]:
    """Add older batches and commits to every job until the commits table holds about
    ``commits`` rows: each job one batch per slot further back (batch ids and barriers
    decreasing together, derived batches starting where the previous one ended), each
    committed with one commit for its table. Derived jobs' batches that found nothing
    new (every seventh) report no snapshot, as empty Spark batches do, and quiet tables
    (see ``QUIET_EVERY``) none after their first.

    Written with ``INSERT ... SELECT`` over a generated series, oldest first (each slot
    all jobs), in chunks of about a million rows. On PostgreSQL the secondary indexes
    and unique constraints of batches and commits are dropped for the load and built
    again after it, and foreign-key triggers are off (the rows are built consistent);
    then ``VACUUM ANALYZE``, as autovacuum would run."""
    n = len(state.topo.tables)
    engine = make_engine(url)
    postgres = engine.dialect.name == "postgresql"
    first = state.topo.barriers[0]
    t0 = time.perf_counter()
    try:
        with engine.begin() as conn:
            present = conn.execute(text("SELECT count(*) FROM commits")).scalar_one()
            if state.newest is None:
                base = GROWTH_BATCH_BASE
                for table in ("batches", "commits"):
                    conn.execute(text(f"UPDATE {table} SET batch_id = batch_id + {base}"))
                conn.execute(text(f"UPDATE jobs SET last_batch_id = last_batch_id + {base}"))
                rows = conn.execute(
                    text("SELECT job_id, max(batch_id) FROM batches GROUP BY job_id")
                )
                state.newest = {job_id - 1: batch_id for job_id, batch_id in rows}
        depth = state.depth + max(0, -(-(commits - present) // n))
        rebuilt = 0.0
        if depth > state.depth:
            interval = INTERVAL_MS
            chunk = max(1, 1_000_000 // n)
            quiet = f"(j.kind = '{DERIVED}' AND j.id % {QUIET_EVERY} = 0)"
            with engine.begin() as conn:
                dropped = _drop_secondary_indexes(conn) if postgres else []
                if postgres:
                    conn.execute(text("SET LOCAL session_replication_role = replica"))
                if state.depth == 0:  # the first recent batch now has one before it
                    conn.execute(
                        text(
                            f"UPDATE batches SET start_barrier = {first - interval} "
                            f"WHERE batch_id = {GROWTH_BATCH_BASE} AND start_barrier IS NOT NULL"
                        )
                    )
                # oldest first, as a service running for that long would have written them
                for hi in range(depth, state.depth, -chunk):
                    lo = max(state.depth + 1, hi - chunk + 1)
                    barrier = f"({first} - g.k * {interval})"
                    batch_id = f"({GROWTH_BATCH_BASE} - g.k)"
                    conn.execute(
                        text(
                            _numbers(lo, hi)
                            + "INSERT INTO batches (job_id, batch_id, barrier, start_barrier, "
                            "committed, created_ms, committed_ms, query_id, abandoned, advanced, "
                            "outputs) "
                            f"SELECT j.id, {batch_id}, {barrier}, "
                            f"CASE WHEN j.kind = '{DERIVED}' THEN {barrier} - {interval} END, "
                            f"{_true(postgres)}, {barrier}, {barrier} + 500, NULL, "
                            f"{_false(postgres)}, {_false(postgres)}, 1 "
                            "FROM g CROSS JOIN jobs j ORDER BY g.k DESC, j.id"
                        )
                    )
                    conn.execute(
                        text(
                            _numbers(lo, hi)
                            + "INSERT INTO commits (job_id, batch_id, table_id, barrier, "
                            "snapshot_id, created_ms) "
                            f"SELECT t.writer_id, {batch_id}, t.id, {barrier}, "
                            f"CASE WHEN {quiet} AND g.k < {depth} THEN NULL "
                            f"WHEN j.kind = '{DERIVED}' AND g.k % 7 = 3 THEN NULL "
                            f"ELSE CAST(t.id AS BIGINT) * 10000000 + {batch_id} END, "
                            f"{barrier} + 500 "
                            "FROM g CROSS JOIN tables t JOIN jobs j ON j.id = t.writer_id "
                            "ORDER BY g.k DESC, t.id"
                        )
                    )
                    print(
                        f"    history: {depth - lo + 1:,} of {depth - state.depth:,} slots back "
                        f"({time.perf_counter() - t0:.0f} s)",
                        flush=True,
                    )
                t1 = time.perf_counter()
                for statement in dropped:
                    conn.execute(text(statement))
                rebuilt = time.perf_counter() - t1
                # quiet tables: only the oldest snapshot stays (build_topology's recent
                # ones, and the previous history's oldest, become empty batches)
                conn.execute(
                    text(
                        "UPDATE commits SET snapshot_id = NULL WHERE snapshot_id IS NOT NULL "
                        f"AND barrier > {first - depth * interval} AND job_id IN "
                        f"(SELECT j.id FROM jobs j WHERE {quiet})"
                    )
                )
            state.depth = depth
        loaded = time.perf_counter() - t0
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE" if postgres else "ANALYZE"))
            total = conn.execute(text("SELECT count(*) FROM commits")).scalar_one()
            batches = conn.execute(text("SELECT count(*) FROM batches")).scalar_one()
    finally:
        engine.dispose()
    return {
        "commits": total,
        "batches": batches,
        "history_slots": state.depth,
        "load_s": round(loaded, 1),
        "index_rebuild_s": round(rebuilt, 1),
        "vacuum_analyze_s": round(time.perf_counter() - t0 - loaded, 1),
    }


def _drop_secondary_indexes(conn: Any) -> list[str]:
    """Drop the unique constraints and indexes (primary keys aside) of batches and
    commits; answers the statements that build them again."""
    conn.execute(text("SET LOCAL maintenance_work_mem = '256MB'"))
    again = []
    for table in ("batches", "commits"):
        constraints = conn.execute(
            text(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = CAST(:t AS regclass) AND contype = 'u'"
            ),
            {"t": table},
        ).all()
        for name, definition in constraints:
            conn.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT {name}"))
            again.append(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
        indexes = conn.execute(
            text(
                "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid "
                "WHERE x.indrelid = CAST(:t AS regclass) AND NOT x.indisprimary"
            ),
            {"t": table},
        ).all()
        for name, definition in indexes:
            conn.execute(text(f"DROP INDEX {name}"))
            again.append(definition)
    return again


def _true(postgres: bool) -> str:
    return "true" if postgres else "1"


def _false(postgres: bool) -> str:
    return "false" if postgres else "0"


# Each figure of a growth point stops after this long (and at least 12 requests), so a
# request that got slow does not stretch a run past its lock slot; its count says so.
GROWTH_FIGURE_SECONDS = 45.0


def _turns(n: int, seconds: float = GROWTH_FIGURE_SECONDS) -> Iterator[int]:
    """0, 1, ... n - 1, stopping early once ``seconds`` have passed (after 12)."""
    end = time.perf_counter() + seconds
    for i in range(n):
        if i >= 12 and time.perf_counter() > end:
            return
        yield i


class _Timer:
    """Latency samples by request kind: ``with timer("what"): ...``."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}

    @contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.samples.setdefault(what, []).append(time.perf_counter() - t0)


def bench_growth_point(
    server: Server, db: str, state: GrowthState, n: int, seed: int
) -> list[dict[str, Any]]:
    """Latency of the hot requests, one client, sequential, ``n`` samples each (after
    10 warm-up requests), bracketed by ``/healthz`` before and after."""
    topo = state.topo
    assert state.newest is not None
    rng = random.Random(seed)
    timer = _Timer()
    extra: dict[str, dict[str, Any]] = {}
    snapshot = iter(range(GROWTH_SNAPSHOT_BASE + seed * 10**9, 10**18))
    with httpx.Client(base_url=server.url + API, timeout=300) as http:
        # builds the service's cached graph: measured once, not a per-request figure
        t0 = time.perf_counter()
        top_table = topo.tables[topo.layers[-1][0]]
        _ok(http.get("/lineage", params={"table": top_table, "direction": "upstream"}))
        extra["lineage, first call (builds the graph)"] = {"ms": (time.perf_counter() - t0) * 1000}

        for _ in range(20):
            _ok(http.get(server.url + "/healthz"))
        for _ in range(n):
            with timer("GET /healthz (floor)"):
                _ok(http.get(server.url + "/healthz"))

        # source batches of 100 source jobs in turn: the barrier, then the report
        sources = rng.sample(topo.layers[0], min(100, len(topo.layers[0])))
        for i in _turns(n + 10):
            j = sources[i % len(sources)]
            job, batch = f"job_{j:05d}", state.newest[j] + 1
            with timer("source batch: barrier"):
                b = _ok(http.post(f"/jobs/{job}/batches/{batch}/barrier"))["barrier"]
            report = {"job": job, "batch_id": batch, "barrier": b, "table": topo.tables[j]}
            report["snapshot_id"] = next(snapshot)
            with timer("source batch: report"):
                _ok(http.post("/commits", json=report))
            state.newest[j] = batch

        # derived batches of jobs reading sources only, in turn: next-barrier, the
        # batch's barrier, its report
        derived = _derived_of_sources(server, topo, rng)
        not_ready = 0
        for i in _turns(n + 10):
            j = derived[i % len(derived)]
            job, batch = f"job_{j:05d}", state.newest[j] + 1
            with timer("derived batch: next-barrier"):
                nxt = _ok(http.get(f"/jobs/{job}/next-barrier"))
            if not nxt["ready"]:
                not_ready += 1
                continue
            body = {"start": nxt["start_barrier"], "end": nxt["barrier"]}
            with timer("derived batch: barrier"):
                b = _ok(http.post(f"/jobs/{job}/batches/{batch}/barrier", json=body))["barrier"]
            report = {"job": job, "batch_id": batch, "barrier": b, "table": topo.tables[j]}
            report["snapshot_id"] = next(snapshot)
            with timer("derived batch: report"):
                _ok(http.post("/commits", json=report))
            state.newest[j] = batch
        extra["derived batch: next-barrier"] = {"not_ready": not_ready}

        versions: set[int] = set()
        for _ in _turns(n + 10):
            names = ",".join(rng.sample(topo.tables, 10))
            with timer("consistent version, 10 random tables"):
                version = _ok(http.get("/versions/consistent", params={"tables": names}))
            versions.add(version["barrier"])
        extra["consistent version, 10 random tables"] = {"barriers_seen": len(versions)}

        quiet = [j for j in range(len(topo.tables)) if is_quiet(topo, j)]
        for _ in _turns(n + 10):
            names = ",".join([*rng.sample(topo.tables, 9), topo.tables[rng.choice(quiet)]])
            with timer("consistent version, 9 random tables and a quiet one"):
                _ok(http.get("/versions/consistent", params={"tables": names}))

        top = topo.layers[-1] + topo.layers[-2]
        nodes = []
        for _ in _turns(n + 10):
            params = {"table": topo.tables[rng.choice(top)], "direction": "upstream", "depth": 3}
            with timer("lineage upstream, depth 3"):
                nodes.append(len(_ok(http.get("/lineage", params=params))["nodes"]))
        extra["lineage upstream, depth 3"] = {"mean_nodes": statistics.fmean(nodes)}

        for _ in _turns(n + 10):
            name = rng.choice(topo.tables)
            with timer("GET /tables/{t}"):
                _ok(http.get(f"/tables/{name}"))

        for _ in _turns(n + 10):
            name = topo.tables[rng.choice(quiet)]
            with timer("GET /tables/{t}, a quiet table"):
                _ok(http.get(f"/tables/{name}"))

        recent = {
            "from_barrier": topo.barriers[-1] - 9 * INTERVAL_MS,
            "to_barrier": topo.barriers[-1],
        }
        found = []
        for _ in _turns(n + 10):
            name = rng.choice(topo.tables)
            with timer("GET /tables/{t}/snapshots, 10 recent slots"):
                found.append(
                    len(_ok(http.get(f"/tables/{name}/snapshots", params=recent))["items"])
                )
        extra["GET /tables/{t}/snapshots, 10 recent slots"] = {"mean_rows": statistics.fmean(found)}

        for _ in _turns(n // 5 + 10):
            with timer("GET /tables?limit=100 (first page)"):
                _ok(http.get("/tables", params={"limit": 100}))

        for _ in range(n):
            with timer("GET /healthz (floor), again"):
                _ok(http.get(server.url + "/healthz"))

    rows = []
    for what, values in timer.samples.items():
        kept = values if what.startswith("GET /healthz") else values[min(10, len(values) // 10) :]
        rows.append({"what": what, "count": len(kept), **_percentiles(kept), **extra.get(what, {})})
    rows += [{"what": what, **facts} for what, facts in extra.items() if what not in timer.samples]
    return rows


def _derived_of_sources(server: Server, topo: Topology, rng: random.Random) -> list[int]:
    """Up to 100 derived jobs of the first derived layer that read only source tables."""
    sources = set(topo.layers[0])
    index = {name: j for j, name in enumerate(topo.tables)}
    chosen = []
    with httpx.Client(base_url=server.url + API, timeout=60) as http:
        for j in rng.sample(topo.layers[1], min(300, len(topo.layers[1]))):
            view = _ok(http.get(f"/jobs/job_{j:05d}"))
            if all(index[t] in sources for t in view["inputs"]):
                chosen.append(j)
            if len(chosen) == 100:
                break
    return chosen


def run_growth(
    dbs: list[str], pg_base: str, quick: bool, workers: int, label: str,
    tables: list[int] | None, commits: list[int] | None,
) -> dict[str, Any]:  # fmt: skip
    points = GROWTH_POINTS_QUICK if quick else GROWTH_POINTS
    n = 100 if quick else 200
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        workdir = Path(tmp)
        for db in dbs:
            for n_tables, histories in points:
                if tables and n_tables not in tables:
                    continue
                wanted = [c for c in histories if not commits or c in commits]
                if not wanted:
                    continue
                print(f"{db}: growth, {n_tables:,} tables", flush=True)
                with database(db, pg_base, workdir, "growth") as url:
                    t0 = time.perf_counter()
                    state = GrowthState(build_topology(url, n_tables))
                    built = time.perf_counter() - t0
                    for target in wanted:
                        print(f"  history of {target:,} commits", flush=True)
                        loaded = grow_history(url, state, target)
                        load_start, share = _loadavg(), cpu_share()
                        with service(url, workdir, workers) as server:
                            rows = bench_growth_point(server, db, state, n, seed=target % 997)
                        run = {
                            "label": label,
                            "db": db,
                            "tables": n_tables,
                            "commits_target": target,
                            **loaded,
                            "topology_build_s": round(built, 1),
                            "loadavg_at_start": load_start,
                            "loadavg_at_end": _loadavg(),
                            "cpu_share_at_start": share,
                            "rows": rows,
                        }
                        runs.append(run)
                        print_growth_run(run)
    return {"machine": machine_facts(pg_base, dbs), "quick": quick, "runs": runs}


def print_growth_run(run: dict[str, Any]) -> None:
    floor = next(r for r in run["rows"] if r["what"] == "GET /healthz (floor)")
    print(
        f"  [{run['label']}] {run['db']} {run['tables']:,} tables, {run['commits']:,} commits, "
        f"load {run['loadavg_at_start']} -> {run['loadavg_at_end']}"
    )
    for r in run["rows"]:
        if "p50_ms" not in r:
            continue
        print(
            f"    {r['what']:45} p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms"
            f"  ({r['p50_ms'] / floor['p50_ms']:5.1f} / {r['p99_ms'] / floor['p99_ms']:5.1f} x floor)"
        )


def merge_growth(path: Path, new: dict[str, Any]) -> dict[str, Any]:
    """The results file with ``new``'s runs added, replacing runs of the same label,
    database, table count and history (so the points may be measured in several runs)."""
    old: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"runs": []}

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["label"], r["db"], r["tables"], r["commits_target"])

    fresh = {key(r) for r in new["runs"]}
    runs = [r for r in old.get("runs", []) if key(r) not in fresh] + new["runs"]
    runs.sort(key=lambda r: (r["label"], r["db"], r["tables"], r["commits_target"]))
    machines = old.get("machines", [])
    machines.append(new["machine"])
    return {"machines": machines[-10:], "runs": runs}


# --------------------------------------------------------------------------- fleet

# What a running job sends, after spark_barrier (restated for hundreds of drivers in one
# event loop; bench/requests_per_batch.py counts what spark_barrier's own code sends,
# beside them). A source query fires at every multiple of its trigger, the barrier
# interval (Spark's ProcessingTimeExecutor aligns triggers to the epoch, so every source
# of the fleet fires at the same instant), and its barrier request carries the last
# batch's report, progress and offline-grant promise (spark_barrier/carry.py): one
# request per batch, the heartbeat silent in a slot a request reported in. A derived
# query triggers continuously, its barrier sources long-polling next-barrier; its
# barrier request carries its last progress, and its report goes at once.
SOURCE_TRIGGER_S = 1.0  # the barrier interval (spark_barrier.job.BarrierJob.start)
NEXT_BARRIER_WAIT_MS = 2000  # spark_barrier.job.NEXT_BARRIER_WAIT_MS
GRANT_EVERY_S = 1.0  # spark_barrier.offline.OfflineBarriers(heartbeat_s=1.0)
GRANT_CARRIED_WAIT_S = 0.5  # spark_barrier.offline.CARRIED_WAIT_SHARE of a slot
SPARK_POLLING_DELAY_S = 0.01  # spark.sql.streaming.pollingDelay: a trigger with no new data
# Not the service's: Spark planning a batch before its sink asks for the barrier (drawn
# uniformly up to this), and the batch's work between its barrier and its report.
FLEET_PLANNING_S = 0.1
FLEET_BATCH_WORK_S = 0.1
FLEET_WARMUP_S = 5.0  # excluded: the first derived batches catch up two minutes of history
FLEET_DRAIN_S = 60.0  # after the window, how long in-flight requests may take to finish
BARRIER_REQUESTS = ("source: barrier", "derived: barrier")


class _Recorder:
    """Latencies (of requests started in the measured window), responses served in it,
    and every error, by request kind."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.samples: dict[str, list[float]] = {}
        self.served: dict[str, int] = {}
        self.errors: list[str] = []

    def in_window(self, t: float) -> bool:
        return self.start <= t < self.end

    async def call(
        self, what: str, request: Any, expected: tuple[str, ...] = ()
    ) -> dict[str, Any] | None:
        """Await ``request`` (an httpx coroutine); its JSON ({} for 204), or None after an
        error. A 409 whose code is ``expected`` is an answer (its JSON), not an error."""
        t0 = time.time()
        try:
            response = await request
        except httpx.HTTPError as exc:
            self.errors.append(f"{what}: {exc!r}")
            return None
        t1 = time.time()
        if self.in_window(t0):
            self.samples.setdefault(what, []).append(t1 - t0)
        if self.in_window(t1):
            self.served[what] = self.served.get(what, 0) + 1
        if response.status_code == 409 and response.json().get("code") in expected:
            return response.json()  # type: ignore[no-any-return]
        if response.status_code >= 300:
            self.errors.append(f"{what}: {response.status_code} {response.text[:300]}")
            return None
        if response.status_code == 204:
            return {}  # Prefer: return=minimal, answered with no body
        return response.json()  # type: ignore[no-any-return]


class _Sender:
    """A driver's background delivery, a queue and a task: the report outbox (every
    pending report in one ``POST /commits/batch``) or the listener's thread (one ``POST
    /jobs/{job}/events`` per event)."""

    def __init__(
        self, rec: _Recorder, what: str, send: Callable[[list[Any]], Any], together: bool
    ) -> None:
        self.rec, self.what, self.send, self.together = rec, what, send, together
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.task = asyncio.create_task(self._deliver())

    async def _deliver(self) -> None:
        while True:
            items = [await self.queue.get()]
            while self.together and not self.queue.empty():
                items.append(self.queue.get_nowait())
            for _ in range(3):  # the outbox retries what did not arrive (recorded as errors)
                if await self.rec.call(self.what, self.send(items)) is not None:
                    break
            for _ in items:
                self.queue.task_done()

    async def drained(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.queue.join(), timeout)
        self.task.cancel()


MINIMAL = {"Prefer": "return=minimal"}


@dataclass
class _FleetJob:
    """One simulated driver: a job of the fleet's topology, and what it did."""

    name: str
    table: str
    inputs: list[str]
    batch: int  # the next batch id
    frontier: int  # where the next batch starts (a source: its last barrier)
    http: httpx.AsyncClient
    spans: list[tuple[int, int]]  # (start, end] of its batches started in the window
    last_reported: int | None = None
    lag_slots: int | None = None  # behind the clock when the window ended
    carried_report: dict[str, Any] | None = None  # for the next barrier request
    carried_progress: dict[str, Any] | None = None
    carried_slot: int = -1  # the slot of the last promise a barrier request carried

    def start(self, rec: _Recorder) -> None:
        job, http = self.name, self.http
        self.outbox = _Sender(
            rec,
            "report (outbox: POST /commits/batch)",
            lambda items: http.post("/commits/batch", json={"commits": items}),
            together=True,
        )
        self.listener = _Sender(
            rec,
            "listener event (POST /jobs/{job}/events)",
            # As spark_barrier's listener sends them: no job view back (204).
            lambda items: http.post(f"/jobs/{job}/events", json=items[0], headers=MINIMAL),
            together=False,
        )
        self.listener.queue.put_nowait({"event": "started", "run_id": self.query_id})

    @property
    def query_id(self) -> str:
        return f"fleet-{self.name}"

    async def batch_barrier(
        self, rec: _Recorder, what: str, plan: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The service's answer for the next batch: its barrier, or ``empty_range`` (a
        derived batch the service advanced the job past: Spark moves on without it);
        None after an error. Keeps the slots the batch spans."""
        t0 = time.time()
        path = f"/jobs/{self.name}/batches/{self.batch}/barrier"
        body: dict[str, Any] = {**plan, "query_id": self.query_id}
        report, progress = self.carried_report, self.carried_progress
        self.carried_report = self.carried_progress = None
        if report is not None:
            body["reports"] = [report]
        if progress is not None:
            body["progress"] = progress
        if not self.inputs:
            body["floor"] = max(self.frontier, _slot_now())  # OfflineBarriers._promise
        answer = await rec.call(what, self.http.post(path, json=body), expected=("empty_range",))
        carried = (answer or {}).get("carried") or {}
        if report is not None and carried.get("reports") is None:
            self.outbox.queue.put_nowait(report)  # not acknowledged: the outbox sends it
        if progress is not None and not carried.get("progress"):
            self.listener.queue.put_nowait(progress)
        if carried.get("grant"):
            self.carried_slot = carried["grant"]["barrier"]
        if answer is None:
            return None
        start = answer.get("start_barrier") or plan.get("start") or self.frontier
        end = answer.get("barrier") or plan["end"]
        if rec.in_window(t0) and start:
            self.spans.append((start, end))
        return answer

    def skip(self, end: int) -> None:
        """An empty batch: no commit, no report; the next starts at its end."""
        self.frontier = end
        self.batch += 1

    async def commit(self, barrier: int, started: float) -> None:
        """The batch's work, then its report to the outbox and its progress to the listener."""
        await asyncio.sleep(FLEET_BATCH_WORK_S)
        report = {"job": self.name, "batch_id": self.batch, "barrier": barrier}
        report |= {"table": self.table, "snapshot_id": 10**12 + self.batch}
        if self.inputs:
            self.outbox.queue.put_nowait(report)  # readers wait for it: at once
        else:
            self.carried_report = report  # the next batch's request carries it
        progress = {"event": "progress", "run_id": self.query_id, "batch_id": self.batch}
        progress |= {"num_input_rows": 100, "duration_ms": int((time.time() - started) * 1000)}
        self.carried_progress = progress
        self.last_reported, self.frontier = self.batch, barrier
        self.batch += 1

    def stopped(self) -> None:
        """The query stopped: what no request carried goes its own way (the job's close)."""
        if self.carried_report is not None:
            self.outbox.queue.put_nowait(self.carried_report)
        if self.carried_progress is not None:
            self.listener.queue.put_nowait(self.carried_progress)
        self.carried_report = self.carried_progress = None

    def behind(self) -> None:
        self.lag_slots = (_slot_now() - self.frontier) // INTERVAL_MS


async def _source_job(job: _FleetJob, rec: _Recorder, rng: random.Random) -> None:
    """At each whole second: planning, barrier, work, report; the grant every second."""
    grant = asyncio.create_task(_report_in(job, rec))
    try:
        next_trigger = time.time()
        while True:
            await asyncio.sleep(max(0.0, next_trigger - time.time()))
            started = time.time()
            next_trigger = (started // SOURCE_TRIGGER_S + 1) * SOURCE_TRIGGER_S
            if started >= rec.end:
                break
            await asyncio.sleep(rng.uniform(0, FLEET_PLANNING_S))
            answer = await job.batch_barrier(rec, "source: barrier", {})
            if answer is not None:  # else the next trigger asks again for the same batch
                await job.commit(answer["barrier"], started)
        job.stopped()
        job.behind()
    finally:  # also when the driver is cancelled, still waiting after the drain
        grant.cancel()


async def _report_in(job: _FleetJob, rec: _Recorder) -> None:
    """The offline grant's heartbeat: the promise is the job's current clock slot (or
    its last barrier, if later), as ``OfflineBarriers._promise`` makes it; silent in a
    slot a barrier request carried the promise, for which it waits half a slot."""
    while True:
        await asyncio.sleep(GRANT_EVERY_S)
        if job.carried_slot >= _slot_now() - INTERVAL_MS:
            await asyncio.sleep(max(0.0, _slot_now() / 1000 + GRANT_CARRIED_WAIT_S - time.time()))
        if job.carried_slot >= _slot_now():
            continue
        promise = max(job.frontier, _slot_now())
        path = f"/jobs/{job.name}/offline-grant"
        await rec.call("source: offline grant", job.http.put(path, json={"floor": promise}))


def _slot_now() -> int:
    now_ms = int(time.time() * 1000)
    return now_ms - now_ms % INTERVAL_MS


async def _derived_job(job: _FleetJob, rec: _Recorder, rng: random.Random, wait_ms: int) -> None:
    """Each trigger, the barrier sources ask next-barrier in turn until one gets a ready
    end, which the others share; then planning, barrier (with the planned start and
    end), work, report."""
    while time.time() < rec.end:
        started = time.time()
        ends = set()
        for table in job.inputs:
            params: dict[str, Any] = {"after": job.frontier, "source": table, "wait_ms": wait_ms}
            nxt = await rec.call(
                "derived: next-barrier (long poll)",
                job.http.get(f"/jobs/{job.name}/next-barrier", params=params),
            )
            ready = nxt is not None and nxt["ready"]
            ends.add(nxt["barrier"] if ready else None)
            if ready:  # the job's other sources answer it from the shared file (source.py)
                break
        end = ends.pop() if len(ends) == 1 else None
        if end is None or end <= job.frontier:
            await asyncio.sleep(SPARK_POLLING_DELAY_S)
            continue
        await asyncio.sleep(rng.uniform(0, FLEET_PLANNING_S))
        plan = {"start": job.frontier, "end": end}
        answer = await job.batch_barrier(rec, "derived: barrier", plan)
        if answer is None:
            return  # a refused plan stops a real query
        if "code" in answer:
            job.skip(end)
        else:
            await job.commit(answer["barrier"], started)
    job.stopped()
    job.behind()


def _fleet_views(url: str) -> list[dict[str, Any]]:
    """The jobs as their drivers see them at start (``GET /jobs``: inputs, frontier,
    last batch id)."""
    views: list[dict[str, Any]] = []
    with httpx.Client(base_url=url + API, timeout=120) as http:
        while True:
            page = _ok(http.get("/jobs", params={"limit": 100, "offset": len(views)}))
            views += page["items"]
            if not page["items"] or len(views) >= page["total"]:
                return views


async def _drive_fleet(
    servers: list[Server], views: list[dict[str, Any]], seconds: float, wait_ms: int, pg: str
) -> dict[str, Any]:
    """Run a driver per job of ``views`` (job i on replica i mod n) through the warm-up
    and ``seconds`` more; what was measured in those ``seconds``.

    Each driver has its own client, as real drivers do; one ``httpx.AsyncClient`` shared
    by hundreds of concurrent requests spends milliseconds of CPU per request in its
    connection pool (measured: 11 ms at 200 concurrent requests, against 0.6-1 ms with a
    client per task), which would make the load generator the bottleneck."""
    now = time.time()
    rec = _Recorder(now + FLEET_WARMUP_S, now + FLEET_WARMUP_S + seconds)
    rng = random.Random(3)
    jobs = []
    for i, v in enumerate(views):
        last = v["last_batch_id"]
        job = _FleetJob(
            name=v["name"], table=v["outputs"][0], inputs=v["inputs"],
            batch=0 if last is None else last + 1, frontier=v["frontier"],
            http=httpx.AsyncClient(base_url=servers[i % len(servers)].url + API, timeout=120),
            spans=[],
        )  # fmt: skip
        job.start(rec)
        jobs.append(job)
    meter = asyncio.create_task(_cpu_during(rec, [s.proc.pid for s in servers]))
    waits = asyncio.create_task(_pg_waits_during(rec, pg))
    loops = [
        asyncio.create_task(
            _derived_job(job, rec, rng, wait_ms) if job.inputs else _source_job(job, rec, rng)
        )
        for job in jobs
    ]
    _, stuck = await asyncio.wait(loops, timeout=rec.end - time.time() + FLEET_DRAIN_S)
    for task in stuck:
        task.cancel()
    for sender in [s for job in jobs for s in (job.outbox, job.listener)]:
        await sender.drained(max(1.0, rec.end + FLEET_DRAIN_S - time.time()))
    cpu, pg_waits = await meter, await waits
    lost = await _lost_reports(jobs)
    for job in jobs:
        await job.http.aclose()
    return {
        **_fleet_figures(rec, jobs, seconds),
        "drivers_stuck_after_drain": len(stuck),
        "reports_lost": lost,
        "cpu_cores": cpu,
        "postgresql_sessions": pg_waits,
    }


async def _lost_reports(jobs: list[_FleetJob]) -> int:
    """Jobs whose last reported batch the service does not show as committed."""
    gate = asyncio.Semaphore(16)

    async def lost(job: _FleetJob) -> bool:
        if job.last_reported is None:
            return False
        async with gate:
            for attempt in range(3):  # a keep-alive connection the server closed meanwhile
                try:
                    response = await job.http.get(f"/jobs/{job.name}")
                    break
                except httpx.TransportError:
                    if attempt == 2:
                        raise
        last = response.json().get("last_batch_id") if response.status_code == 200 else None
        return last is None or last < job.last_reported

    return sum(await asyncio.gather(*(lost(job) for job in jobs)))


def _fleet_figures(rec: _Recorder, jobs: list[_FleetJob], seconds: float) -> dict[str, Any]:
    barriers = [t for what in BARRIER_REQUESTS for t in rec.samples.get(what, [])]
    requests = {
        what: {
            "served_per_s": rec.served.get(what, 0) / seconds,
            "count": len(rec.samples.get(what, [])),
            **(_percentiles(rec.samples[what]) if rec.samples.get(what) else {}),
        }
        for what in sorted(set(rec.samples) | set(rec.served))
    }
    return {
        "served_per_s": sum(rec.served.values()) / seconds,
        "barrier_latency": {"count": len(barriers), **(_percentiles(barriers) if barriers else {})},
        "requests": requests,
        "sources": _kept_up([j for j in jobs if not j.inputs], seconds),
        "derived": _kept_up([j for j in jobs if j.inputs], seconds),
        "errors": len(rec.errors),
        "error_samples": rec.errors[:20],
    }


def _kept_up(jobs: list[_FleetJob], seconds: float) -> dict[str, Any]:
    """Batches and the 1 s slots they skipped: a job keeping up makes one batch per slot,
    each a slot after the last; a batch spanning k slots missed k - 1."""
    slots = [(end - start) // INTERVAL_MS for job in jobs for start, end in job.spans]
    missed = sum(max(0, s - 1) for s in slots)
    lags = sorted(job.lag_slots for job in jobs if job.lag_slots is not None)
    return {
        "jobs": len(jobs),
        "batches_per_s": len(slots) / seconds,
        "batches_per_job_per_s": len(slots) / seconds / max(1, len(jobs)),
        "slots_missed": missed,
        "kept_up_share": len(slots) / (len(slots) + missed) if slots else 0.0,
        "batches_in_the_same_slot": sum(s == 0 for s in slots),
        "lag_at_end_slots": {
            "p50": lags[len(lags) // 2] if lags else None,
            "p99": lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None,
            "max": lags[-1] if lags else None,
        },
    }


# --------------------------------------------------------------------------- CPU


def _proc_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of a process so far, from /proc."""
    try:
        return process_cpu_s(pid)
    except (OSError, IndexError):
        return None


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
    return pids


def _machine_busy_s() -> float:
    """CPU seconds all cores spent busy so far (not idle, not waiting for I/O)."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def _children(pids: list[int]) -> list[int]:
    """The child processes of these (a service's advancer process on PostgreSQL)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent in pids:
                    found.append(int(entry.name))
    return found


def _cpu_now(service_pids: list[int]) -> dict[tuple[str, int], float]:
    """CPU seconds so far by group; a service's child processes (its advancer's) count
    as the service's, and again on their own as "service: advancer process"."""
    seen = {("load generator", 0): time.process_time(), ("machine", 0): _machine_busy_s()}
    children = _children(service_pids)
    for group, pids in (
        ("service", service_pids + children),
        ("service: advancer process", children),
        ("postgresql", _postgres_pids()),
    ):
        for pid in pids:
            cpu = _proc_cpu_s(pid)
            if cpu is not None:
                seen[(group, pid)] = cpu
    return seen


async def _cpu_during(rec: _Recorder, service_pids: list[int]) -> dict[str, float]:
    """Cores used in the measured window by the load generator (this process), the
    service processes, PostgreSQL's processes, and the machine as a whole."""
    await asyncio.sleep(max(0.0, rec.start - time.time()))
    before, t0 = _cpu_now(service_pids), time.time()
    await asyncio.sleep(max(0.0, rec.end - time.time()))
    after, wall = _cpu_now(service_pids), time.time() - t0
    cores: dict[str, float] = {}
    for (group, pid), cpu in after.items():
        used = cpu - before.get((group, pid), 0.0)  # a backend started meanwhile: all of it
        cores[group] = cores.get(group, 0.0) + used / wall
    # the kernel's share of loopback networking, and other processes
    cores["other"] = cores["machine"] - sum(
        v for k, v in cores.items() if k not in ("machine", "service: advancer process")
    )
    return {group: round(value, 3) for group, value in cores.items()}


async def _pg_waits_during(rec: _Recorder, pg: str) -> dict[str, float]:
    """What PostgreSQL's client sessions were doing, sampled once a second in the
    measured window (``pg_stat_activity``): the mean number of sessions per state and
    wait event (``active`` without an event: running; ``Lock/transactionid`` or
    ``Lock/tuple``: waiting for another transaction's row lock)."""
    engine = create_engine(pg)
    counts: dict[str, float] = {}
    samples = 0
    query = text(
        "SELECT state, wait_event_type, wait_event, count(*) FROM pg_stat_activity "
        "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
        "GROUP BY 1, 2, 3"
    )

    def sample() -> list[Any]:
        with engine.connect() as conn:
            return list(conn.execute(query))

    try:
        await asyncio.sleep(max(0.0, rec.start - time.time()))
        while time.time() < rec.end - 0.5:
            for state, kind, name, n in await asyncio.to_thread(sample):
                key = f"{state}" + (f" {kind}/{name}" if kind else "")
                counts[key] = counts.get(key, 0) + n
            samples += 1
            await asyncio.sleep(1.0)
    finally:
        engine.dispose()
    return {key: round(n / max(1, samples), 1) for key, n in sorted(counts.items())}


# --------------------------------------------------------------------------- fleet runs


def _healthz_floor(servers: list[Server], seconds: float) -> dict[str, Any]:
    """``GET /healthz`` latency (one client, sequential, on the first replica) and rate
    (16 threads, client i on replica i mod n)."""
    samples = []
    with httpx.Client(timeout=60) as http:
        for i in range(420):
            t0 = time.perf_counter()
            _ok(http.get(servers[0].url + "/healthz"))
            if i >= 20:
                samples.append(time.perf_counter() - t0)
    counts = [0] * CYCLE_CLIENTS

    def client(i: int) -> None:
        url = servers[i % len(servers)].url + "/healthz"
        with httpx.Client(timeout=60) as http:
            _ok(http.get(url))
            counts[i] = _for_a_while(seconds, lambda: (_ok(http.get(url)), 1)[1])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CYCLE_CLIENTS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(counts) / (time.perf_counter() - t0)
    return {"latency": _percentiles(samples), "requests_per_s_16_clients": rate}


def fleet_run(
    pg_base: str, workdir: Path, n_jobs: int, replicas: int, seconds: float, wait_ms: int
) -> dict[str, Any]:
    """``n_jobs`` drivers (build_topology's layered DAG: 40 % sources) against
    ``replicas`` single-worker services on one fresh PostgreSQL schema."""
    with database("postgres", pg_base, workdir, "fleet") as url:
        topo = build_topology(url, n_jobs)
        code = _git_facts()  # other work may change the service between runs
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(service(url, workdir, 1)) for _ in range(replicas)]
            floor = _healthz_floor(servers, 5.0)
            views = _fleet_views(servers[0].url)
            load_start = _loadavg()
            # Beside the simulated drivers, real spark_barrier client code counts its
            # requests per batch under the fleet's load (bench/requests_per_batch.py).
            counted: dict[str, Any] = {}
            counting = threading.Thread(
                target=lambda: counted.update(
                    requests_per_batch(servers[0].url, min(seconds, 30.0), FLEET_WARMUP_S)
                ),
                daemon=True,
            )
            counting.start()
            figures = asyncio.run(_drive_fleet(servers, views, seconds, wait_ms, pg_base))
            counting.join(timeout=120)
    run = {
        "jobs": n_jobs,
        "sources": len(topo.layers[0]),
        "derived": n_jobs - len(topo.layers[0]),
        "replicas": replicas,
        "seconds": seconds,
        "next_barrier_wait_ms": wait_ms,
        "code": code,
        "loadavg_at_start": load_start,
        "loadavg_at_end": _loadavg(),
        "healthz": floor,
        **figures,
        "requests_per_batch": counted,
    }
    print_fleet_run(run)
    return run


def requests_run(pg_base: str, seconds: float) -> dict[str, Any]:
    """``--part requests``: requests per batch of real spark_barrier client code, alone
    on a service of its own (PostgreSQL)."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-rpb-") as tmp,
        database("postgres", pg_base, Path(tmp), "rpb") as url,
        service(url, Path(tmp), 1) as server,
    ):
        result = requests_per_batch(server.url, seconds)
    result["code"] = _git_facts()
    print_requests_per_batch(result)
    return result


def print_fleet_run(run: dict[str, Any]) -> None:
    b, floor = run["barrier_latency"], run["healthz"]
    print(
        f"  {run['jobs']:,} jobs on {run['replicas']} replica(s): {run['served_per_s']:,.0f} "
        f"req/s served; barrier p50 {b.get('p50_ms', 0):,.1f} ms p99 {b.get('p99_ms', 0):,.1f} "
        f"ms (goal p99 <= 50); /healthz p50 {floor['latency']['p50_ms']:.1f} p99 "
        f"{floor['latency']['p99_ms']:.1f} ms, {floor['requests_per_s_16_clients']:,.0f} req/s; "
        f"load {run['loadavg_at_start']} -> {run['loadavg_at_end']}"
    )
    for kind in ("sources", "derived"):
        k = run[kind]
        print(
            f"    {kind:8} {k['jobs']:5} jobs {k['batches_per_job_per_s']:.2f} batches/job/s, "
            f"kept up {k['kept_up_share']:.2f}, lag at end p50/p99 {k['lag_at_end_slots']['p50']}"
            f"/{k['lag_at_end_slots']['p99']} slots"
        )
    for what, r in run["requests"].items():
        print(
            f"    {what:45} {r['served_per_s']:8,.0f}/s  p50 {r.get('p50_ms', 0):8,.1f}  "
            f"p99 {r.get('p99_ms', 0):8,.1f} ms"
        )
    print(f"    PostgreSQL sessions (mean): {run['postgresql_sessions']}")
    print(
        f"    cores: {run['cpu_cores']}; errors {run['errors']}, reports lost "
        f"{run['reports_lost']}, drivers stuck {run['drivers_stuck_after_drain']}"
    )
    for line in run["error_samples"][:5]:
        print(f"    ! {line}")
    if run.get("requests_per_batch"):
        print_requests_per_batch(run["requests_per_batch"])


def run_fleet_parts(
    part: str, pg_base: str, jobs: list[int], seconds: float, wait_ms: int
) -> dict[str, Any]:
    """``fleet``: one replica per job count; ``replicas``: one then two replicas per job
    count, and the ratio of what they served."""
    machine = machine_facts(pg_base, ["postgres"])
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        workdir = Path(tmp)
        if part == "fleet":
            runs = [fleet_run(pg_base, workdir, n, 1, seconds, wait_ms) for n in jobs]
        else:
            runs = [
                fleet_run(pg_base, workdir, n, r, seconds, wait_ms) for n in jobs for r in (1, 2)
            ]
    machine |= {"loadavg_at_end": _loadavg(), "cpu_share_at_end": cpu_share()}
    result: dict[str, Any] = {"machine": machine, "runs": runs}
    if part == "replicas":
        result["two_over_one"] = [
            _two_over_one(one, two) for one, two in zip(runs[::2], runs[1::2], strict=True)
        ]
    return result


def _two_over_one(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    ratio = {
        "jobs": one["jobs"],
        "served_requests": two["served_per_s"] / max(1e-9, one["served_per_s"]),
        "batches": _batches_per_s(two) / max(1e-9, _batches_per_s(one)),
        "healthz_16_clients": two["healthz"]["requests_per_s_16_clients"]
        / one["healthz"]["requests_per_s_16_clients"],
        "goal": 1.7,
    }
    print(f"  {one['jobs']:,} jobs, two replicas over one: {ratio}")
    return ratio


def _batches_per_s(run: dict[str, Any]) -> float:
    return float(run["sources"]["batches_per_s"] + run["derived"]["batches_per_s"])


def _git_facts() -> dict[str, Any]:
    """The commit measured, and whether the service's code had uncommitted changes."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "metaservice")
    return {"commit": git("rev-parse", "HEAD"), "metaservice_uncommitted": changed.splitlines()}


# --------------------------------------------------------------------------- main


def run(
    dbs: list[str], pg_base: str, quick: bool, workers: int, parts: list[str]
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": machine_facts(pg_base, dbs),
        "quick": quick,
        "workers": workers,
        "parts": parts,
        "topology_jobs": 1000 if quick else 10_000,
        "writes": [],
        "cycles": [],
        "reads": [],
        "statements": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        workdir = Path(tmp)
        for db in dbs:
            if "writes" in parts:
                print(f"{db}: writes")
                with (
                    database(db, pg_base, workdir, "writes") as url,
                    service(url, workdir, workers) as server,
                ):
                    results["writes"] += bench_writes(server, db, quick)
                with database(db, pg_base, workdir, "stmts") as url:
                    results["statements"] += statements_of_writes(url, db)
            if "cycles" in parts:
                print(f"{db}: cycles, {CYCLE_CLIENTS} clients")
                slots = {"METASERVICE_BARRIER_INTERVAL_MS": str(CYCLE_INTERVAL_MS)}
                with database(db, pg_base, workdir, "cycles") as url:
                    create_probe_rows(url)
                    with service(url, workdir, workers, slots, PROBE_FACTORY) as server:
                        results["cycles"] += bench_cycles(server, db, quick)
            if "reads" not in parts:
                continue
            print(f"{db}: reads on {results['topology_jobs']:,} jobs and tables")
            with database(db, pg_base, workdir, "reads") as url:
                t0 = time.perf_counter()
                topo = build_topology(url, results["topology_jobs"])
                results.setdefault("topology_build_s", {})[db] = time.perf_counter() - t0
                results["topology_layers"] = [len(layer) for layer in topo.layers]
                with service(url, workdir, workers) as server:
                    results["reads"] += bench_reads(server, db, topo, quick)
                results["statements"] += statements_of_reads(url, db, topo)
    results["machine"]["loadavg_at_end"] = _loadavg()
    results["machine"]["calibration_ms_at_end"] = calibration_ms()
    results["machine"]["cpu_share_at_end"] = cpu_share()
    return results


def print_table(results: dict[str, Any]) -> None:
    m = results["machine"]
    print()
    print(
        f"{m['nproc']} x {m['cpu_model']}, Python {m['python']}, SQLite {m['sqlite']}, "
        f"PostgreSQL {m.get('postgresql', '-')}, uvicorn workers {results['workers']}, "
        f"load average {m['loadavg_at_start']} -> {m['loadavg_at_end']}, "
        f"calibration {m['calibration_ms_at_start']:.1f} -> {m['calibration_ms_at_end']:.1f} ms, "
        f"CPU share {m['cpu_share_at_start']:.2f} -> {m['cpu_share_at_end']:.2f}"
    )
    print()
    print(
        f"{'db':9} {'figure':22} {'mode':17} {'clients':>7} {'count':>7} {'per s':>10} {'req/s':>9}"
    )
    for r in results["writes"]:
        print(
            f"{r['db']:9} {r['what']:22} {r['mode']:17} {r['clients']:>7} {r['count']:>7} "
            f"{r['per_s']:>10,.0f} {r['requests_per_s']:>9,.0f}"
        )
    print()
    print(f"{'db':9} {'figure':50} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for r in results["reads"]:
        print(
            f"{r['db']:9} {r['what']:50} {r['count']:>5} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.2f}"
        )


def print_statements(results: dict[str, Any]) -> None:
    if not results["statements"]:
        return
    print()
    print(f"{'db':9} {'operation (in process, no HTTP)':48} {'SQL statements':>14} {'ms':>8}")
    for r in results["statements"]:
        print(f"{r['db']:9} {r['operation']:48} {r['statements']:>14g} {r['in_process_ms']:>8.2f}")


def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: bench/results/service.json (service-growth.json for --part growth, "
        "service-fleet.json for --part fleet and replicas)",
    )
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--pg-url", default=os.environ.get("METASERVICE_TEST_PG_URL", DEFAULT_PG))
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument(
        "--part",
        choices=("writes", "cycles", "reads", "growth", "fleet", "replicas", "requests", "all"),
        default="all",
        help="default: all (writes, cycles and reads; growth, fleet, replicas and requests "
        "run only when asked, on PostgreSQL)",
    )
    parser.add_argument(
        "--jobs", type=_ints, default=[1000], help="fleet: job counts (replicas: the last)"
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="fleet, replicas: the measured window"
    )
    parser.add_argument(
        "--wait-ms",
        type=int,
        default=NEXT_BARRIER_WAIT_MS,
        help="fleet, replicas: the derived jobs' next-barrier long poll",
    )
    parser.add_argument(
        "--uvicorn-http",
        choices=("auto", "h11", "httptools"),
        default=None,
        help="the services' HTTP parser (default: uvicorn's auto, httptools when installed)",
    )
    parser.add_argument(
        "--uvicorn-loop",
        choices=("auto", "asyncio", "uvloop"),
        default=None,
        help="the services' event loop (default: uvicorn's auto, uvloop when installed)",
    )
    parser.add_argument(
        "--label", default="latest", help="growth: the name these runs are kept under"
    )
    parser.add_argument(
        "--tables", type=_ints, default=None, help="growth: only these table counts (1000,10000)"
    )
    parser.add_argument(
        "--commits", type=_ints, default=None, help="growth: only these commit histories"
    )
    parser.add_argument(
        "--wait-for-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="first wait up to this long for the load average to drop below the core count",
    )
    args = parser.parse_args()
    if args.uvicorn_http:
        UVICORN_ARGS.extend(["--http", args.uvicorn_http])
    if args.uvicorn_loop:
        UVICORN_ARGS.extend(["--loop", args.uvicorn_loop])
    wait_for_idle(args.wait_for_idle)
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    if args.part in ("fleet", "replicas"):
        out = args.out or Path("bench/results/service-fleet.json")
        result = run_fleet_parts(
            args.part, normalise_url(args.pg_url), args.jobs, args.seconds, args.wait_ms
        )
        kept = json.loads(out.read_text()) if out.exists() else {}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**kept, args.part: result}, indent=2) + "\n")
        print(f"\nwritten to {out}")
        return
    if args.part == "requests":
        out = args.out or Path("bench/results/service-fleet.json")
        counted = requests_run(normalise_url(args.pg_url), min(args.seconds, 60.0))
        kept = json.loads(out.read_text()) if out.exists() else {}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**kept, "requests_per_batch": counted}, indent=2) + "\n")
        print(f"\nwritten to {out}")
        return
    if args.part == "growth":
        out = args.out or Path("bench/results/service-growth.json")
        grown = run_growth(
            dbs, normalise_url(args.pg_url), args.quick, args.workers, args.label,
            args.tables, args.commits,
        )  # fmt: skip
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(merge_growth(out, grown), indent=2) + "\n")
        print(f"\nwritten to {out}")
        return
    args.out = args.out or Path("bench/results/service.json")
    parts = ["writes", "cycles", "reads"] if args.part == "all" else [args.part]
    results = run(dbs, normalise_url(args.pg_url), args.quick, args.workers, parts)
    print_table(results)
    print_statements(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
