"""A Spark-free simulation of barrier-aligned ETL jobs driving the real MetaService.

The simulator plays every Spark query of a random ETL topology against the REST
API (any client with ``request(method, url, ...)``, e.g. starlette's TestClient
or an ``httpx.Client``) on a :class:`~metaservice.clock.ManualClock`, and keeps
its own Iceberg-like record of every table, so it can check the service's
answers against an oracle that knows nothing about the service:

* a **source job**'s batch asks for its barrier and ingests a few new unique
  rows ``(table, seq, barrier)`` tagged with the barrier it was given; a
  snapshot holds the rows appended by that commit, a table's content at a
  snapshot is every row appended up to it (append-only, like Iceberg);
* a **derived job**'s batch asks ``POST /jobs/{job}/batches/{k}/barrier`` and
  reads, per input, exactly the rows appended by the input's snapshots in
  ``(from_snapshot, to_snapshot]`` as the service named them; it writes one row
  ``(job, input table, row)`` per row read (a multiset, so a row read twice
  shows up twice) and commits a new snapshot, or reports ``snapshot_id: null``
  when it read nothing;
* the **oracle** recomputes any table as of barrier ``b`` from the source rows
  alone: a source table holds its rows with barrier ``<= b``, a derived table
  is the derivation of its inputs' oracle contents.

Failures are simulated the way Spark shows them to the service: a batch that
crashes before its Iceberg commit, or after it but before the report, is
replayed under the same batch id; a finished batch may be asked for again
(Spark replays the last batch when its commit log was not written); reports
may be sent twice, batched, or with conflicting contents.

Outages of the service are simulated for source jobs holding an **offline grant**
(``ReportIn``): ``Run(job, fail="offline")`` gives the batch a barrier of the
job's own (never below its floor), writes the table, and leaves a claim and the
report in the job's outbox; the job keeps running offline, and cannot report in,
until ``Flush`` delivers its claims and reports in order.

Typical use (see tests/metaservice/test_model_properties.py)::

    sim = Simulation(client, clock, topology)
    sim.register()
    for step in steps:
        sim.apply(step)
    sim.steady_step()            # every job runs once, in topological order
    version = sim.version(["dw.d0", "ods.s1"])   # checked against the oracle

Hypothesis strategies for topologies and schedules are at the bottom.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from hypothesis import strategies as st

API = "/api/v1"
INTERVAL_MS = 1000

# Which checks a simulation makes besides the protocol basics it needs to run at all.
G1, G3, G5 = "G1", "G3", "G5"
ALL_CHECKS = frozenset({G1, G3, G5})


# --------------------------------------------------------------------------- topology


class Compact:
    """A repr that is valid Python and leaves out fields at their defaults, so a
    failing example can be pasted into ``@example(...)``."""

    def __repr__(self) -> str:
        parts = []
        for i, f in enumerate(fields(self)):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.default is not MISSING and value == f.default:
                continue
            parts.append(repr(value) if i == 0 else f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


@dataclass(frozen=True, repr=False)
class JobDef(Compact):
    name: str
    output: str
    inputs: tuple[str, ...] = ()

    @property
    def is_source(self) -> bool:
        return not self.inputs


@dataclass(frozen=True, repr=False)
class Topology(Compact):
    """Jobs in topological order (each derived job reads only tables listed before it)."""

    jobs: tuple[JobDef, ...]

    @property
    def tables(self) -> list[str]:
        return [j.output for j in self.jobs]

    @property
    def sources(self) -> list[JobDef]:
        return [j for j in self.jobs if j.is_source]

    @property
    def derived(self) -> list[JobDef]:
        return [j for j in self.jobs if not j.is_source]

    def job(self, name: str) -> JobDef:
        return next(j for j in self.jobs if j.name == name)

    def writer(self, table: str) -> JobDef:
        return next(j for j in self.jobs if j.output == table)

    def readers(self, table: str) -> list[JobDef]:
        return [j for j in self.jobs if table in j.inputs]

    def depth(self, table: str) -> int:
        """0 for a source table, else 1 + the deepest input."""
        job = self.writer(table)
        return 0 if job.is_source else 1 + max(self.depth(t) for t in job.inputs)


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True, repr=False)
class Advance(Compact):
    """Move the barrier clock forward."""

    ms: int


@dataclass(frozen=True, repr=False)
class Run(Compact):
    """One turn of a job: its next batch (or the replay of its unfinished one).

    rows: rows a source batch ingests. fail: "before_commit" (crash before the
    Iceberg commit) or "after_commit" (committed to Iceberg, crashed before the
    report): the next Run of the job replays the batch; "report_later": the
    service was unreachable for the report, which waits in the job's outbox while
    the job goes on (a source job with several batches open; a derived job
    delivers its outbox before asking for its next batch). peek: a derived job
    first asks next-barrier (Spark's latestOffset). batched: report through
    /commits/batch, with the same report twice in the body.
    """

    job: str
    rows: int = 1
    fail: str = "none"
    peek: bool = False
    batched: bool = False


@dataclass(frozen=True, repr=False)
class Tick(Compact):
    """One slot of progress: the clock moves one interval, then the named jobs run
    once each, upstream before downstream (all of them: a healthy topology)."""

    jobs: tuple[str, ...]


@dataclass(frozen=True, repr=False)
class Peek(Compact):
    """A derived job's barrier source asks for its latest offset (next-barrier)."""

    job: str


@dataclass(frozen=True, repr=False)
class Replay(Compact):
    """Ask again for the barrier of a finished batch and report it again (Spark replay)."""

    job: str
    pick: int = 0


@dataclass(frozen=True, repr=False)
class Duplicate(Compact):
    """Send again a report the service already recorded."""

    pick: int = 0
    batched: bool = False


@dataclass(frozen=True, repr=False)
class Conflict(Compact):
    """Send a report contradicting a recorded one (kind: other_snapshot,
    no_snapshot, other_barrier, stolen_snapshot); bundle: inside a /commits/batch
    request that also carries valid reports, which must not be recorded either."""

    pick: int = 0
    kind: str = "other_snapshot"
    bundle: bool = False


@dataclass(frozen=True, repr=False)
class Version(Compact):
    """Ask for the consistent version of some tables (at_or_before = now - back_ms)."""

    tables: tuple[str, ...]
    back_ms: int | None = None
    lease_s: int | None = None


@dataclass(frozen=True, repr=False)
class Release(Compact):
    """End one of the leases taken so far."""

    pick: int = 0


@dataclass(frozen=True, repr=False)
class Expiry(Compact):
    """Ask for a table's expiry plan (None: every table's)."""

    table: str | None = None


@dataclass(frozen=True, repr=False)
class Flush(Compact):
    """The service is reachable again: every job delivers its outbox, in order."""


@dataclass(frozen=True, repr=False)
class ReportIn(Compact):
    """A source job reports in (takes or renews its offline grant) with the promise
    max(its floor, the current slot); a no-op while its claims are undelivered."""

    job: str


@dataclass(frozen=True, repr=False)
class ReleaseGrant(Compact):
    """A source job stops cleanly: it gives its offline grant back (after its claims)."""

    job: str


@dataclass(frozen=True, repr=False)
class Frontiers(Compact):
    """Read every table's frontier (GET /tables) and check what it promises."""


Step = (
    Advance
    | Tick
    | Run
    | Peek
    | Replay
    | Duplicate
    | Conflict
    | Version
    | Release
    | Expiry
    | Flush
    | ReportIn
    | ReleaseGrant
    | Frontiers
)


# --------------------------------------------------------------------------- state


@dataclass
class Snapshot:
    snapshot_id: int
    barrier: int
    job: str
    batch_id: int
    delta: Counter  # the rows this commit appended
    reported: bool = False


@dataclass
class TableState:
    """The simulator's own copy of one Iceberg table: its snapshots in commit order."""

    name: str
    snapshots: list[Snapshot] = field(default_factory=list)
    _position: dict[int, int] = field(default_factory=dict)
    _cached: tuple[int, Counter] = field(default_factory=lambda: (-1, Counter()))

    def append(self, snapshot: Snapshot) -> Snapshot:
        self._position[snapshot.snapshot_id] = len(self.snapshots)
        self.snapshots.append(snapshot)
        return snapshot

    def position(self, snapshot_id: int) -> int:
        assert snapshot_id in self._position, f"{self.name} has no snapshot {snapshot_id}"
        assert self.snapshots[self._position[snapshot_id]].reported, (
            f"snapshot {snapshot_id} of {self.name} was never reported to the service"
        )
        return self._position[snapshot_id]

    def content(self, snapshot_id: int | None) -> Counter:
        """The table's rows as of a snapshot (None: before the first one)."""
        if snapshot_id is None:
            return Counter()
        target = self.position(snapshot_id)
        done, rows = self._cached
        if done > target:
            done, rows = -1, Counter()
        rows = Counter(rows)
        for snapshot in self.snapshots[done + 1 : target + 1]:
            rows.update(snapshot.delta)
        self._cached = (target, rows)
        return Counter(rows)

    def read(self, from_id: int | None, to_id: int | None) -> Counter:
        """Incremental append scan: rows appended by the snapshots in (from, to]."""
        if to_id is None:
            assert from_id is None, f"{self.name}: range ({from_id}, None] ends before it starts"
            return Counter()
        hi = self.position(to_id)
        lo = -1 if from_id is None else self.position(from_id)
        assert lo <= hi, f"{self.name}: range ({from_id}, {to_id}] goes backwards"
        rows: Counter = Counter()
        for snapshot in self.snapshots[lo + 1 : hi + 1]:
            rows.update(snapshot.delta)
        return rows

    def find(self, job: str, batch_id: int) -> Snapshot | None:
        """What the sink looks for in the snapshot summaries before writing a batch."""
        for snapshot in self.snapshots:
            if snapshot.job == job and snapshot.batch_id == batch_id:
                return snapshot
        return None

    def reported(self) -> list[Snapshot]:
        return [s for s in self.snapshots if s.reported]

    def snapshot_at(self, barrier: int) -> int | None:
        """Latest reported snapshot with barrier <= ``barrier`` (None if there is none)."""
        found = None
        for snapshot in self.reported():
            if snapshot.barrier <= barrier:
                found = snapshot.snapshot_id
        return found


@dataclass
class Pending:
    """A batch that was given its barrier and is not reported yet."""

    batch_id: int
    barrier: int
    answer: dict
    delta: Counter
    written: bool = False  # committed to the table already
    snapshot: Snapshot | None = None
    claimed: bool = False  # the job gave it its barrier offline


@dataclass
class Done:
    batch_id: int
    barrier: int
    answer: dict
    snapshot_id: int | None


@dataclass
class JobState:
    next_batch: int = 0
    pending: Pending | None = None
    done: list[Done] = field(default_factory=list)
    outbox: list[Pending] = field(default_factory=list)  # written, reports not delivered
    target: int | None = None  # a derived job's target announced by next-barrier
    floor: int | None = None  # a source job's offline floor while it holds a grant
    claims: list[tuple[int, int]] = field(default_factory=list)  # undelivered (batch, barrier)

    @property
    def frontier(self) -> int:
        """Derived jobs: the last barrier this job committed (0 before its first batch)."""
        return max((d.barrier for d in self.done), default=0)


@dataclass
class LeaseRecord:
    lease_id: str
    expires_ms: int
    barrier: int
    snapshots: dict[str, int | None]


def _ranges(answer: dict) -> list[tuple]:
    return sorted(
        (r["table"], r["from_barrier"], r["to_barrier"], r["from_snapshot"], r["to_snapshot"])
        for r in answer["inputs"]
    )


def leaf(row: tuple) -> tuple:
    """The source row a (possibly derived) row comes from."""
    while isinstance(row[2], tuple):
        row = row[2]
    return row


def combine(contents: dict[str, Counter]) -> Counter:
    """Join the tables of a version on their source rows: for each source row, how
    many times each table (in name order) derives it."""
    names = sorted(contents)
    per_table: dict[str, Counter] = {name: Counter() for name in names}
    for name in names:
        for row, n in contents[name].items():
            per_table[name][leaf(row)] += n
    keys = set().union(*(set(c) for c in per_table.values())) if per_table else set()
    return Counter({key: 1 for key in ((k, tuple(per_table[n][k] for n in names)) for k in keys)})


# --------------------------------------------------------------------------- simulation


class Simulation:
    """Drives the service through a topology's jobs and checks its answers."""

    def __init__(
        self,
        client: Any,
        clock: Any,
        topology: Topology,
        *,
        interval_ms: int = INTERVAL_MS,
        checks: Iterable[str] = ALL_CHECKS,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.clock = clock
        self.topo = topology
        self.interval = interval_ms
        self.checks = frozenset(checks)
        self._log = log
        self.tables = {t: TableState(t) for t in topology.tables}
        self.jobs = {j.name: JobState() for j in topology.jobs}
        self.source_rows: dict[str, list[tuple]] = {j.output: [] for j in topology.sources}
        self.history: list[dict] = []  # every report the service recorded
        self.leases: dict[str, LeaseRecord] = {}
        self.last_frontier: dict[str, int] = {}
        self._snapshot_ids = itertools.count(1_000_001, 7)
        self._row_seq = itertools.count()
        self.stats: Counter = Counter()

    # ------------------------------------------------------------------ plumbing

    def log(self, message: str) -> None:
        if self._log is not None:
            self._log(
                f"[{self.now() - self.now() % self.interval}+{self.now() % self.interval}] {message}"
            )

    def now(self) -> int:
        return self.clock.now_ms()

    def now_slot(self) -> int:
        return self.now() - self.now() % self.interval

    def call(self, method: str, path: str, expect: Iterable[int], **kwargs: Any) -> Any:
        response = self.client.request(method, API + path, **kwargs)
        expected = set(expect)
        assert response.status_code in expected, (
            f"{method} {path} {kwargs} -> {response.status_code} {response.text} "
            f"(expected {sorted(expected)})"
        )
        return response

    def register(self) -> None:
        for job in self.topo.jobs:
            self.call(
                "PUT",
                f"/jobs/{job.name}",
                {201},
                json={"inputs": list(job.inputs), "outputs": [job.output]},
            )

    def apply(self, step: Step) -> Any:
        match step:
            case Advance(ms):
                self.clock.advance(ms)
                return None
            case Tick(jobs):
                self.clock.advance(self.interval)
                return [self.run(job.name) for job in self.topo.jobs if job.name in jobs]
            case Run():
                return self.run(step.job, step.rows, step.fail, step.peek, step.batched)
            case Peek(job):
                return self.peek(job)
            case Replay(job, pick):
                return self.replay(job, pick)
            case Duplicate(pick, batched):
                return self.duplicate(pick, batched)
            case Conflict(pick, kind, bundle):
                return self.conflict(pick, kind, bundle)
            case Version(tables, back_ms, lease_s):
                at = None if back_ms is None else max(0, self.now() - back_ms)
                return self.version(tables, at_or_before=at, lease_seconds=lease_s)
            case Release(pick):
                return self.release(pick)
            case Expiry(table):
                if table is None:
                    return [self.expiry(t) for t in self.topo.tables]
                return self.expiry(table)
            case Flush():
                for job in self.topo.jobs:
                    self.flush(job.name)
                return None
            case ReportIn(job):
                return self.report_in(job)
            case ReleaseGrant(job):
                return self.release_grant(job)
            case Frontiers():
                return self.frontiers()
        raise AssertionError(f"unknown step {step!r}")

    def steady_step(self, skip: Iterable[str] = ()) -> None:
        """One slot of a healthy topology: the clock moves one interval and every job
        (but those in ``skip``) runs once, upstream before downstream."""
        skipped = set(skip)
        self.clock.advance(self.interval)
        for job in self.topo.jobs:
            if job.name not in skipped:
                self.run(job.name)

    # ------------------------------------------------------------------ jobs

    def peek(self, job: str) -> int | None:
        """next-barrier of a derived job; the target it announces is then fixed."""
        jd, js = self.topo.job(job), self.jobs[job]
        if jd.is_source:
            self.call("GET", f"/jobs/{job}/next-barrier", {400, 422})
            return None
        nb = self.call("GET", f"/jobs/{job}/next-barrier", {200}).json()
        assert nb["start_barrier"] == js.frontier, (
            f"next-barrier of {job}: {nb}, frontier {js.frontier}"
        )
        self.log(f"peek {job}: {nb}")
        if not nb["ready"]:
            assert js.pending is None and js.target is None, (
                f"{job}: next-barrier says not ready but batch/target {js.pending or js.target} is fixed"
            )
            assert nb["barrier"] == js.frontier, nb
            return None
        if js.pending is not None:
            assert nb["barrier"] == js.pending.barrier, (
                f"{job}: next-barrier {nb['barrier']} differs from open batch {js.pending.batch_id} "
                f"at {js.pending.barrier}"
            )
        elif js.target is not None:
            assert nb["barrier"] == js.target, (
                f"{job}: target moved from {js.target} to {nb['barrier']}"
            )
        js.target = nb["barrier"]
        assert nb["barrier"] > js.frontier and nb["barrier"] % self.interval == 0, nb
        return js.target

    def run(
        self,
        job: str,
        rows: int = 1,
        fail: str = "none",
        peek: bool = False,
        batched: bool = False,
    ) -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        if jd.is_source and js.floor is not None and (fail == "offline" or js.claims):
            return self._run_offline(jd, js, rows, fail)
        if fail == "offline":
            fail = "report_later"  # no grant: the job waits for the service, then reports later
        if not jd.is_source:
            self.flush(job)  # its next batch starts once the previous one is committed
        if peek and not jd.is_source:
            self.peek(job)
        p = js.pending
        batch_id = p.batch_id if p is not None else js.next_batch
        r = self.call("POST", f"/jobs/{job}/batches/{batch_id}/barrier", {200, 409})
        if r.status_code == 409:
            code = r.json().get("code")
            assert (
                not jd.is_source and p is None and js.target is None and code == "no_barrier_ready"
            ), f"{job} batch {batch_id} refused: {r.text} (open batch {p}, target {js.target})"
            self.log(f"run {job} batch {batch_id}: no barrier ready")
            return "idle"
        answer = r.json()
        b = answer["barrier"]
        assert answer["job"] == job and answer["batch_id"] == batch_id, answer
        assert not answer["committed"], f"{job} batch {batch_id} is not reported yet: {answer}"
        assert b % self.interval == 0 and 0 < b <= self.now_slot(), (
            f"barrier {b} off grid or future"
        )
        if p is not None:
            # G3: a replayed batch gets the same barrier and reads the same ranges.
            assert b == p.barrier, (
                f"{job} batch {batch_id} replayed at {b}, first given {p.barrier}"
            )
            assert answer["start_barrier"] == p.answer["start_barrier"], (answer, p.answer)
            assert _ranges(answer) == _ranges(p.answer), (answer, p.answer)
            self.stats["replayed open batch"] += 1
        elif jd.is_source:
            assert answer["start_barrier"] is None and answer["inputs"] == [], answer
            # "it gets the current clock slot" (the manual clock never goes back)
            assert b == self.now_slot(), f"source batch got {b}, current slot {self.now_slot()}"
            assert b >= max((d.barrier for d in js.done), default=0)
            if js.floor is not None:
                js.floor = max(js.floor, b)  # later offline batches never go below it
            delta = Counter({(jd.output, next(self._row_seq), b): 1 for _ in range(rows)})
            self.source_rows[jd.output].extend(delta)
            p = js.pending = Pending(batch_id, b, answer, delta)
        else:
            if js.target is not None:
                assert b == js.target, (
                    f"{job} batch {batch_id} got {b}, next-barrier said {js.target}"
                )
            p = js.pending = Pending(batch_id, b, answer, self._read_inputs(jd, js, answer))
        self.log(
            f"run {job} batch {batch_id} -> barrier {b}"
            + (
                f" start {answer['start_barrier']} inputs {_ranges(answer)}"
                if not jd.is_source
                else ""
            )
            + (f" fail={fail}" if fail != "none" else "")
        )
        if fail == "before_commit":
            return "crashed before commit"
        if not p.written:
            table = self.tables[jd.output]
            assert table.find(job, batch_id) is None  # never a second snapshot for a batch
            if p.delta:
                p.snapshot = table.append(
                    Snapshot(next(self._snapshot_ids), b, job, batch_id, Counter(p.delta))
                )
            p.written = True
        if fail == "after_commit":
            return "crashed before report"
        js.outbox.append(p)
        js.pending = None
        js.next_batch = batch_id + 1
        if fail == "report_later":
            self.log(f"{job} batch {batch_id}: report waits in the outbox")
            return "report queued"
        self.flush(job, batched)
        return "committed"

    def _run_offline(self, jd: JobDef, js: JobState, rows: int, fail: str) -> str:
        """A source batch while the service is unreachable: a barrier of the job's own,
        claimed in the outbox before the commit; the report waits in the outbox too."""
        assert js.floor is not None
        p = js.pending
        if p is not None and (p.written or p.claimed):
            batch_id = p.batch_id  # replayed: its claimed or stamped barrier stands
        else:
            batch_id = p.batch_id if p is not None else js.next_batch
            if p is not None:  # asked online, crashed before committing: re-tag its rows
                for row in p.delta:
                    self.source_rows[jd.output].remove(row)
            used = [d.barrier for d in js.done] + [q.barrier for q in js.outbox]
            b = max(js.floor, self.now_slot(), *used)
            js.floor = b
            delta = Counter({(jd.output, next(self._row_seq), b): 1 for _ in range(rows)})
            self.source_rows[jd.output].extend(delta)
            p = js.pending = Pending(batch_id, b, {"offline": True}, delta, claimed=True)
            js.claims.append((batch_id, b))
        self.log(f"run {jd.name} batch {batch_id} offline -> barrier {p.barrier} fail={fail}")
        if fail == "before_commit":
            return "crashed before commit"
        if not p.written:
            table = self.tables[jd.output]
            assert table.find(jd.name, batch_id) is None
            if p.delta:
                p.snapshot = table.append(
                    Snapshot(next(self._snapshot_ids), p.barrier, jd.name, batch_id, p.delta)
                )
            p.written = True
        if fail == "after_commit":
            return "crashed before report"
        js.outbox.append(p)
        js.pending = None
        js.next_batch = batch_id + 1
        return "committed offline"

    def report_in(self, job: str) -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        if not jd.is_source:
            return "not a source job"
        if js.claims:
            return "claims undelivered"
        promise = max(js.floor or 0, self.now_slot())
        grant = self.call("PUT", f"/jobs/{job}/offline-grant", {200}, json={"floor": promise})
        body = grant.json()
        assert body["floor"] <= max(promise, body["barrier"]), body
        js.floor = max(promise, body["barrier"])
        self.log(f"report in {job}: floor {body['floor']}")
        return "reported in"

    def release_grant(self, job: str) -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        if not jd.is_source or js.floor is None:
            return "no grant"
        self.flush(job)  # the release goes through the outbox, after the claims
        self.call("DELETE", f"/jobs/{job}/offline-grant", {204})
        js.floor = None
        return "released"

    def _read_inputs(self, jd: JobDef, js: JobState, answer: dict) -> Counter:
        a, b = answer["start_barrier"], answer["barrier"]
        assert a == js.frontier, f"{jd.name} starts after {a}, but committed up to {js.frontier}"
        assert b > a, answer
        ranges = {r["table"]: r for r in answer["inputs"]}
        assert sorted(ranges) == sorted(jd.inputs), answer
        delta: Counter = Counter()
        for name in jd.inputs:
            rg, table = ranges[name], self.tables[name]
            assert (rg["from_barrier"], rg["to_barrier"]) == (a, b), rg
            # The barrier-to-snapshot mapping, recomputed from the simulator's own records.
            assert rg["from_snapshot"] == table.snapshot_at(a), (rg, table.snapshot_at(a))
            assert rg["to_snapshot"] == table.snapshot_at(b), (rg, table.snapshot_at(b))
            for row, n in table.read(rg["from_snapshot"], rg["to_snapshot"]).items():
                delta[(jd.name, name, row)] += n
        return delta

    def _report_of(self, jd: JobDef, batch_id: int, barrier: int, snapshot_id: int | None) -> dict:
        return {
            "job": jd.name,
            "batch_id": batch_id,
            "barrier": barrier,
            "table": jd.output,
            "snapshot_id": snapshot_id,
        }

    def flush(self, job: str, batched: bool = False) -> None:
        """Deliver the job's outbox, oldest report first."""
        jd, js = self.topo.job(job), self.jobs[job]
        while js.claims:
            batch_id, barrier = js.claims[0]
            answer = self.call(
                "POST", f"/jobs/{job}/batches/{batch_id}/barrier", {200}, json={"barrier": barrier}
            ).json()
            assert answer["barrier"] == barrier, (answer, barrier)
            js.claims.pop(0)
            self.log(f"claim {job} batch {batch_id} at {barrier}")
        while js.outbox:
            self._report(jd, js, js.outbox.pop(0), batched)

    def _report(self, jd: JobDef, js: JobState, p: Pending, batched: bool) -> None:
        snapshot_id = p.snapshot.snapshot_id if p.snapshot is not None else None
        report = self._report_of(jd, p.batch_id, p.barrier, snapshot_id)
        if batched:
            body = self.call(
                "POST", "/commits/batch", {200}, json={"commits": [report, report]}
            ).json()
            statuses = [r["status"] for r in body["results"]]
            assert statuses == ["recorded", "duplicate"], body
            assert (body["recorded"], body["duplicates"]) == (1, 1), body
            assert all(r["batch_committed"] for r in body["results"]), body
        else:
            body = self.call("POST", "/commits", {200}, json=report).json()
            assert body["status"] == "recorded" and body["batch_committed"], body
        if p.snapshot is not None:
            p.snapshot.reported = True
        js.done.append(Done(p.batch_id, p.barrier, p.answer, snapshot_id))
        js.target = None
        self.history.append(report)
        self.log(f"report {report}")
        if G1 in self.checks and not jd.is_source:
            # A derived table is exact at every barrier it commits.
            at = self.tables[jd.output].snapshot_at(p.barrier)
            what = f"{jd.name} committed batch {p.batch_id} at {p.barrier}"
            self.check_exact({jd.output: at}, p.barrier, what)
            self.stats["G1 derived commits checked"] += 1

    # ------------------------------------------------------------------ G3

    def state(self, tables: Iterable[str] | None = None, *, job_fields: bool = True) -> dict:
        """What a report must not change: the tables' barrier-to-snapshot mappings (all
        tables by default) and the jobs (frontiers, last batch, pending target...)."""
        names = self.topo.tables if tables is None else list(tables)
        snap = {
            t: self.call("GET", f"/tables/{t}/snapshots", {200}, params={"limit": 1000}).json()
            for t in names
        }
        if job_fields:
            jobs = self.call("GET", "/jobs", {200}, params={"limit": 1000}).json()
            snap["jobs"] = jobs
        return snap

    def replay(self, job: str, pick: int = 0) -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        if not js.done:
            return "nothing to replay"
        d = js.done[pick % len(js.done)]
        before = self.state([jd.output], job_fields=False) if G3 in self.checks else None
        answer = self.call("POST", f"/jobs/{job}/batches/{d.batch_id}/barrier", {200}).json()
        assert answer["barrier"] == d.barrier, f"{job} batch {d.batch_id}: {answer} was {d.barrier}"
        assert answer["committed"], f"{job} batch {d.batch_id} was reported: {answer}"
        assert answer["start_barrier"] == d.answer["start_barrier"], (answer, d.answer)
        assert _ranges(answer) == _ranges(d.answer), (answer, d.answer)
        # The sink finds the batch in the table's snapshot summaries, writes nothing, reports again.
        found = self.tables[jd.output].find(job, d.batch_id)
        assert (found.snapshot_id if found else None) == d.snapshot_id
        report = self._report_of(jd, d.batch_id, d.barrier, d.snapshot_id)
        body = self.call("POST", "/commits", {200}, json=report).json()
        assert body["status"] == "duplicate" and body["batch_committed"], body
        if before is not None:
            assert self.state([jd.output], job_fields=False) == before, "replay changed the mapping"
        self.stats["replayed finished batch"] += 1
        self.log(f"replay {job} batch {d.batch_id} at {d.barrier}: same barrier, duplicate report")
        return "replayed"

    def duplicate(self, pick: int = 0, batched: bool = False) -> str:
        if not self.history:
            return "no report yet"
        report = self.history[pick % len(self.history)]
        other = self.history[(pick * 7 + 3) % len(self.history)]
        touched = sorted({report["table"], other["table"]} if batched else {report["table"]})
        before = self.state(touched) if G3 in self.checks else None
        if batched:
            body = self.call(
                "POST", "/commits/batch", {200}, json={"commits": [report, other]}
            ).json()
            assert [r["status"] for r in body["results"]] == ["duplicate", "duplicate"], body
            assert (body["recorded"], body["duplicates"]) == (0, 2), body
        else:
            body = self.call("POST", "/commits", {200}, json=report).json()
            assert body["status"] == "duplicate" and body["batch_committed"], body
        if before is not None:
            assert self.state(touched) == before, f"duplicate {report} changed the service's state"
        self.stats["duplicate"] += 1
        self.log(f"duplicate {report}: status duplicate")
        return "duplicate"

    def _written_batch(self) -> tuple[JobDef, Pending] | None:
        """A batch committed to its table but not reported: an existing one, or the
        next batch of the first job that has one to run, crashed before its report."""
        for jd in self.topo.jobs:
            p = self.jobs[jd.name].pending
            if p is not None and p.written:
                return jd, p
        for jd in self.topo.jobs:
            if self.run(jd.name, fail="after_commit") == "crashed before report":
                return jd, self.jobs[jd.name].pending  # type: ignore[return-value]
        return None

    def conflict(self, pick: int = 0, kind: str = "other_snapshot", bundle: bool = False) -> str:
        if not self.history:
            return "no report yet"
        report = self.history[pick % len(self.history)]
        bad: dict | None = None
        if kind == "stolen_snapshot":
            # An open batch claims a snapshot the table already has for another batch.
            for jd in self.topo.jobs:
                p = self.jobs[jd.name].pending
                taken = self.tables[jd.output].reported()
                if p is not None and taken:
                    stolen = taken[pick % len(taken)].snapshot_id
                    bad = self._report_of(jd, p.batch_id, p.barrier, stolen)
                    break
        if kind == "no_snapshot" and report["snapshot_id"] is not None:
            bad = {**report, "snapshot_id": None}
        if kind == "other_barrier":
            bad = {**report, "barrier": report["barrier"] - self.interval}
        if bad is None:
            bad = {**report, "snapshot_id": next(self._snapshot_ids)}
        body = [bad]
        if bundle:
            # With a duplicate and a valid first report of a written batch, which must
            # not be recorded either (all or nothing).
            body = [self.history[(pick * 7 + 3) % len(self.history)]]
            written = self._written_batch()
            if written is not None:
                jd, p = written
                snapshot_id = p.snapshot.snapshot_id if p.snapshot is not None else None
                body.append(self._report_of(jd, p.batch_id, p.barrier, snapshot_id))
            body.append(bad)
        touched = sorted({r["table"] for r in body})
        before = self.state(touched) if G3 in self.checks else None
        if len(body) == 1:
            r = self.call("POST", "/commits", {409}, json=bad)
        else:
            r = self.call("POST", "/commits/batch", {409}, json={"commits": body})
        assert r.json()["code"] in {"conflicting_report", "barrier_mismatch"}, r.text
        if before is not None:
            assert self.state(touched) == before, f"refused {body} changed the service's state"
        self.stats["conflict refused"] += 1
        self.log(f"conflict {kind} {body}: 409 {r.json()['code']}")
        return "refused"

    # ------------------------------------------------------------------ G1

    def oracle(self, table: str, barrier: int, _memo: dict | None = None) -> Counter:
        """The table recomputed from the source rows with barrier <= ``barrier``."""
        memo = {} if _memo is None else _memo
        if table in memo:
            return memo[table]
        job = self.topo.writer(table)
        if job.is_source:
            out = Counter(r for r in self.source_rows[table] if r[2] <= barrier)
        else:
            out = Counter()
            for name in job.inputs:
                for row, n in self.oracle(name, barrier, memo).items():
                    out[(job.name, name, row)] += n
        memo[table] = out
        return out

    def check_exact(self, snapshots: dict[str, int | None], barrier: int, what: str) -> None:
        memo: dict = {}
        contents = {t: self.tables[t].content(s) for t, s in snapshots.items()}
        expected = {t: self.oracle(t, barrier, memo) for t in snapshots}
        for t in sorted(snapshots):
            if contents[t] != expected[t]:
                extra, missing = contents[t] - expected[t], expected[t] - contents[t]
                raise AssertionError(
                    f"G1: {what}: {t} at snapshot {snapshots[t]} is not the table recomputed "
                    f"from the sources up to {barrier}: extra rows {sorted(extra.elements())}, "
                    f"missing rows {sorted(missing.elements())}"
                )
        assert combine(contents) == combine(expected), f"G1: {what}: joined result differs"

    def version(
        self,
        tables: Sequence[str],
        at_or_before: int | None = None,
        lease_seconds: int | None = None,
    ) -> dict | None:
        """The consistent version of ``tables`` (None on 409), checked against the oracle."""
        params: dict[str, Any] = {"tables": ",".join(tables)}
        if at_or_before is not None:
            params["at_or_before"] = at_or_before
        if lease_seconds is not None:
            params["lease_seconds"] = lease_seconds
        r = self.call("GET", "/versions/consistent", {200, 409}, params=params)
        if r.status_code == 409:
            assert r.json()["code"] == "no_consistent_version", r.text
            self.log(f"version {params}: none")
            return None
        v = r.json()
        b = v["barrier"]
        self.log(f"version {params}: {v}")
        assert set(v["snapshots"]) == set(tables), v
        assert b > 0 and b % self.interval == 0, (
            f"consistent barrier {b} is not on the grid ({params})"
        )
        if at_or_before is not None:
            assert b <= at_or_before, v
        if G1 in self.checks:
            self.check_exact(v["snapshots"], b, f"consistent version {params} = {v}")
            self.stats["G1 versions checked"] += 1
        if lease_seconds is not None:
            assert v["lease_expires_ms"] == self.now() + lease_seconds * 1000, v
            self.leases[v["lease_id"]] = LeaseRecord(
                v["lease_id"], v["lease_expires_ms"], b, dict(v["snapshots"])
            )
        return v

    def frontiers(self) -> dict[str, int]:
        """Every table's frontier (GET /tables). For G1: each table contains, at its
        frontier, exactly the source data up to it; frontiers never go back."""
        items = self.call("GET", "/tables", {200}, params={"limit": 1000}).json()["items"]
        fronts = {t["name"]: t["frontier"] for t in items}
        assert set(fronts) == set(self.topo.tables), fronts
        for t, f in fronts.items():
            assert f is not None and f % self.interval == 0, (t, f)
            assert f >= self.last_frontier.get(t, 0), f"frontier of {t} went back to {f}"
            assert f < self.now_slot() or f == 0, f"frontier of {t} at {f}: its slot is not over"
            if G1 in self.checks and f > 0:
                self.check_exact({t: self.tables[t].snapshot_at(f)}, f, f"frontier of {t} = {f}")
                self.stats["G1 frontiers checked"] += 1
        self.last_frontier = fronts
        return fronts

    # ------------------------------------------------------------------ G5

    def release(self, pick: int = 0) -> str:
        if not self.leases:
            return "no lease"
        lease = sorted(self.leases.values(), key=lambda lease: lease.lease_id)[
            pick % len(self.leases)
        ]
        live = lease.expires_ms > self.now()
        self.call("DELETE", f"/leases/{lease.lease_id}", {204} if live else {204, 404})
        del self.leases[lease.lease_id]
        self.log(f"release lease {lease.lease_id} (live={live})")
        return "released"

    def in_use(self, table: str) -> dict[int, list[str]]:
        """Snapshots of ``table`` that must not be expired, from the simulator's records."""
        ts = self.tables[table]
        reported = ts.reported()
        reasons: dict[int, list[str]] = {}
        if not reported:
            return reasons
        reasons.setdefault(reported[-1].snapshot_id, []).append("current")
        for lease in self.leases.values():
            snapshot = lease.snapshots.get(table)
            if lease.expires_ms > self.now() and snapshot is not None:
                reasons.setdefault(snapshot, []).append(f"lease {lease.lease_id}")
        for reader in self.topo.readers(table):
            frontier = self.jobs[reader.name].frontier
            start = ts.snapshot_at(frontier)
            pinned = start if start is not None else reported[0].snapshot_id
            reasons.setdefault(pinned, []).append(f"start of {reader.name} (frontier {frontier})")
        return reasons

    def expiry(self, table: str) -> dict:
        plan = self.call("GET", f"/tables/{table}/expirable", {200}).json()
        listed = [p["snapshot_id"] for p in plan["expirable"]]
        kept = [p["snapshot_id"] for p in plan["kept"]]
        reported = [s.snapshot_id for s in self.tables[table].reported()]
        assert listed + kept == reported, f"plan of {table} {plan} vs reported {reported}"
        self.log(f"expiry {table}: expirable {listed}")
        if G5 in self.checks:
            in_use = self.in_use(table)
            wrong = {s: in_use[s] for s in listed if s in in_use}
            assert not wrong, f"G5: plan of {table} lists snapshots in use: {wrong}; plan {plan}"
            if listed and in_use:
                oldest = min(reported.index(s) for s in in_use)
                assert reported.index(listed[-1]) < oldest, (
                    f"G5: {table}: expirable {listed} reaches past the oldest in use "
                    f"{reported[oldest]} ({in_use})"
                )
            self.stats["G5 plans checked"] += 1
            if listed:
                self.stats["G5 plans with expirable snapshots"] += 1
        return plan


# --------------------------------------------------------------------------- strategies


@st.composite
def topologies(draw: Any, max_sources: int = 3, max_derived: int = 4) -> Topology:
    """1..max_sources source jobs writing one table each, then 1..max_derived derived
    jobs each reading 1-3 tables that already exist and writing a new one (a DAG)."""
    n_sources = draw(st.integers(1, max_sources))
    n_derived = draw(st.integers(1, max_derived))
    jobs = [JobDef(f"src{i}", f"ods.s{i}") for i in range(n_sources)]
    for i in range(n_derived):
        existing = [j.output for j in jobs]
        inputs = draw(
            st.lists(
                st.sampled_from(existing), min_size=1, max_size=min(3, len(existing)), unique=True
            )
        )
        jobs.append(JobDef(f"der{i}", f"dw.d{i}", tuple(sorted(inputs))))
    return Topology(tuple(jobs))


DEFAULT_WEIGHTS = {
    "advance": 4,
    "run": 8,
    "tick": 2,
    "peek": 1,
    "replay": 1,
    "duplicate": 1,
    "conflict": 1,
    "version": 2,
    "release": 0,
    "expiry": 1,
    "frontiers": 0,
}


def step_strategy(topology: Topology, kind: str) -> st.SearchStrategy[Step]:
    jobs = st.sampled_from([j.name for j in topology.jobs])
    derived = st.sampled_from([j.name for j in topology.derived])
    tables = st.sampled_from(topology.tables)
    picks = st.integers(0, 50)
    if kind == "advance":
        return st.builds(
            Advance,
            st.one_of(st.integers(0, 3).map(lambda n: n * INTERVAL_MS), st.integers(0, 3000)),
        )
    if kind == "run":
        return st.builds(
            Run,
            jobs,
            rows=st.integers(0, 3),
            fail=st.sampled_from(
                ["none", "none", "none", "before_commit", "after_commit", "report_later"]
            ),
            peek=st.booleans(),
            batched=st.booleans(),
        )
    if kind == "tick":
        names = [j.name for j in topology.jobs]
        return st.builds(
            Tick,
            st.sets(st.sampled_from(names)).map(lambda js: tuple(n for n in names if n in js)),
        )
    if kind == "peek":
        return st.builds(Peek, derived)
    if kind == "replay":
        return st.builds(Replay, jobs, picks)
    if kind == "duplicate":
        return st.builds(Duplicate, picks, st.booleans())
    if kind == "conflict":
        return st.builds(
            Conflict,
            picks,
            st.sampled_from(["other_snapshot", "no_snapshot", "other_barrier", "stolen_snapshot"]),
            st.booleans(),
        )
    if kind == "version":
        return st.builds(
            Version,
            st.lists(tables, min_size=1, max_size=3, unique=True).map(lambda ts: tuple(sorted(ts))),
            st.none() | st.integers(0, 6000),
            st.none() | st.integers(1, 30),
        )
    if kind == "release":
        return st.builds(Release, picks)
    if kind == "expiry":
        return st.just(Expiry())
    if kind == "frontiers":
        return st.just(Frontiers())
    if kind in ("report_in", "offline", "release_grant") and not topology.sources:
        return st.just(Frontiers())
    sources = st.sampled_from([j.name for j in topology.sources])
    if kind == "report_in":
        return st.builds(ReportIn, sources)
    if kind == "release_grant":
        return st.builds(ReleaseGrant, sources)
    if kind == "offline":
        return st.builds(
            Run,
            sources,
            rows=st.integers(0, 3),
            fail=st.sampled_from(["offline", "offline", "before_commit", "after_commit"]),
        )
    if kind == "flush":
        return st.just(Flush())
    raise ValueError(kind)


def schedules(
    topology: Topology,
    weights: dict[str, int] | None = None,
    min_size: int = 0,
    max_size: int = 30,
) -> st.SearchStrategy[list[Step]]:
    """Random interleavings of job turns, clock moves, replays, reports and queries."""
    w = DEFAULT_WEIGHTS if weights is None else weights
    first = ("advance", "run", "tick")
    order = [*first, *sorted(k for k in w if k not in first)]
    alternatives = [step_strategy(topology, k) for k in order for _ in range(w.get(k, 0))]
    return st.lists(st.one_of(alternatives), min_size=min_size, max_size=max_size)
