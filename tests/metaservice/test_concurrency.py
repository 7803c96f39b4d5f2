"""Real service processes under concurrent load.

Two MetaService processes share one PostgreSQL schema (the production shape: stateless
replicas behind a load balancer), and many threads, each with its own keep-alive httpx
clients, drive them at once:

- every source job is driven by a pair of threads in lockstep, one per replica, that ask
  for the same batch's barrier at the same moment, then send the same commit report at
  the same moment (single and batched reports), and now and then replay an old batch;
- derived jobs are driven the same way and take barriers as their inputs' frontiers allow;
- other threads ask for consistent versions (some with a lease) and resend batches of
  already acknowledged reports that span several jobs (locks on several job rows).

Afterwards the recorded answers and the database must show: one barrier per (job, batch);
barriers on the 1000 ms grid and never decreasing with the batch id; every acknowledged
report stored and listed by ``GET /tables/{t}/snapshots``; no 5xx and no unexpected 4xx;
consistent versions that never went backwards in real time, whose snapshots are each
table's snapshot at the barrier, and whose barrier every derived writer committed.

Variants: the replicas start on a migrated schema; both start together on an empty
schema and migrate it concurrently (the advisory lock in ``metaservice.migrate``); one
process on SQLite with the same many threads (no ``database is locked`` 5xx).
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from metaservice.db import normalise_url
from metaservice.migrate import head_revision, upgrade

pytestmark = pytest.mark.slow

API = "/api/v1"
INTERVAL_MS = 1000
SOURCES = [(f"src_{i}", f"ods.src_{i}") for i in range(8)]
# d1 reads four sources; d2 reads d1's output and the other four (two derived layers).
DERIVED = [
    ("agg_d1", "dwd.d1", [t for _, t in SOURCES[:4]]),
    ("agg_d2", "dws.d2", ["dwd.d1", *[t for _, t in SOURCES[4:]]]),
]
TABLE_SETS = [
    ("ods.src_0",),
    tuple(t for _, t in SOURCES),
    ("dwd.d1", "ods.src_0"),
    ("dwd.d1", "dws.d2"),
    ("dws.d2", "ods.src_7", "ods.src_2"),
]
# Bounds of the driving phase, so that a loaded machine makes the run smaller, not longer:
# sources stop after `steps` batches or SOURCE_SECONDS; derived jobs get DERIVED_GRACE more.
SOURCE_SECONDS = 25
DERIVED_GRACE = 12
MIN_SOURCE_BATCHES = 8


# --------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Replica:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _spawn(db_url: str, workdir: Path, name: str, *, via_cli: bool) -> Replica:
    """A service process on a free loopback port. The database URL travels in the
    environment, so the ``?options=-csearch_path%3D...`` of a test schema stays intact."""
    port = _free_port()
    env = {**os.environ, "METASERVICE_DB_URL": db_url, "PYTHONUNBUFFERED": "1"}
    if via_cli:  # `metaservice start`: applies migrations first, like a real deployment
        cmd = [sys.executable, "-m", "metaservice.cli", "start", "--port", str(port)]
        cmd += ["--log-level", "warning"]
    else:
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "metaservice.app:create_app"]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Replica(url=f"http://127.0.0.1:{port}", proc=proc, log=log)


def _wait_ready(replicas: list[Replica], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    pending = list(replicas)
    with httpx.Client(timeout=2.0) as http:
        while pending:
            for r in list(pending):
                if r.proc.poll() is not None:
                    pytest.fail(f"service {r.url} exited with {r.proc.returncode}:\n{r.log_text()}")
                try:
                    if http.get(r.url + "/readyz").status_code == 200:
                        pending.remove(r)
                except httpx.TransportError:
                    pass
            if pending and time.monotonic() > deadline:
                logs = "\n".join(r.log_text() for r in pending)
                pytest.fail(f"services not ready after {timeout} s:\n{logs}")
            if pending:
                time.sleep(0.1)


def _stop(replicas: list[Replica]) -> None:
    for r in replicas:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
    for r in replicas:
        try:
            r.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait(timeout=5)


@contextmanager
def services(db_url: str, workdir: Path, count: int, *, via_cli: bool) -> Iterator[list[Replica]]:
    """``count`` service processes started at the same moment; always terminated."""
    replicas: list[Replica] = []
    try:
        for i in range(count):
            replicas.append(_spawn(db_url, workdir, f"replica{i}", via_cli=via_cli))
        _wait_ready(replicas)
        yield replicas
    finally:
        _stop(replicas)


# --------------------------------------------------------------------------- recording


@dataclass
class Observed:
    """Everything the threads saw, appended under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    statuses: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    unexpected: list[str] = field(default_factory=list)
    barriers: dict[tuple[str, int], set[int]] = field(default_factory=lambda: defaultdict(set))
    acked: set[tuple[str, str, int, int, int | None]] = field(default_factory=set)
    # (tables, start, end, barrier, snapshots, with a lease)
    versions: list[tuple[tuple[str, ...], float, float, int, dict[str, int | None], bool]] = field(
        default_factory=list
    )
    worker_errors: list[str] = field(default_factory=list)

    def call(
        self,
        http: httpx.Client,
        method: str,
        path: str,
        *,
        allowed: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> httpx.Response | None:
        """One request; records its status. 2xx, and 409s whose code is in ``allowed``,
        are expected; anything else (5xx above all) is recorded as unexpected."""
        try:
            response = http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            with self.lock:
                self.requests += 1
                self.unexpected.append(f"{method} {http.base_url}{path}: {exc!r}")
            return None
        code = None
        if response.status_code >= 400:
            try:
                code = response.json().get("code")
            except ValueError:
                code = None
        ok = response.status_code < 400 or (response.status_code == 409 and code in allowed)
        with self.lock:
            self.requests += 1
            self.statuses[response.status_code] += 1
            if not ok:
                self.unexpected.append(
                    f"{method} {http.base_url}{path} -> {response.status_code}: "
                    f"{response.text[:300]}"
                )
        return response

    def barrier(self, job: str, batch_id: int, barrier: int) -> None:
        with self.lock:
            self.barriers[(job, batch_id)].add(barrier)

    def ack(self, report: dict[str, Any]) -> None:
        with self.lock:
            self.acked.add(_key(report))

    def sample_acked(self, n: int) -> list[tuple[str, str, int, int, int | None]]:
        with self.lock:
            pool = sorted(self.acked)
        return random.sample(pool, min(n, len(pool)))


def _key(report: dict[str, Any]) -> tuple[str, str, int, int, int | None]:
    return (
        report["job"],
        report["table"],
        report["batch_id"],
        report["barrier"],
        report["snapshot_id"],
    )


def _report(job: str, table: str, batch_id: int, barrier: int, index: int) -> dict[str, Any]:
    return {
        "job": job,
        "batch_id": batch_id,
        "barrier": barrier,
        "table": table,
        "snapshot_id": index * 1_000_000 + batch_id + 1,  # unique per table
    }


def _guard(
    obs: Observed, fn: Callable[[], None], on_error: Callable[[], None]
) -> Callable[[], None]:
    """Run ``fn`` in a thread; an exception is recorded (and unblocks partners), not raised."""

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # recorded and reported by the test
            with obs.lock:
                obs.worker_errors.append(f"{threading.current_thread().name}: {exc!r}")
            on_error()

    return run


# --------------------------------------------------------------------------- workload


@dataclass
class Lockstep:
    """Two threads, one per replica, driving one job batch by batch at the same moments."""

    job: str
    table: str
    index: int
    derived: bool
    should_stop: Callable[[Lockstep], bool]
    deadline: float
    committed: int = 0
    stop: bool = False
    answers: list[int | None] = field(default_factory=lambda: [None, None])
    sync: threading.Barrier = field(init=False)

    def __post_init__(self) -> None:
        self.sync = threading.Barrier(2, action=self._decide, timeout=30)

    def _decide(self) -> None:
        self.stop = self.should_stop(self) or time.monotonic() > self.deadline


def drive(obs: Observed, urls: list[str], pair: Lockstep, slot: int) -> None:
    allowed = ("no_barrier_ready",) if pair.derived else ()
    clients = [httpx.Client(base_url=u + API, timeout=30.0) for u in urls]
    try:
        batch_id = 0
        previous: dict[str, Any] | None = None
        while True:
            pair.sync.wait()  # the action decides, once for both threads, whether to go on
            if pair.stop:
                return
            http = clients[(slot + batch_id) % len(clients)]
            path = f"/jobs/{pair.job}/batches/{batch_id}/barrier"
            r = obs.call(http, "POST", path, allowed=allowed)
            pair.answers[slot] = None
            if r is not None and r.status_code == 200:
                body = r.json()
                assert body["job"] == pair.job and body["batch_id"] == batch_id
                obs.barrier(pair.job, batch_id, body["barrier"])
                pair.answers[slot] = body["barrier"]
            pair.sync.wait()
            given = [b for b in pair.answers if b is not None]
            if not given:  # derived job whose inputs have not moved yet: same batch again
                time.sleep(0.05)
                continue
            barrier = given[0]
            if batch_id >= 3 and batch_id % 4 == slot:  # a replayed batch gets the same answer
                old = batch_id - 3
                r = obs.call(
                    clients[slot % len(clients)], "POST", f"/jobs/{pair.job}/batches/{old}/barrier"
                )
                if r is not None and r.status_code == 200:
                    obs.barrier(pair.job, old, r.json()["barrier"])
            pair.sync.wait()  # both replicas get the same report at the same moment
            report = _report(pair.job, pair.table, batch_id, barrier, pair.index)
            mode = (batch_id + slot) % 3
            if mode == 0:
                r = obs.call(http, "POST", "/commits", json=report)
                if r is not None and r.status_code == 200:
                    assert r.json()["status"] in ("recorded", "duplicate")
                    obs.ack(report)
            else:
                reports = [report]
                if mode == 2 and previous is not None:
                    # the previous batch's report again: a duplicate inside a batched request
                    reports = [previous, report]
                r = obs.call(http, "POST", "/commits/batch", json={"commits": reports})
                if r is not None and r.status_code == 200:
                    body = r.json()
                    assert body["recorded"] + body["duplicates"] == len(reports)
                    for rep in reports:
                        obs.ack(rep)
            if slot == 0:
                pair.committed += 1
            previous = report
            batch_id += 1
    finally:
        for c in clients:
            c.close()


def ask_versions(obs: Observed, urls: list[str], seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed)
    clients = [httpx.Client(base_url=u + API, timeout=30.0) for u in urls]
    try:
        i = 0
        while not stop.is_set():
            tables = TABLE_SETS[i % len(TABLE_SETS)]
            params: dict[str, Any] = {"tables": ",".join(tables)}
            if rng.random() < 0.2:
                params["lease_seconds"] = 60
            http = clients[i % len(clients)]
            t0 = time.monotonic()
            r = obs.call(
                http,
                "GET",
                "/versions/consistent",
                params=params,
                allowed=("no_consistent_version",),
            )
            t1 = time.monotonic()
            if r is not None and r.status_code == 200:
                body = r.json()
                with obs.lock:
                    leased = "lease_seconds" in params
                    obs.versions.append(
                        (tables, t0, t1, body["barrier"], body["snapshots"], leased)
                    )
            i += 1
            time.sleep(0.005)
    finally:
        for c in clients:
            c.close()


def resend_acked(obs: Observed, urls: list[str], stop: threading.Event) -> None:
    """Batches of already acknowledged reports across several jobs: all duplicates."""
    clients = [httpx.Client(base_url=u + API, timeout=30.0) for u in urls]
    names = ("job", "table", "batch_id", "barrier", "snapshot_id")
    try:
        i = 0
        while not stop.is_set():
            sample = obs.sample_acked(20)
            if sample:
                reports = [dict(zip(names, k, strict=True)) for k in sample]
                r = obs.call(
                    clients[i % len(clients)], "POST", "/commits/batch", json={"commits": reports}
                )
                if r is not None and r.status_code == 200:
                    body = r.json()
                    assert body["duplicates"] == len(reports), body
            i += 1
            time.sleep(0.02)
    finally:
        for c in clients:
            c.close()


def register_everything(obs: Observed, urls: list[str]) -> None:
    """Each job is registered on every replica at the same moment (idempotent PUTs)."""

    def put(job: str, spec: dict[str, Any]) -> None:
        start = threading.Barrier(len(urls), timeout=30)

        def one(url: str) -> None:
            with httpx.Client(base_url=url + API, timeout=30.0) as http:
                start.wait()
                r = obs.call(http, "PUT", f"/jobs/{job}", json=spec)
                assert r is not None and r.status_code in (200, 201), r and r.text

        threads = [
            threading.Thread(target=_guard(obs, lambda u=u: one(u), start.abort)) for u in urls
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    for job, table in SOURCES:
        put(job, {"outputs": [table]})
    for job, table, inputs in DERIVED:
        put(job, {"inputs": inputs, "outputs": [table]})


def run_workload(
    urls: list[str], steps: int, seconds: float = SOURCE_SECONDS, min_derived_batches: int = 2
) -> tuple[Observed, list[Lockstep]]:
    obs = Observed()
    register_everything(obs, urls)
    assert not obs.worker_errors, obs.worker_errors
    started = time.monotonic()
    sources_until = started + seconds
    deadline = sources_until + DERIVED_GRACE
    sources_done = threading.Event()

    def source_stop(p: Lockstep) -> bool:
        return p.committed >= steps or time.monotonic() > sources_until

    def derived_stop(p: Lockstep) -> bool:
        return sources_done.is_set() and p.committed >= min_derived_batches

    pairs = [
        Lockstep(job, table, i, False, source_stop, deadline)
        for i, (job, table) in enumerate(SOURCES)
    ]
    pairs += [
        Lockstep(job, table, len(SOURCES) + i, True, derived_stop, deadline)
        for i, (job, table, _) in enumerate(DERIVED)
    ]
    stop = threading.Event()
    drivers: dict[str, list[threading.Thread]] = defaultdict(list)
    for pair in pairs:
        for slot in (0, 1):
            target = _guard(obs, lambda p=pair, s=slot: drive(obs, urls, p, s), pair.sync.abort)
            drivers["derived" if pair.derived else "source"].append(
                threading.Thread(target=target, name=f"{pair.job}/{slot}")
            )
    helpers = [
        threading.Thread(
            target=_guard(obs, lambda s=s: ask_versions(obs, urls, s, stop), stop.set),
            name=f"versions{s}",
        )
        for s in range(2)
    ]
    helpers.append(
        threading.Thread(
            target=_guard(obs, lambda: resend_acked(obs, urls, stop), stop.set), name="resend"
        )
    )
    threads = [*drivers["source"], *drivers["derived"], *helpers]
    for t in threads:
        t.start()
    try:
        for t in drivers["source"]:
            t.join(timeout=max(1.0, deadline - time.monotonic() + 10))
        sources_done.set()
        for t in drivers["derived"]:
            t.join(timeout=max(1.0, deadline - time.monotonic() + 10))
    finally:
        stop.set()
        sources_done.set()
        for pair in pairs:  # unblock drivers stuck on a partner that never came
            pair.sync.abort()
        for t in threads:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
    print(
        f"\n{obs.requests} requests in {time.monotonic() - started:.1f} s on {len(urls)} "
        f"process(es): statuses {dict(sorted(obs.statuses.items()))}, "
        f"{len(obs.barriers)} batches, {len(obs.acked)} reports, {len(obs.versions)} versions; "
        + ", ".join(f"{p.job} {p.committed}" for p in pairs if p.derived)
    )
    for pair in pairs:
        if not pair.derived:
            assert pair.committed >= min(steps, MIN_SOURCE_BATCHES), (
                f"{pair.job}: only {pair.committed} batches in {seconds} s"
            )
    return obs, pairs


# --------------------------------------------------------------------------- checks


def check(obs: Observed, pairs: list[Lockstep], urls: list[str], db_url: str, logs: str) -> None:
    assert not obs.worker_errors, obs.worker_errors
    assert obs.statuses.get(500, 0) == 0 and not any(s >= 500 for s in obs.statuses), dict(
        obs.statuses
    )
    assert not obs.unexpected, obs.unexpected[:10]
    assert "unhandled error" not in logs and "Traceback" not in logs, logs[-5000:]
    for pair in pairs:
        assert pair.committed >= (1 if pair.derived else 2), f"{pair.job} made no progress"

    # One barrier per (job, batch), on the grid, never decreasing with the batch id.
    answered: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (job, batch_id), barriers in obs.barriers.items():
        assert len(barriers) == 1, f"{job} batch {batch_id} got barriers {sorted(barriers)}"
        (barrier,) = barriers
        assert barrier > 0 and barrier % INTERVAL_MS == 0, (job, batch_id, barrier)
        answered[job].append((batch_id, barrier))
    for job, rows in answered.items():
        rows.sort()
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(rows)), f"{job}: {rows}"

    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            stored = conn.execute(
                text(
                    "SELECT j.name, b.batch_id, b.barrier, b.committed, b.advanced "
                    "FROM batches b JOIN jobs j ON j.id = b.job_id "
                    "ORDER BY j.name, b.batch_id"
                )
            ).all()
            commits = conn.execute(
                text(
                    "SELECT t.name, c.barrier, c.batch_id, c.snapshot_id FROM commits c "
                    "JOIN tables t ON t.id = c.table_id"
                )
            ).all()
            clock_rows = conn.execute(text("SELECT count(*) FROM clock")).scalar_one()
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    finally:
        engine.dispose()
    assert clock_rows == 1
    assert revision == [head_revision()]
    by_job: dict[str, list[tuple[int, int]]] = defaultdict(list)
    committed_barriers: dict[str, set[int]] = defaultdict(set)
    for job, batch_id, barrier, committed, advanced in stored:
        if committed:
            committed_barriers[job].add(barrier)  # exact there, advances of idle jobs too
        if advanced:
            continue  # the service's own, not a batch any client asked for
        by_job[job].append((batch_id, barrier))
        if (job, batch_id) in obs.barriers:
            assert obs.barriers[(job, batch_id)] == {barrier}, (job, batch_id, barrier)
    for job, rows in by_job.items():
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(rows)), (
            f"{job} in the database: {rows}"
        )
        assert all(b % INTERVAL_MS == 0 for _, b in rows)
    assert {k for k in obs.barriers} == {(j, b) for j, rows in by_job.items() for b, _ in rows}

    # Every acknowledged report is listed by the API (paged), and nothing else is.
    listed: set[tuple[str, str, int, int, int | None]] = set()
    with httpx.Client(base_url=urls[-1] + API, timeout=30.0) as http:
        for pair in pairs:
            offset = 0
            while True:
                page = http.get(
                    f"/tables/{pair.table}/snapshots", params={"limit": 250, "offset": offset}
                )
                assert page.status_code == 200, page.text
                body = page.json()
                for item in body["items"]:
                    listed.add(
                        (
                            item["job"],
                            pair.table,
                            item["batch_id"],
                            item["barrier"],
                            item["snapshot_id"],
                        )
                    )
                offset += len(body["items"])
                if not body["items"] or offset >= body["total"]:
                    break
    assert obs.acked, "no report was acknowledged"
    missing = obs.acked - listed
    assert not missing, f"{len(missing)} acknowledged reports are not stored: {sorted(missing)[:5]}"
    assert listed == obs.acked, sorted(listed - obs.acked)[:5]

    # Consistent versions: monotone in real time, exact, and the snapshots at the barrier.
    assert obs.versions, "no consistent version was ever returned"
    by_table: dict[str, list[tuple[int, int, int | None]]] = defaultdict(list)
    for table, barrier, batch_id, snapshot in commits:
        if snapshot is not None:
            by_table[table].append((barrier, batch_id, snapshot))
    for rows in by_table.values():
        rows.sort()
    writer = {t: j for j, t in SOURCES} | {t: j for j, t, _ in DERIVED}
    derived_tables = {t for _, t, _ in DERIVED}
    per_set: dict[tuple[str, ...], list[tuple[float, float, int, bool]]] = defaultdict(list)
    for tables, t0, t1, barrier, snapshots, leased in obs.versions:
        per_set[tables].append((t0, t1, barrier, leased))
        assert barrier % INTERVAL_MS == 0
        for t in tables:
            if t in derived_tables:
                assert barrier in committed_barriers[writer[t]], (t, barrier)
            rows = by_table[t]
            i = bisect.bisect_right(rows, (barrier, 2**63, 0))
            expected = rows[i - 1][2] if i else None
            assert snapshots[t] == expected, (
                f"{tables} at {barrier}: {t} -> {snapshots[t]}, not {expected}"
            )
    went_back = []
    for tables, seen in per_set.items():
        ends = sorted((t1, barrier) for _, t1, barrier, _ in seen)
        end_times = [e for e, _ in ends]
        best = []
        running = 0
        for _, barrier in ends:
            running = max(running, barrier)
            best.append(running)
        for t0, _, barrier, leased in seen:
            i = bisect.bisect_left(end_times, t0)  # requests that had ended before this began
            if i and best[i - 1] > barrier:
                seen_as = "with a lease" if leased else "without a lease"
                went_back.append(
                    (leased, f"{','.join(tables)} {seen_as}: {barrier} after {best[i - 1]}")
                )
    # Queries read one snapshot (REPEATABLE READ on PostgreSQL), so versions never go back.
    assert not went_back, went_back[:5]


