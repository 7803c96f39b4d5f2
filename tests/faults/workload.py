"""A service-level workload for the fault tests: two jobs driven by plain threads (no Spark).

``SOURCE_JOB`` (no table inputs) asks for the barrier of batch 0, 1, 2... and
reports each commit of ``SOURCE`` through an :class:`OutboxReporter`, without
waiting for delivery, like a Spark source job. ``DERIVED_JOB`` reads ``SOURCE``:
it waits for ``next_barrier`` to be ready, asks for its batch's barrier, reports its
commit of ``DERIVED`` through an outbox of its own and waits for the delivery (the
service refuses its next batch until then). A reader asks for the consistent
version of both tables, and a prober sends raw HTTP requests and keeps every status.

Every call that fails with ``Unavailable`` is retried with the same batch id, as a
Spark job would after a failure. Anything else unexpected lands in ``errors``.
With ``offline=True`` the source job holds an offline grant (``OfflineBarriers``)
instead: while the service is unreachable it gives its batches barriers of its own
and keeps committing, claims and commit reports waiting in its outbox.

Snapshot ids are a function of the batch id, so a replayed batch reports the same
snapshot and every check can recompute what the service must answer.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from metaservice.client import ConflictError, MetaServiceClient, MetaServiceError, Unavailable
from spark_barrier.offline import OfflineBarriers
from spark_barrier.report import OutboxReporter

SOURCE_JOB, DERIVED_JOB = "ingest_clicks", "count_clicks"
SOURCE, DERIVED = "ods.clicks", "dw.click_counts"
TABLES = [SOURCE, DERIVED]


def source_snapshot(batch_id: int) -> int:
    return 1_000_000 + batch_id


def derived_snapshot(batch_id: int) -> int:
    return 2_000_000 + batch_id


@dataclass(frozen=True)
class BatchRecord:
    """One batch as the job saw it: when it asked for its barrier and what it got."""

    batch_id: int
    barrier: int
    asked_at: float  # time.monotonic() of the first request for this batch
    answered_at: float
    attempts: int
    start_barrier: int | None = None
    inputs: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Probe:
    phase: str  # the fault phase when the request was sent and when it was answered
    method: str
    path: str
    status: int | None  # None: no answer (connection refused, timeout)
    code: str | None  # the JSON error code of an error answer


@dataclass
class Workload:
    url: str
    root: Path
    # A batch every 0.1 s at most: faster than any Spark trigger, yet slower than the
    # outbox delivers an offline job's claims and reports (see the report of
    # tests/faults: at ~50 batches/s an offline job never catches up).
    source_pace_s: float = 0.1
    derived_pace_s: float = 0.02
    offline: bool = False  # the source job holds an offline grant
    source_batches: list[BatchRecord] = field(default_factory=list)
    derived_batches: list[BatchRecord] = field(default_factory=list)
    appended: list[dict[str, Any]] = field(default_factory=list)  # every report given to an outbox
    versions: list[tuple[float, int, dict[str, int | None]]] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unavailable: dict[str, int] = field(default_factory=dict)  # thread -> Unavailable count
    phase: str = "before"

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.client = MetaServiceClient(self.url, timeout=5)
        self._reporter_clients = [MetaServiceClient(self.url, timeout=5) for _ in range(2)]
        self.source_reporter = OutboxReporter(self._reporter_clients[0], self.root / "outbox-src")
        self.derived_reporter = OutboxReporter(self._reporter_clients[1], self.root / "outbox-der")
        self.offline_barriers: OfflineBarriers | None = None

    # -- running

    def register(self) -> None:
        self.client.put_job(SOURCE_JOB, outputs=[SOURCE])
        self.client.put_job(DERIVED_JOB, inputs=[SOURCE], outputs=[DERIVED])

    def start(self) -> None:
        if self.offline:
            state = self.root / "state-src"
            state.mkdir()
            self.offline_barriers = OfflineBarriers(
                MetaServiceClient(self.url, timeout=5),
                SOURCE_JOB,
                self.source_reporter.outbox,
                state,
                heartbeat_s=0.2,
                offline_after_s=0.5,
            )
        for name, target in (
            ("source", self._source_loop),
            ("derived", self._derived_loop),
            ("reader", self._reader_loop),
            ("prober", self._prober_loop),
        ):
            thread = threading.Thread(target=self._guard(name, target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self.phase = phase

    def stop(self, flush_timeout: float = 30) -> None:
        """Stop the loops, then wait until every report appended is delivered."""
        self._stop.set()
        for thread in self._threads:
            thread.join(15)
            if thread.is_alive():
                self.errors.append(f"thread {thread.name} did not stop")
        if self.offline_barriers is not None:
            self.offline_barriers.close(release=True)  # the release goes through the outbox
        for name, reporter in (
            ("source", self.source_reporter),
            ("derived", self.derived_reporter),
        ):
            if not reporter.flush(flush_timeout):
                self.errors.append(
                    f"{name} outbox not delivered within {flush_timeout} s: "
                    f"{reporter.outbox.backlog} reports waiting"
                )

    def close(self) -> None:
        self._stop.set()
        if self.offline_barriers is not None:
            self.offline_barriers.close(release=False)  # idempotent after stop()
            self.offline_barriers.client.close()
        for reporter in (self.source_reporter, self.derived_reporter):
            reporter.close()
        for client in (self.client, *self._reporter_clients):
            client.close()

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.errors:
                raise AssertionError(f"while waiting for {what}: {self.errors}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; "
                    f"{len(self.source_batches)} source and {len(self.derived_batches)} derived "
                    f"batches, unavailable {self.unavailable}"
                )
            time.sleep(0.05)

    # -- snapshots of the progress (thread-safe)

    def last_source(self) -> BatchRecord | None:
        with self._lock:
            return self.source_batches[-1] if self.source_batches else None

    def last_derived(self) -> BatchRecord | None:
        with self._lock:
            return self.derived_batches[-1] if self.derived_batches else None

    # -- the loops

    def _guard(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as exc:  # a loop must never die silently
                self.errors.append(f"{name} loop died: {type(exc).__name__}: {exc}")

        return run

    def _unavailable(self, who: str) -> None:
        with self._lock:
            self.unavailable[who] = self.unavailable.get(who, 0) + 1
        self._stop.wait(0.05)

    def _source_loop(self) -> None:
        batch_id, asked_at, attempts = 0, time.monotonic(), 0
        while not self._stop.is_set():
            attempts += 1
            try:
                if self.offline_barriers is not None:
                    barrier = self.offline_barriers.barrier_for(batch_id, patience_s=1.0)
                else:
                    barrier = self.client.batch_barrier(SOURCE_JOB, batch_id).barrier
            except Unavailable:
                self._unavailable("source")
                continue
            except MetaServiceError as exc:
                self.errors.append(f"source batch {batch_id}: {exc}")
                return
            record = BatchRecord(batch_id, barrier, asked_at, time.monotonic(), attempts)
            report = {
                "job": SOURCE_JOB,
                "batch_id": batch_id,
                "barrier": barrier,
                "table": SOURCE,
                "snapshot_id": source_snapshot(batch_id),
            }
            with self._lock:  # recorded before the outbox has it: the service never knows more
                self.source_batches.append(record)
                self.appended.append(report)
            self.source_reporter.report(report)
            batch_id, asked_at, attempts = batch_id + 1, time.monotonic(), 0
            self._stop.wait(self.source_pace_s)

    def _derived_loop(self) -> None:
        batch_id, asked_at, attempts = 0, time.monotonic(), 0
        while not self._stop.is_set():
            attempts += 1
            try:
                if not self.client.next_barrier(DERIVED_JOB).ready:
                    self._stop.wait(0.05)
                    continue
                answer = self.client.batch_barrier(DERIVED_JOB, batch_id)
            except Unavailable:
                self._unavailable("derived")
                continue
            except ConflictError as exc:
                if exc.code == "no_barrier_ready":  # the target moved on between the calls
                    self._stop.wait(0.05)
                    continue
                self.errors.append(f"derived batch {batch_id}: {exc}")
                return
            except MetaServiceError as exc:
                self.errors.append(f"derived batch {batch_id}: {exc}")
                return
            record = BatchRecord(
                batch_id,
                answer.barrier,
                asked_at,
                time.monotonic(),
                attempts,
                start_barrier=answer.start_barrier,
                inputs=tuple(answer.inputs),
            )
            report = {
                "job": DERIVED_JOB,
                "batch_id": batch_id,
                "barrier": answer.barrier,
                "table": DERIVED,
                "snapshot_id": derived_snapshot(batch_id),
            }
            with self._lock:
                self.derived_batches.append(record)
                self.appended.append(report)
            self.derived_reporter.report(report)
            # The next batch is refused until this commit is recorded: wait for the outbox.
            while not self.derived_reporter.flush(0.2):
                if self._stop.is_set():
                    return
            batch_id, asked_at, attempts = batch_id + 1, time.monotonic(), 0
            self._stop.wait(self.derived_pace_s)

    def _reader_loop(self) -> None:
        while not self._stop.is_set():
            try:
                version = self.client.consistent_version(TABLES)
            except Unavailable:
                self._unavailable("reader")
                continue
            except ConflictError as exc:
                if exc.code != "no_consistent_version":
                    self.errors.append(f"consistent version: {exc}")
                    return
            except MetaServiceError as exc:
                self.errors.append(f"consistent version: {exc}")
                return
            else:
                with self._lock:
                    self.versions.append((time.monotonic(), version.barrier, version.snapshots))
            self._stop.wait(0.1)

    def _prober_loop(self) -> None:
        """Raw HTTP, so that every status is seen as it is (the client hides 503s)."""
        requests: list[tuple[str, str, dict[str, Any]]] = [
            ("GET", f"/api/v1/jobs/{SOURCE_JOB}", {}),
            ("GET", f"/api/v1/tables/{SOURCE}/snapshots", {"params": {"limit": 1}}),
            ("GET", "/api/v1/versions/consistent", {"params": {"tables": ",".join(TABLES)}}),
            ("PUT", f"/api/v1/jobs/{SOURCE_JOB}", {"json": {"outputs": [SOURCE]}}),
            ("GET", f"/api/v1/jobs/{DERIVED_JOB}/next-barrier", {}),
        ]
        with httpx.Client(base_url=self.url, timeout=5) as http:
            i = 0
            while not self._stop.is_set():
                method, path, kwargs = requests[i % len(requests)]
                i += 1
                before = self.phase
                try:
                    response = http.request(method, path, **kwargs)
                    status: int | None = response.status_code
                    code = _error_code(response) if response.status_code >= 400 else None
                except httpx.TransportError:
                    status, code = None, None
                after = self.phase
                phase = before if before == after else f"{before}->{after}"
                with self._lock:
                    self.probes.append(Probe(phase, method, path, status, code))
                self._stop.wait(0.05)


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


# -- what must hold afterwards ------------------------------------------------------------


def all_recorded(client: MetaServiceClient, table: str) -> list[Any]:
    items: list[Any] = []
    while True:
        page = client.table_snapshots(table, limit=500, offset=len(items))
        items.extend(page.items)
        if not page.items or len(items) >= page.total:
            return items


def _snapshot_at(batches: list[BatchRecord], snapshot: Callable[[int], int], barrier: int) -> Any:
    """The snapshot of the latest batch with a barrier <= ``barrier`` (batches in order)."""
    barriers = [b.barrier for b in batches]
    i = bisect.bisect_right(barriers, barrier)
    return snapshot(batches[i - 1].batch_id) if i else None


def check_after_fault(workload: Workload, client: MetaServiceClient) -> dict[str, int]:
    """What must hold after any fault of the service or its database. Returns counts."""
    w = workload
    assert not w.errors, w.errors

    # Every report given to an outbox is recorded, once, and nothing else is.
    for table in TABLES:
        recorded = all_recorded(client, table)
        keys = [(r.job, r.batch_id, r.barrier, table, r.snapshot_id) for r in recorded]
        assert len(keys) == len(set(keys)), f"{table}: a commit recorded twice"
        batch_ids = [r.batch_id for r in recorded]
        assert len(batch_ids) == len(set(batch_ids)), f"{table}: a batch recorded twice"
        appended = {
            (r["job"], r["batch_id"], r["barrier"], r["table"], r["snapshot_id"])
            for r in w.appended
            if r["table"] == table
        }
        assert set(keys) == appended, (
            f"{table}: appended but not recorded {sorted(appended - set(keys))[:10]}, "
            f"recorded but never appended {sorted(set(keys) - appended)[:10]}"
        )

    # Batch ids consecutive; barriers never go back in batch order (strictly up for the
    # derived job: each batch has a target of its own).
    for name, batches, strict in (
        ("source", w.source_batches, False),
        ("derived", w.derived_batches, True),
    ):
        assert [b.batch_id for b in batches] == list(range(len(batches))), name
        barriers = [b.barrier for b in batches]
        assert barriers == sorted(barriers), f"{name} barriers went back: {barriers}"
        if strict:
            assert len(set(barriers)) == len(barriers), f"{name} barrier repeated: {barriers}"

    # Each derived batch read exactly the source snapshots with barriers in (start, barrier].
    for batch in w.derived_batches:
        assert batch.start_barrier is not None
        (read,) = batch.inputs
        expected = (
            _snapshot_at(w.source_batches, source_snapshot, batch.start_barrier),
            _snapshot_at(w.source_batches, source_snapshot, batch.barrier),
        )
        assert (read.from_snapshot, read.to_snapshot) == expected, (
            f"derived batch {batch.batch_id} (barriers {batch.start_barrier}, {batch.barrier}] "
            f"reads {read}, expected snapshots {expected}"
        )

    # Consistent versions never go back, and each one maps both tables to their
    # snapshots at its barrier (the source complete up to it).
    seen = [barrier for _, barrier, _ in w.versions]
    assert seen == sorted(seen), f"a consistent version went back: {seen}"
    final = client.consistent_version(TABLES)
    assert not seen or final.barrier >= seen[-1]
    for barrier, snapshots in [(b, s) for _, b, s in w.versions] + [
        (final.barrier, final.snapshots)
    ]:
        expected_snapshots = {
            SOURCE: _snapshot_at(w.source_batches, source_snapshot, barrier),
            DERIVED: _snapshot_at(w.derived_batches, derived_snapshot, barrier),
        }
        assert snapshots == expected_snapshots, f"at barrier {barrier}: {snapshots}"
    return {
        "final consistent barrier": final.barrier,
        "source batches": len(w.source_batches),
        "derived batches": len(w.derived_batches),
        "consistent versions": len(w.versions),
        "probes": len(w.probes),
    }