def _logs(replicas: list[Replica]) -> str:
    return "\n".join(r.log_text() for r in replicas)


# --------------------------------------------------------------------------- tests


@pytest.mark.postgres
def test_two_replicas_on_one_postgres(pg_url: str, tmp_path: Path) -> None:
    upgrade(pg_url)
    with services(pg_url, tmp_path, 2, via_cli=False) as replicas:
        urls = [r.url for r in replicas]
        obs, pairs = run_workload(urls, steps=60)
        check(obs, pairs, urls, pg_url, _logs(replicas))
    assert obs.requests >= 600, obs.requests  # fewer only on a badly overloaded machine


@pytest.mark.postgres
def test_two_replicas_migrate_a_fresh_schema_together(pg_url: str, tmp_path: Path) -> None:
    # Both run `metaservice start`, which upgrades the empty schema before serving.
    with services(pg_url, tmp_path, 2, via_cli=True) as replicas:
        urls = [r.url for r in replicas]
        obs, pairs = run_workload(urls, steps=25, seconds=15)
        check(obs, pairs, urls, pg_url, _logs(replicas))


def test_one_process_on_sqlite_with_many_threads(sqlite_url: str, tmp_path: Path) -> None:
    with services(sqlite_url, tmp_path, 1, via_cli=True) as replicas:
        urls = [r.url for r in replicas]
        obs, pairs = run_workload(urls, steps=40)
        logs = _logs(replicas)
        assert "database is locked" not in logs
        check(obs, pairs, urls, sqlite_url, logs)
