"""A Spark-free simulation of barrier-aligned ETL jobs driving the real MetaService.

The simulator plays every Spark query of a random ETL topology against the REST
API (any client with ``request(method, url, ...)``, e.g. starlette's TestClient)
on a :class:`~metaservice.clock.ManualClock`, and keeps its own Iceberg-like record
of every table, so it can check the service's answers against an oracle that knows
nothing about the service:

* a **source job**'s batch asks for its barrier and ingests a few new unique rows
  ``(table, seq, barrier)`` tagged with the barrier it was given; a snapshot holds
  the rows appended by that commit, a table's content at a snapshot is every row
  appended up to it (append-only, like Iceberg);
* a **derived job** runs as Spark runs it, incrementally. Each trigger, each of its
  barrier sources (one per input, in the query's fixed order) asks
  ``next-barrier?after=A&source=T`` with the query's offset A; Spark plans the
  batch (A, B] only when every source reported the same end B (a disagreement is a
  G1 failure). Planning reads each input's range through ``GET /jobs/{job}/ranges``
  (one call per source, as the barrier sources do): the rows appended by the input's
  snapshots in ``(from_snapshot, to_snapshot]``. The sink then asks
  ``POST .../batches/{k}/barrier`` with ``{start, end, query_id}`` and appends
  ``f(rows read)`` (one row ``(job, input, row)`` per row read: a multiset, so a row
  read twice shows up twice) as a new snapshot stamped B, or reports
  ``snapshot_id: null`` when it read nothing. Its report may wait in the outbox
  while the next trigger asks for offsets (even between its sources' calls). A
  planned batch the service refuses as an empty range (it advanced the idle job past
  its end meanwhile) is skipped, as the sink does, and must have read no row;
* the **oracle** recomputes any table as of barrier ``b`` from the source rows
  alone: a source table holds its rows with barrier ``<= b``, a derived table is
  ``f`` of its inputs' oracle contents.

Failures are simulated the way Spark shows them to the service: a batch that
crashes before its Iceberg commit, or after it but before the report, is replayed
under the same batch id with the offsets of Spark's offset log; a finished batch
may be asked for again; reports may be sent twice, batched, or with conflicting
contents; a Spark query re-created under a job's name (a reset checkpoint) asks for
batch 0 again. Source jobs holding an **offline grant** give their batches barriers
of their own while the service is unreachable (possibly from a clock running up to
60 s ahead), and claim them later. A source driver may die with an open batch,
which an operator abandons (the restarted driver replays it, online or offline);
jobs are re-registered (same spec, refused identity changes, outputs added and
removed), and the state changes of DESIGN.md are drawn between batches: an output
added while a batch is open (with a late report for it) or moved to another job, the
inputs of a job that never committed changed, a job deleted and registered again or
replaced by a new writer (the table keeps its history), ``reconcile`` over every
stamped snapshot (a dead driver's commits included), retention, and, on real Iceberg
tables, revisions created, run, swapped and cancelled, expiry run after its dry run,
and tags.

Checks, each switched on by ``checks``, and one always made: **every state change
keeps every answer** (``Simulation.step``): each consistent version handed out is kept
under (tables, at_or_before) and asked for again after each step, and must come back
unchanged (or 409 expired, once a snapshot it names was expired); an edit the service
refuses with 409 changes no row (``Simulation.edit``).

* **G1** every consistent version, every table at its frontier and every derived
  table at each barrier it commits holds exactly the oracle's rows; every range a
  derived batch reads is the simulator's own barrier-to-snapshot mapping;
* **G2** consistent versions never go back, and reach the bound that
  ``frontiers.aligned_target`` proves: with F the least frontier of the tables
  (from ``GET /jobs`` just before), P the least power of two such that no derived
  job among the members and their derived upstream has a batch of more than P slots
  ending after F - P, and M the largest multiple of P slots <= F, the version is at
  least M whenever M lies past every such job's first batch (batches are known from
  the ends of the Spark batches and the frontiers seen, so the service's own
  advances of idle jobs count, coalesced: a safe over-approximation);
  a source job's barrier is its slot, never moved by another job's clock;
* **G3** replayed batches get the same barrier and ranges and never a second
  snapshot; duplicate reports change nothing; conflicting or refused requests
  (plans Spark did not get, reset queries, late reports of abandoned batches or
  deleted jobs, refused job changes) answer 409/404 and change no row of the
  database;
* **G5** no expiry plan lists a snapshot in use by the simulator's own records
  (current, leased, the start of a reader's next batch); no version or lease names a
  snapshot an expiry reservation gave away.

Typical use (see tests/metaservice/test_model_properties*.py)::

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
from typing import Any, Protocol

from hypothesis import strategies as st

API = "/api/v1"
INTERVAL_MS = 1000
# How far ahead of the service's clock a source job's own clock may run when it gives
# its batches barriers offline (the service's MAX_CLAIM_AHEAD_MS).
MAX_AHEAD_MS = 60_000

# Which checks a simulation makes besides the protocol basics it needs to run at all.
G1, G2, G3, G5 = "G1", "G2", "G3", "G5"
ALL_CHECKS = frozenset({G1, G2, G3, G5})


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
    """A logical job; ``inputs`` in the order of the Spark query's barrier sources."""

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

    def derived_closure(self, tables: Iterable[str]) -> list[JobDef]:
        """The derived writers of ``tables`` and every derived job upstream of them."""
        seen: dict[str, JobDef] = {}
        todo = list(tables)
        while todo:
            job = self.writer(todo.pop())
            if job.is_source or job.name in seen:
                continue
            seen[job.name] = job
            todo.extend(job.inputs)
        return [j for j in self.jobs if j.name in seen]


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
    report): the next Run replays the batch; "report_later": the report waits in the
    job's outbox while the job goes on (delivered before the job's next report, or by
    Flush); "offline": a source job holding a grant gives the batch a barrier of its
    own (its clock ``ahead_ms`` ahead of the service's) and claims it later; a derived
    job's "before_plan": Spark dies after its sources' offset calls, before writing
    its offset log. mid="flush": every outbox is delivered between the first and the
    other barrier sources' calls (offsets and ranges). batched: report through
    /commits/batch, with the same report twice in the body.
    """

    job: str
    rows: int = 1
    fail: str = "none"
    batched: bool = False
    mid: str = "none"
    ahead_ms: int = 0


@dataclass(frozen=True, repr=False)
class Watermark(Compact):
    """The advancer's raise of the watermark S, on one replica (its clock)."""

    replica: int = 0


@dataclass(frozen=True, repr=False)
class AdvanceIdle(Compact):
    """The advancer's advance of every idle derived job, on one replica."""

    replica: int = 0


@dataclass(frozen=True, repr=False)
class Tick(Compact):
    """One slot of progress: the clock moves one interval, then the named jobs run
    once each, upstream before downstream."""

    jobs: tuple[str, ...]


@dataclass(frozen=True, repr=False)
class Peek(Compact):
    """A derived job's trigger starts: its first ``sources`` barrier sources ask for
    their latest offset; the others ask on the job's next Run (same trigger)."""

    job: str
    sources: int = 1


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
    """Send a report or barrier request contradicting what is recorded (kind:
    other_snapshot, no_snapshot, other_barrier, stolen_snapshot, plan_mismatch,
    empty_range); bundle: a report inside a /commits/batch request that also carries
    valid reports, which must not be recorded either."""

    pick: int = 0
    kind: str = "other_snapshot"
    bundle: bool = False


@dataclass(frozen=True, repr=False)
class Version(Compact):
    """Ask for the consistent version of some tables (at_or_before = now - back_ms),
    with a lease of ``lease_s`` seconds (through POST /leases if ``post``)."""

    tables: tuple[str, ...]
    back_ms: int | None = None
    lease_s: int | None = None
    post: bool = False


@dataclass(frozen=True, repr=False)
class CatalogSession(Compact):
    """Attach an engine through the Iceberg REST catalog: a session on ``consistent`` or,
    with ``back_ms``, on ``at:<now - back_ms>``. Its lease of all tables is recorded as a
    lease (what it pins, as the console lists it); Release ends it."""

    back_ms: int | None = None


@dataclass(frozen=True, repr=False)
class Release(Compact):
    """End one of the leases taken so far."""

    pick: int = 0


@dataclass(frozen=True, repr=False)
class Expiry(Compact):
    """Ask for a table's expiry plan (None: every table's); reserve: as an executor
    does, reserve what the plan lists (when the service has reservations)."""

    table: str | None = None
    reserve: bool = False


@dataclass(frozen=True, repr=False)
class Flush(Compact):
    """The service is reachable again: jobs deliver their outboxes, in order (every
    job's, or one job's)."""

    job: str | None = None


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


@dataclass(frozen=True, repr=False)
class Reregister(Compact):
    """PUT the job again: "same" spec; "kind", "add_input", "drop_input" (refused once
    the job has run, else allowed and put back); "add_output" (allowed any time);
    "drop_output" (the added one: refused while a batch is open)."""

    job: str
    change: str = "same"


@dataclass(frozen=True, repr=False)
class Replace(Compact):
    """Replace the writer of the job's table: the old driver stops (delivering its
    outbox if ``drain``, else its reports arrive late), ``DELETE /jobs/{job}`` (refused
    while another job reads the table), and a new job takes the table: it keeps its
    history, and the new job starts above it (a derived one after its frontier)."""

    job: str
    drain: bool = True


@dataclass(frozen=True, repr=False)
class Abandon(Compact):
    """A source driver dies with its open batch (the one it has, or its next one, after
    its Iceberg commit if ``written``): an operator abandons the batch; the restarted
    driver replays it on the job's next Run (a batch it had committed to Iceberg first
    reports late, is refused, and is rolled back)."""

    job: str
    written: bool = False


@dataclass(frozen=True, repr=False)
class ResetQuery(Compact):
    """A new Spark query (a reset checkpoint) starts under the job's name: its batch 0
    is refused (409 query_reset) and the old checkpoint goes on."""

    job: str


@dataclass(frozen=True, repr=False)
class LateOutput(Compact):
    """An output is added to the job while its batch is open (or after its last batch,
    ``done``), and a report of that batch arrives for the new output: the batch was
    opened before the edit, so the report must be refused and change nothing."""

    job: str
    done: bool = False


@dataclass(frozen=True, repr=False)
class MoveOutput(Compact):
    """The job's added output (``<table>_x``, added first if it has none) moves to the
    next job of the topology: removed from one, then added to the other; either edit may
    be refused (409, nothing changed)."""

    job: str


@dataclass(frozen=True, repr=False)
class ChangeInputs(Compact):
    """A derived job that never committed, after its sources planned (``Peek``), gets
    other inputs ("add_input" or "drop_input") for good; a 409 must change nothing."""

    job: str
    change: str = "add_input"


@dataclass(frozen=True, repr=False)
class Rejoin(Compact):
    """A source job is deleted and registered again (under its name, or a new one when
    ``rename``), its driver restarting with a new query: the table keeps its history."""

    job: str
    rename: bool = False


@dataclass(frozen=True, repr=False)
class Reconcile(Compact):
    """``metaservice reconcile``: the service reads every table's stamped snapshots (a
    dead driver's commits of abandoned batches included) and records what it lacks."""


@dataclass(frozen=True, repr=False)
class Retention(Compact):
    """PUT /tables/{table}/retention with keep_last: expiry plans keep the newest N."""

    table: str
    keep_last: int = 2


@dataclass(frozen=True, repr=False)
class Revise(Compact):
    """POST /revisions: revise a derived table from a barrier its writer committed (the
    ``back``-th newest one it is known to have had)."""

    table: str
    back: int = 0


@dataclass(frozen=True, repr=False)
class RunRevision(Compact):
    """The revision's jobs run: one (``pick``) or every one, upstream first."""

    pick: int | None = None
    fail: str = "none"


@dataclass(frozen=True, repr=False)
class Swap(Compact):
    """POST /revisions/{id}/swap (not waiting): refused (not ready), swapping (the
    original writers are superseded) or swapped (the mirrors carry the names)."""


@dataclass(frozen=True, repr=False)
class CancelRevision(Compact):
    """DELETE /revisions/{id}: the mirrors and the revision's jobs are dropped."""


@dataclass(frozen=True, repr=False)
class ExpireNow(Compact):
    """POST /tables/{table}/expire, a dry run first: the run removes what the dry run
    listed, nothing in use, and no version or lease is handed out on it afterwards."""

    table: str


@dataclass(frozen=True, repr=False)
class Tag(Compact):
    """POST /versions/tags: publish the consistent version of some tables (at or before
    now - back_ms), ending after ``retain_s`` seconds (None: kept until deleted)."""

    tables: tuple[str, ...]
    back_ms: int | None = None
    retain_s: int | None = None


@dataclass(frozen=True, repr=False)
class DropTag(Compact):
    """DELETE /versions/tags/{name} of one of the tags made so far."""

    pick: int = 0


Step = (
    Advance
    | Watermark
    | AdvanceIdle
    | Tick
    | Run
    | Peek
    | Replay
    | Duplicate
    | Conflict
    | Version
    | CatalogSession
    | Release
    | Expiry
    | Flush
    | ReportIn
    | ReleaseGrant
    | Frontiers
    | Reregister
    | Replace
    | Abandon
    | ResetQuery
    | LateOutput
    | MoveOutput
    | ChangeInputs
    | Rejoin
    | Reconcile
    | Retention
    | Revise
    | RunRevision
    | Swap
    | CancelRevision
    | ExpireNow
    | Tag
    | DropTag
)

# Steps that change the service's state beyond job progress: after each, every answer
# the memo holds is asked for again (after other steps, a few of them in turn).
STATE_CHANGES = (
    Reregister,
    Replace,
    Abandon,
    LateOutput,
    MoveOutput,
    ChangeInputs,
    Rejoin,
    Reconcile,
    Retention,
    Flush,
    Revise,
    Swap,
    CancelRevision,
    ExpireNow,
    Tag,
    DropTag,
)


# --------------------------------------------------------------------------- state


class Lake(Protocol):
    """Real Iceberg tables in the service's catalog (for revisions: mirrors are made
    from the tables' metadata)."""

    def ensure(self, table: str) -> None:
        """Create the table if it does not exist."""

    def commit(self, table: str, job: str, batch_id: int, barrier: int, rows: Counter) -> int:
        """Append the rows as one snapshot stamped with the batch; its snapshot id."""
        ...


@dataclass
class Snapshot:
    snapshot_id: int
    barrier: int
    job: str
    batch_id: int
    delta: Counter  # the rows this commit appended
    reported: bool = False
    mirror_start: bool = False  # a revision's mirror starts here (the service's own record)


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

    def roll_back(self, snapshot: Snapshot) -> None:
        """Remove the newest snapshot (an operator undoing an orphan commit)."""
        assert self.snapshots and self.snapshots[-1] is snapshot and not snapshot.reported
        self.snapshots.pop()
        del self._position[snapshot.snapshot_id]
        self._cached = (-1, Counter())

    def position_any(self, snapshot: Snapshot) -> int:
        """Where a snapshot is in commit order, reported or not."""
        return self._position[snapshot.snapshot_id]

    def has(self, snapshot_id: int) -> bool:
        return snapshot_id in self._position

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
        """Incremental append scan: rows appended by the snapshots in (from, to]; from
        None reads the table's whole state at ``to``."""
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
        for snapshot in self.snapshots:
            if snapshot.reported and snapshot.barrier <= barrier:
                found = snapshot.snapshot_id
        return found


@dataclass
class Pending:
    """A batch that was given its barrier (or claimed one offline), not reported yet."""

    batch_id: int
    barrier: int
    answer: dict
    delta: Counter
    outputs: tuple[str, ...]  # the job's outputs when the batch opened: each gets a report
    start: int | None = None  # derived: the batch is (start, barrier]
    ranges: list[tuple] = field(default_factory=list)  # derived: what it read
    written: bool = False  # committed to the table already
    snapshot: Snapshot | None = None
    claimed: bool = False  # the job gave it its barrier offline
    known: bool = True  # the service knows the batch (False: offline claim not delivered)
    abandoned: bool = False  # an operator abandoned it: its driver is dead
    reclaim: bool = False  # the offline replay of an abandoned batch: its claim may be refused
    reconciled: bool = False  # `reconcile` recorded its snapshot before its report arrived


@dataclass
class Done:
    batch_id: int
    barrier: int
    start: int | None
    answer: dict
    snapshot_id: int | None
    outputs: tuple[str, ...]


@dataclass
class JobState:
    """One incarnation of a logical job: the service's job ``name`` and its Spark query."""

    logical: str
    name: str
    query: str
    outputs: list[str]
    next_batch: int = 0
    pending: Pending | None = None
    done: list[Done] = field(default_factory=list)
    outbox: list[Pending] = field(default_factory=list)  # written, reports not delivered
    ran: bool = False  # the service has (had) a Spark batch of this job
    newest: tuple[int, int] | None = None  # (batch id, barrier) of its newest known batch
    # derived jobs, Spark's side
    offset: int = 0  # the start of the next batch: the end of the last one Spark ran
    planned: tuple[int, int, int] | None = None  # (batch, start, end) in the offset log
    asked: dict[str, int] = field(default_factory=dict)  # this trigger's sources' answers
    ends: set[int] = field(default_factory=set)  # frontiers it is known to have had (G2)
    # source jobs holding an offline grant
    floor: int | None = None
    claims: list[Pending] = field(default_factory=list)  # undelivered, in batch order
    # a revision job: the tables it reads for its logical inputs (the affected ones' mirrors)
    reads: dict[str, str] = field(default_factory=dict)

    def source(self, logical: str) -> str:
        return self.reads.get(logical, logical)

    @property
    def committed(self) -> int:
        """The last barrier whose report the service recorded (0 before the first)."""
        return max((d.barrier for d in self.done), default=0)

    def open_in_service(self) -> list[Pending]:
        """Batches the service holds open: known, not reported, not abandoned."""
        batches = [*self.outbox, *([self.pending] if self.pending is not None else [])]
        return [p for p in batches if p.known and not p.abandoned]


@dataclass
class RevisionState:
    """A revision the service planned, as the simulator follows it."""

    rid: int
    table: str
    from_barrier: int
    mirrors: dict[str, str] = field(default_factory=dict)  # original -> mirror
    jobs: dict[str, JobState] = field(default_factory=dict)  # logical job -> revision job
    swapping: bool = False  # the original writers are superseded


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


def g2_bound(frontier: int, ends: Sequence[set[int]], interval: int) -> tuple[int, int] | None:
    """The bound of ``frontiers.aligned_target`` for a set of derived jobs: (M, P).

    ``frontier``: the least frontier of the tables asked for; ``ends``: per derived job
    among them and their derived upstream, barriers it is known to have had as its
    frontier (every batch it committed, and the service's advances, ends at one). The
    batches between consecutive known ends cover its real batches, so a span between
    them is at least as long as any batch inside it. P is the least power of two
    (slots) such that no span ending after ``frontier - P`` is longer than P; M the
    largest multiple of P slots at or below ``frontier``. None when M does not lie past
    every job's first batch, or is not above 0 (no claim).
    """
    if frontier <= 0:
        return None
    spans = []
    for known in ends:
        points = sorted(e for e in known if e > 0)
        if not points:
            return None
        spans.append(list(zip([0, *points], points, strict=False)))
    width = interval
    while any(hi - lo > width for job in spans for lo, hi in job if hi > frontier - width):
        width *= 2
        if width > frontier:
            return None
    m = frontier - frontier % width
    if any(m <= job[0][1] for job in spans):
        return None
    return m, width // interval


# --------------------------------------------------------------------------- simulation


class SkewedClock:
    """A replica's clock: the base clock moved by a fixed skew (moves with it)."""

    def __init__(self, base: Any, skew_ms: int) -> None:
        self.base, self.skew_ms = base, skew_ms

    def now_ms(self) -> int:
        return self.base.now_ms() + self.skew_ms  # type: ignore[no-any-return]


class Replicas:
    """A client of several replicas of the service (apps on one database): each request
    goes to one drawn from ``seed``'s sequence; ``last`` is the one that answered."""

    def __init__(self, clients: Sequence[Any], seed: int) -> None:
        import random

        self.clients = list(clients)
        self.last = 0
        self._random = random.Random(seed)

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        self.last = self._random.randrange(len(self.clients))
        return self.clients[self.last].request(method, url, **kwargs)


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
        db_state: Callable[[], Any] | None = None,
        reserve: Callable[[str], dict] | None = None,
        reconcile: Callable[[dict[str, list[dict]]], dict] | None = None,
        lake: Lake | None = None,
        advancer: Callable[[str, int], Any] | None = None,
        clocks: Sequence[Any] = (),
    ) -> None:
        """``advancer(part, replica)``: the service's per-slot advancer, run by the
        Watermark ("raise": answers the new S or None) and AdvanceIdle ("advance") steps
        on replica ``replica`` (None: readers raise S and advance idle jobs themselves).
        ``clocks``: each replica's clock, when ``client`` routes requests to several
        (:class:`Replicas`; their clocks may be skewed from ``clock``, the base).
        ``db_state``: every row of the service's database, to check that refused
        requests change nothing (else the API's view of jobs and mappings is compared).
        ``reserve``: reserve a table's expiry for an executor (None: the service has no
        reservations, G5 is checked on plans and leases only). ``reconcile``: run
        ``metaservice reconcile`` on the given stamps, per table in commit order (None:
        a Reconcile step does nothing). ``lake``: real Iceberg tables that every batch
        is committed to (None: snapshot ids are made up; revisions need real tables)."""
        self.client = client
        self.clock = clock
        self.topo = topology
        self.interval = interval_ms
        self.checks = frozenset(checks)
        self._log = log
        self._db_state = db_state
        self._reserve = reserve
        self._reconcile = reconcile
        self._lake = lake
        self._advancer = advancer
        self.clocks = list(clocks) or [clock]
        self.watermark = 0  # S as the advancer steps raised it
        # Whether the advancer ran (raise, then advance) after the last step that could
        # move anything: G2's bound assumes it (a read no longer advances idle jobs).
        self._fresh = advancer is None
        self._version_turn = 0
        self.revisions: dict[int, RevisionState] = {}  # planned or running, not swapped
        self.mirror_of: dict[str, str] = {}  # mirror table -> its original
        self.tables = {t: TableState(t) for t in topology.tables}
        self.jobs = {
            j.name: JobState(j.name, j.name, f"q-{j.name}", [j.output]) for j in topology.jobs
        }
        self.retired: list[JobState] = []  # deleted incarnations with reports still on the way
        self.source_rows: dict[str, list[tuple]] = {j.output: [] for j in topology.sources}
        self.history: list[dict] = []  # every report the service recorded, of live jobs
        self.leases: dict[str, LeaseRecord] = {}
        self.last_frontier: dict[str, int] = {}
        self.last_version: dict[tuple[str, ...], int] = {}
        self.complete: dict[str, int] = {}  # per table: the newest barrier readers took as final
        self.reserved: dict[str, set[int]] = {t: set() for t in topology.tables}
        # Every consistent version handed out, by (tables, at_or_before): asked again, it
        # must be answered unchanged ("every state change keeps every answer").
        self.memo: dict[tuple[tuple[str, ...], int], tuple[int, dict[str, int | None]]] = {}
        self._memo_turn = 0
        self.keep_last: dict[str, int] = {}  # retention set per table
        # per table: its frontier when a new writer took it (the history it starts above)
        self.held: dict[str, int] = {}
        self.expired: dict[str, set[int]] = {}  # per table: snapshots an expiry removed
        self.tags: dict[str, tuple[int | None, dict[str, int | None]]] = {}  # ends, snapshots
        self._snapshot_ids = itertools.count(1_000_001, 7)
        self._row_seq = itertools.count()
        self._incarnations = itertools.count(1)
        self.stats: Counter = Counter()

    # ------------------------------------------------------------------ plumbing

    def log(self, message: str) -> None:
        if self._log is not None:
            self._log(
                f"[{self.now() - self.now() % self.interval}+{self.now() % self.interval}] {message}"
            )

    def now(self) -> int:
        return self.clock.now_ms()  # type: ignore[no-any-return]

    def now_slot(self) -> int:
        return self.now() - self.now() % self.interval

    def _slot(self, clock: Any) -> int:
        now: int = clock.now_ms()
        return now - now % self.interval

    def slot_high(self) -> int:
        """The newest current slot of the replicas' clocks (the base's with one)."""
        return max(self._slot(c) for c in self.clocks)

    def slot_low(self) -> int:
        return min(self._slot(c) for c in self.clocks)

    def answering_now(self) -> int:
        """The clock of the replica that answered the last request."""
        return self.clocks[getattr(self.client, "last", 0)].now_ms()  # type: ignore[no-any-return]

    def answering_slot(self) -> int:
        """The current slot of the replica that answered the last request."""
        return self._slot(self.clocks[getattr(self.client, "last", 0)])

    def skew_low(self) -> int:
        """How far the slowest replica's clock is behind the base's (0 or less)."""
        return min(0, *(c.now_ms() - self.now() for c in self.clocks))

    def tick_advancer(self, replica: int | None = None) -> None:
        """The advancer's whole tick (raise, then advance), on ``replica`` or on the
        replica whose clock is ahead (the one whose tick comes first each slot)."""
        if self._advancer is None:
            return
        if replica is None:
            replica = max(range(len(self.clocks)), key=lambda i: self.clocks[i].now_ms())
        self._raise(replica)
        self._advancer("advance", replica)
        self._fresh = True

    def _raise(self, replica: int) -> None:
        assert self._advancer is not None
        raised = self._advancer("raise", replica)
        closed = self._slot(self.clocks[replica]) - self.interval
        if raised is not None:
            assert raised == closed > self.watermark, (raised, closed, self.watermark)
            self.watermark = raised
        else:
            assert closed <= self.watermark, (closed, self.watermark)
        self.log(f"watermark on replica {replica}: {self.watermark}")

    def call(self, method: str, path: str, expect: Iterable[int], **kwargs: Any) -> Any:
        if method != "GET":
            self._fresh = self._advancer is None  # it may move a frontier
        response = self.client.request(method, API + path, **kwargs)
        expected = set(expect)
        assert response.status_code in expected, (
            f"{method} {path} {kwargs} -> {response.status_code} {response.text} "
            f"(expected {sorted(expected)})"
        )
        return response

    def refused(
        self, method: str, path: str, status: int, codes: Iterable[str] | None, **kwargs: Any
    ) -> dict:
        """A request the service must refuse with one of ``codes`` (None: any code),
        changing nothing (G3)."""
        before = self.snapshot_state() if G3 in self.checks else None
        body = self.call(method, path, {status}, **kwargs).json()
        assert codes is None or body.get("code") in set(codes), f"{method} {path} {kwargs}: {body}"
        if before is not None:
            after = self.snapshot_state()
            assert after == before, f"G3: refused {method} {path} {kwargs} ({body}) changed {after}"
            self.stats["G3 refusals changed nothing"] += 1
        return body  # type: ignore[no-any-return]

    def snapshot_state(self) -> Any:
        if self._db_state is not None:
            return self._db_state()
        return self.state()

    def register(self) -> None:
        for job in self.topo.jobs:
            self.call("PUT", f"/jobs/{job.name}", {201}, json=self.spec(job))
            if self._lake is not None:
                self._lake.ensure(job.output)

    def spec(self, jd: JobDef, js: JobState | None = None) -> dict:
        outputs = js.outputs if js is not None else [jd.output]
        return {"inputs": list(jd.inputs), "outputs": list(outputs)}

    def live(self) -> list[tuple[JobDef, JobState]]:
        return [(jd, self.jobs[jd.name]) for jd in self.topo.jobs]

    def apply(self, step: Step) -> Any:
        match step:
            case Advance(ms):
                self.clock.advance(ms)
                self._fresh = self._advancer is None
                return None
            case Watermark(replica):
                if self._advancer is None:
                    return "no advancer"
                self._raise(replica % len(self.clocks))
                return self.watermark
            case AdvanceIdle(replica):
                if self._advancer is None:
                    return "no advancer"
                return self._advancer("advance", replica % len(self.clocks))
            case Tick(jobs):
                self.clock.advance(self.interval)
                self.tick_advancer()  # as the slot starts
                return [self.run(job.name) for job in self.topo.jobs if job.name in jobs]
            case Run():
                return self.run(
                    step.job, step.rows, step.fail, step.batched, step.mid, step.ahead_ms
                )
            case Peek(job, sources):
                return self.peek(job, sources)
            case Replay(job, pick):
                return self.replay(job, pick)
            case Duplicate(pick, batched):
                return self.duplicate(pick, batched)
            case Conflict(pick, kind, bundle):
                return self.conflict(pick, kind, bundle)
            case Version(tables, back_ms, lease_s, post):
                written = {t for _, js in self.live() for t in js.outputs}
                if not set(tables) <= written:
                    return "no such table"  # an added output no job has (yet)
                for t in tables:
                    self._add_table(t)
                at = None if back_ms is None else max(0, self.now() - back_ms)
                return self.version(tables, at_or_before=at, lease_seconds=lease_s, post=post)
            case CatalogSession(back_ms):
                at = None if back_ms is None else max(0, self.now() - back_ms)
                return self.catalog_session(at)
            case Release(pick):
                return self.release(pick)
            case Expiry(table, reserve):
                names = self.topo.tables if table is None else [table]
                return [self.expiry(t, reserve) for t in names]
            case Flush(job):
                if job is None:
                    return self.flush_all()
                return self.flush(self.jobs[job])
            case ReportIn(job):
                return self.report_in(job)
            case ReleaseGrant(job):
                return self.release_grant(job)
            case Frontiers():
                return self.frontiers()
            case Reregister(job, change):
                return self.reregister(job, change)
            case Replace(job, drain):
                return self.replace(job, drain)
            case Abandon(job, written):
                return self.abandon(job, written)
            case ResetQuery(job):
                return self.reset_query(job)
            case LateOutput(job, done):
                return self.late_output(job, done)
            case MoveOutput(job):
                return self.move_output(job)
            case ChangeInputs(job, change):
                return self.change_inputs(job, change)
            case Rejoin(job, rename):
                return self.rejoin(job, rename)
            case Reconcile():
                return self.reconcile()
            case Retention(table, keep_last):
                return self.retention(table, keep_last)
            case Revise(table, back):
                return self.revise(table, back)
            case RunRevision(pick, fail):
                return self.run_revision(pick, fail)
            case Swap():
                return self.swap()
            case CancelRevision():
                return self.cancel_revision()
            case ExpireNow(table):
                return self.expire_now(table)
            case Tag(tables, back_ms, retain_s):
                at = None if back_ms is None else max(0, self.now() - back_ms)
                return self.tag(tables, at, retain_s)
            case DropTag(pick):
                return self.drop_tag(pick)
        raise AssertionError(f"unknown step {step!r}")

    def step(self, step: Step) -> Any:
        """Apply the step, then ask again for answers already given: all of them after a
        state change, a few in turn after any other step."""
        result = self.apply(step)
        self.check_memo(every=isinstance(step, STATE_CHANGES), after=repr(step))
        return result

    def steady_step(self, skip: Iterable[str] = ()) -> None:
        """One slot of a healthy topology: the clock moves one interval and every job
        (but those in ``skip``) runs once, upstream before downstream."""
        skipped = set(skip)
        self.clock.advance(self.interval)
        self.tick_advancer()  # as the slot starts
        for job in self.topo.jobs:
            if job.name not in skipped:
                self.run(job.name)

    def settle(self) -> None:
        """Every job finishes what it started: a dead driver's batch is replayed, claims
        and reports are delivered, a trigger in progress completes."""
        for jd, js in self.live():
            if js.pending is not None or js.planned is not None or js.asked:
                self.run(jd.name)
        self.flush_all()

    # ------------------------------------------------------------------ source jobs

    def run(
        self,
        job: str,
        rows: int = 1,
        fail: str = "none",
        batched: bool = False,
        mid: str = "none",
        ahead_ms: int = 0,
    ) -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        if self.superseded(job) and js.pending is None and js.planned is None:
            self.flush(js)
            return "superseded by a revision"
        if jd.is_source:
            if ahead_ms and js.floor is None and not js.claims:
                self.report_in(job)  # a job giving itself barriers holds a grant
            return self._run_source(jd, js, rows, fail, batched, ahead_ms)
        return self._run_derived(jd, js, fail, batched, mid)

    def _run_source(
        self, jd: JobDef, js: JobState, rows: int, fail: str, batched: bool, ahead_ms: int
    ) -> str:
        p = js.pending
        if p is not None and p.abandoned:
            if js.floor is not None and fail == "offline" and not js.claims:
                return self._reclaim_abandoned(jd, js, p)
            return self._replay_abandoned(jd, js, p, fail, batched)
        if js.floor is not None and (fail == "offline" or js.claims):
            return self._run_offline(jd, js, rows, fail, ahead_ms)
        if fail == "offline":
            fail = "report_later"  # no grant: the job waits for the service, then reports later
        batch_id = p.batch_id if p is not None else js.next_batch
        # "it gets the current clock slot": never moved by another job's clock; only its
        # own batches' barriers (an offline claim ahead of the clock) go before it.
        answer = self._ask(js, batch_id, {"query_id": js.query})
        b = answer["barrier"]
        # With replicas: the slot of the replica that answered, and never at or below
        # the watermark S (raised by a replica whose clock may be ahead).
        slot = self.answering_slot() if len(self.clocks) > 1 else self.now_slot()
        expected = max(
            slot, js.newest[1] if js.newest is not None else 0, self.watermark + self.interval
        )
        held = self.held.get(jd.output)
        if held is not None and held >= expected:
            expected = held + self.interval  # a new writer starts above the table's history
        if p is not None:
            # G3: a replayed batch gets the same barrier.
            assert b == p.barrier, f"{js.name} batch {batch_id} replayed at {b}, given {p.barrier}"
            self.stats["replayed open batch"] += 1
        else:
            assert answer["start_barrier"] is None and answer["inputs"] == [], answer
            # (another replica's clock, ahead, may have raised the clock or sealed the
            # job up to its own slot: the barrier is then up to that replica's slot)
            highest = expected if len(self.clocks) == 1 else max(expected, self.slot_high())
            assert expected <= b <= highest, (
                f"G2: source job {js.name}'s batch {batch_id} got barrier {b}; the current "
                f"slot is {slot} (replicas up to {self.slot_high()}), the watermark "
                f"{self.watermark} and its own newest batch {js.newest}"
            )
            p = js.pending = Pending(
                batch_id, b, answer, self._ingest(jd, rows, b), tuple(js.outputs)
            )
            js.ran = True
            js.newest = (batch_id, b)
        self.log(f"run {js.name} batch {batch_id} -> barrier {b}" + _fail(fail))
        return self._finish(jd, js, p, fail, batched)

    def _ask(self, js: JobState, batch_id: int, body: dict) -> dict:
        answer = self.call(
            "POST", f"/jobs/{js.name}/batches/{batch_id}/barrier", {200}, json=body
        ).json()
        return self._check_answer(js, batch_id, answer)

    def _check_answer(self, js: JobState, batch_id: int, answer: dict) -> dict:
        b = answer["barrier"]
        assert answer["job"] == js.name and answer["batch_id"] == batch_id, answer
        reconciled = js.pending is not None and js.pending.reconciled
        assert reconciled or not answer["committed"], (
            f"{js.name} batch {batch_id} is not reported: {answer}"
        )
        assert b % self.interval == 0 and b > 0, f"barrier {b} off grid"
        return answer  # type: ignore[no-any-return]

    def _ingest(self, jd: JobDef, rows: int, barrier: int) -> Counter:
        delta = Counter({(jd.output, next(self._row_seq), barrier): 1 for _ in range(rows)})
        self.source_rows[jd.output].extend(delta)
        return delta

    def _forget_rows(self, jd: JobDef, delta: Counter) -> None:
        for row in delta:
            self.source_rows[jd.output].remove(row)

    def _finish(self, jd: JobDef, js: JobState, p: Pending, fail: str, batched: bool) -> str:
        """The sink: write the batch unless it is in the table already, then report."""
        if fail == "before_commit":
            return "crashed before commit"
        if not p.written:
            table = self.tables[js.outputs[0]]
            assert table.find(js.name, p.batch_id) is None  # never a second snapshot for a batch
            if p.delta:
                snapshot_id = (
                    next(self._snapshot_ids)
                    if self._lake is None
                    else self._lake.commit(table.name, js.name, p.batch_id, p.barrier, p.delta)
                )
                p.snapshot = table.append(
                    Snapshot(snapshot_id, p.barrier, js.name, p.batch_id, p.delta)
                )
            p.written = True
        else:
            found = self.tables[js.outputs[0]].find(js.name, p.batch_id)
            assert found is p.snapshot, (found, p.snapshot)
        if fail == "after_commit":
            return "crashed before report"
        js.outbox.append(p)
        js.pending = None
        js.next_batch = p.batch_id + 1
        if not jd.is_source:
            js.offset, js.planned = p.barrier, None  # Spark's commit log
        if fail == "report_later":
            self.log(f"{js.name} batch {p.batch_id}: report waits in the outbox")
            return "report queued"
        self.flush(js, batched)
        return "committed"

    def _run_offline(self, jd: JobDef, js: JobState, rows: int, fail: str, ahead_ms: int) -> str:
        """A source batch while the service is unreachable: a barrier of the job's own,
        claimed in the outbox before the commit; the report waits in the outbox too."""
        assert js.floor is not None
        p = js.pending
        if p is not None and (p.written or p.claimed):
            batch_id = p.batch_id  # replayed: its claimed or stamped barrier stands
        else:
            batch_id = p.batch_id if p is not None else js.next_batch
            if p is not None:  # asked online, crashed before committing: re-tag its rows
                self._forget_rows(jd, p.delta)
            used = [d.barrier for d in js.done] + [q.barrier for q in js.outbox]
            # (ahead of the slowest replica's clock by less than the service allows)
            own_clock = self.now() + min(ahead_ms, MAX_AHEAD_MS - self.interval) + self.skew_low()
            b = max(js.floor, own_clock - own_clock % self.interval, *used)
            js.floor = b
            delta = self._ingest(jd, rows, b)
            p = js.pending = Pending(batch_id, b, {"offline": True}, delta, tuple(js.outputs))
            p.claimed, p.known = True, False
            js.claims.append(p)
        self.log(f"run {js.name} batch {batch_id} offline -> barrier {p.barrier}" + _fail(fail))
        # Offline, the report waits in the outbox with the claim.
        return self._finish(jd, js, p, "report_later" if fail == "offline" else fail, False)

    def report_in(self, job: str) -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        if not jd.is_source:
            return "not a source job"
        if js.claims:
            return "claims undelivered"
        promise = max(js.floor or 0, self.now_slot())
        grant = self.call("PUT", f"/jobs/{js.name}/offline-grant", {200}, json={"floor": promise})
        body = grant.json()
        assert body["floor"] <= max(promise, body["barrier"]), body
        js.floor = max(promise, body["barrier"])
        self.log(f"report in {js.name}: floor {body['floor']}")
        return "reported in"

    def release_grant(self, job: str) -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        if not jd.is_source or js.floor is None:
            return "no grant"
        self.flush(js)  # the release goes through the outbox, after the claims
        self.call("DELETE", f"/jobs/{js.name}/offline-grant", {204})
        js.floor = None
        return "released"

    # ------------------------------------------------------------------ derived jobs

    def peek(self, job: str, sources: int = 1) -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        if jd.is_source:
            self.call("GET", f"/jobs/{js.name}/next-barrier", {400, 422})
            return "source job"
        if js.planned is not None:
            return "batch planned"
        end = self._trigger(jd, js, "none", sources)
        return "asking" if end is None else f"planned up to {end}"

    def _run_derived(self, jd: JobDef, js: JobState, fail: str, batched: bool, mid: str) -> str:
        if js.planned is None:
            end = self._trigger(jd, js, mid, None)
            assert end is not None
            if end == js.offset:
                self.log(f"run {js.name}: nothing new after {js.offset}")
                return "idle"
            js.planned = (js.next_batch, js.offset, end)
            if fail == "before_plan":
                js.planned = None
                self.log(f"run {js.name}: crashed before writing its offset log (end {end})")
                return "crashed before planning"
        batch_id, a, b = js.planned
        read = self._read_ranges(jd, js, a, b, mid)
        if read is None:
            return "waiting for its inputs"
        delta, ranges = read
        body = {"start": a, "end": b, "query_id": js.query}
        if js.pending is None:
            r = self.call(
                "POST", f"/jobs/{js.name}/batches/{batch_id}/barrier", {200, 409}, json=body
            )
            if r.status_code == 409:
                return self._skip(js, batch_id, a, b, delta, ranges, r.json())
            answer = self._check_answer(js, batch_id, r.json())
        else:
            answer = self._ask(js, batch_id, body)
        assert (answer["start_barrier"], answer["barrier"]) == (a, b), (
            f"G1: Spark planned batch {batch_id} of {js.name} as ({a}, {b}], the service "
            f"recorded {answer}"
        )
        assert _ranges(answer) == ranges, (
            f"G1: {js.name} batch {batch_id} read {ranges}, its barrier answer says {answer}"
        )
        p = js.pending
        if p is not None:
            # G3: the replay reads the same rows and gets the same answer.
            assert p.batch_id == batch_id and _ranges(p.answer) == ranges, (p.answer, answer)
            assert p.delta == delta, f"{js.name} batch {batch_id}: the replay read other rows"
            self.stats["replayed open batch"] += 1
        else:
            p = js.pending = Pending(batch_id, b, answer, delta, tuple(js.outputs), a, ranges)
            js.ran = True
            js.newest = (batch_id, b)
        self.log(f"run {js.name} batch {batch_id} ({a}, {b}] inputs {ranges}" + _fail(fail))
        return self._finish(jd, js, p, fail, batched)

    def _skip(
        self, js: JobState, batch_id: int, a: int, b: int, delta: Counter, ranges: list, body: dict
    ) -> str:
        """The sink skips a planned batch the service refuses as empty: the service
        advanced the idle job past its end, so it must read nothing (G1)."""
        assert body.get("code") == "empty_range", f"{js.name} batch {batch_id} ({a}, {b}]: {body}"
        assert not delta, (
            f"G1: {js.name} batch {batch_id} ({a}, {b}] is refused as empty ({body}), but its "
            f"inputs' ranges {ranges} hold rows {sorted(delta.elements())}"
        )
        front = self._frontiers_of_jobs()[js.name]
        assert front >= b, f"{js.name} batch ({a}, {b}] refused as empty at frontier {front}"
        js.ends.add(front)
        js.offset, js.planned, js.next_batch = b, None, batch_id + 1  # Spark's commit log
        self.stats["planned batch skipped: the job was advanced past it"] += 1
        self.log(f"run {js.name} batch {batch_id} ({a}, {b}]: skipped, {body['message']}")
        return "skipped"

    def _trigger(self, jd: JobDef, js: JobState, mid: str, budget: int | None) -> int | None:
        """Spark's latestOffset of each barrier source not asked yet in this trigger (at
        most ``budget`` of them); the batch's end once every source has answered."""
        remaining = [s for s in jd.inputs if s not in js.asked]
        for i, source in enumerate(remaining[:budget]):
            if i == 1 and mid == "flush":
                self.flush_all()
            nb = self.call(
                "GET",
                f"/jobs/{js.name}/next-barrier",
                {200},
                # Every other source as a long poll (1 ms): its look without locks
                # first, then the round, must give the same answers (issue 13).
                params={"after": js.offset, "source": js.source(source), "wait_ms": i % 2},
            ).json()
            assert nb["start_barrier"] == js.offset, (nb, js.offset)
            assert nb["ready"] == (nb["barrier"] > js.offset), nb
            assert nb["barrier"] >= js.offset and nb["barrier"] % self.interval == 0, nb
            held = max((self.held.get(js.source(t), 0) for t in jd.inputs), default=0)
            assert nb["barrier"] < self.slot_high() or not nb["ready"] or nb["barrier"] <= held, (
                f"G2: {js.name}'s batch after {js.offset} ends at {nb['barrier']}, a slot "
                f"that is not over (the clock is at {self.now()}): another job's clock moved "
                "its barriers"
            )
            js.asked[source] = nb["barrier"]
            self.log(f"offsets {js.name} source {source} after {js.offset}: {nb['barrier']}")
        if len(js.asked) < len(jd.inputs):
            return None
        ends = set(js.asked.values())
        answers, js.asked = js.asked, {}
        if ends == {js.offset}:
            return js.offset
        assert len(ends) == 1, (
            f"G1: the barrier sources of one trigger of {js.name} planned different ends "
            f"after {js.offset}: {answers}"
        )
        self.stats["derived batches planned"] += 1
        return ends.pop()

    def _read_ranges(
        self, jd: JobDef, js: JobState, a: int, b: int, mid: str
    ) -> tuple[Counter, list[tuple]] | None:
        """Planning the batch: each barrier source reads its input's range by the
        service's mapping; f of the rows read."""
        delta: Counter = Counter()
        ranges = []
        for i, source in enumerate(jd.inputs):
            if i == 1 and mid == "flush":
                self.flush_all()
            r = self.call(
                "GET", f"/jobs/{js.name}/ranges", {200, 409}, params={"after": a, "to": b}
            )
            if r.status_code == 409:
                assert r.json()["code"] == "not_final", r.text
                self.stats["ranges not final"] += 1
                self.log(f"ranges {js.name} ({a}, {b}]: {r.json()}")
                return None
            name = js.source(source)
            mine = [x for x in r.json() if x["table"] == name]
            assert len(mine) == 1, (name, r.json())
            rg, table = mine[0], self.tables[name]
            assert (rg["from_barrier"], rg["to_barrier"]) == (a, b), rg
            # The barrier-to-snapshot mapping, recomputed from the simulator's own records.
            expected = (table.snapshot_at(a), table.snapshot_at(b))
            assert (rg["from_snapshot"], rg["to_snapshot"]) == expected, (
                f"G1: {js.name} reads {source} in ({a}, {b}] as {rg}, but its snapshots "
                f"there are {expected}"
            )
            for row, n in table.read(rg["from_snapshot"], rg["to_snapshot"]).items():
                delta[(jd.name, source, row)] += n
            ranges.append((name, a, b, rg["from_snapshot"], rg["to_snapshot"]))
        return delta, sorted(ranges)

    # ------------------------------------------------------------------ reports

    def _reports_of(self, js: JobState, p: Pending | Done) -> list[dict]:
        """One report per output the batch was opened with (an added output gets an
        empty commit)."""
        main = p.snapshot.snapshot_id if isinstance(p, Pending) and p.snapshot else None
        if isinstance(p, Done):
            main = p.snapshot_id
        return [
            _report(js.name, p.batch_id, p.barrier, t, main if t == p.outputs[0] else None)
            for t in p.outputs
        ]

    def flush_all(self) -> None:
        for _, js in self.live():
            self.flush(js)
        for js in self.retired:
            self._flush_zombie(js)
        self.retired = []

    def flush(self, js: JobState, batched: bool = False) -> None:
        """Deliver the job's outbox, oldest first: its offline claims, then its reports."""
        while js.claims:
            p = js.claims[0]
            path = f"/jobs/{js.name}/batches/{p.batch_id}/barrier"
            claim = {"barrier": p.barrier, "query_id": js.query}
            if p.reclaim and self._reclaim_refused(js, p, self.edit("POST", path, 200, json=claim)):
                continue
            answer = self.call("POST", path, {200}, json=claim).json()
            assert answer["barrier"] == p.barrier, (answer, p.barrier)
            self.stats["offline claim delivered"] += 1
            if p.barrier > self.now_slot():
                self.stats["claim ahead of the clock delivered"] += 1
            js.claims.pop(0)
            p.known, js.ran = True, True
            if js.newest is None or p.batch_id >= js.newest[0]:
                js.newest = (p.batch_id, p.barrier)
            self.log(f"claim {js.name} batch {p.batch_id} at {p.barrier}")
        while js.outbox and js.outbox[0].known:
            self._report(js, js.outbox.pop(0), batched)

    def _report(self, js: JobState, p: Pending, batched: bool) -> None:
        jd = self.topo.job(js.logical)
        reports = self._reports_of(js, p)
        for i, report in enumerate(reports):
            last = i == len(reports) - 1
            if batched:
                body = self.call(
                    "POST", "/commits/batch", {200}, json={"commits": [report, report]}
                ).json()
                statuses = [r["status"] for r in body["results"]]
                if p.reconciled:
                    statuses[0] = "recorded"  # recorded by `reconcile` already
                assert statuses == ["recorded", "duplicate"], body
                if not p.reconciled:
                    assert (body["recorded"], body["duplicates"]) == (1, 1), body
                    assert all(r["batch_committed"] == last for r in body["results"]), body
            else:
                r = self.call("POST", "/commits", {200, 409}, json=report)
                assert r.status_code == 200, (
                    f"G4: the offline replay of abandoned batch {p.batch_id} of {js.name} was "
                    f"accepted as a claim at {p.barrier}, then its commit refused: {r.text}"
                    if p.reclaim
                    else f"POST /commits {report} -> {r.status_code} {r.text}"
                )
                body = r.json()
                if p.reconciled:
                    assert body["status"] in {"recorded", "duplicate"}, body
                else:
                    assert body["status"] == "recorded" and body["batch_committed"] == last, body
        if p.snapshot is not None:
            p.snapshot.reported = True
        snapshot_id = p.snapshot.snapshot_id if p.snapshot is not None else None
        js.done.append(Done(p.batch_id, p.barrier, p.start, p.answer, snapshot_id, p.outputs))
        self.history.extend(reports)
        self.log(f"report {reports}")
        if not jd.is_source:
            js.ends.add(p.barrier)
            if G1 in self.checks:
                # A derived table is exact at every barrier it commits.
                out = js.outputs[0]
                at = self.tables[out].snapshot_at(p.barrier)
                what = f"{js.name} committed batch {p.batch_id} at {p.barrier}"
                self.check_exact({out: at}, p.barrier, what)
                self.stats["G1 derived commits checked"] += 1

    def _flush_zombie(self, js: JobState) -> None:
        """Reports of a deleted job's driver arrive: refused, nothing changes."""
        for p in js.outbox:
            for report in self._reports_of(js, p):
                self.refused("POST", "/commits", 404, {"not_found", "unknown_job"}, json=report)
                self.stats["late report of a deleted job refused"] += 1

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
        body: dict[str, Any] = {"query_id": js.query}
        if d.start is not None:
            body.update(start=d.start, end=d.barrier)
        path = f"/jobs/{js.name}/batches/{d.batch_id}/barrier"
        answer = self.call("POST", path, {200}, json=body).json()
        assert answer["barrier"] == d.barrier, f"{js.name} batch {d.batch_id}: {answer} was {d}"
        assert answer["committed"], f"{js.name} batch {d.batch_id} was reported: {answer}"
        assert answer["start_barrier"] == d.answer.get("start_barrier"), (answer, d.answer)
        if "inputs" in d.answer:
            assert _ranges(answer) == _ranges(d.answer), (answer, d.answer)
        # The sink finds the batch in the table's snapshot summaries, writes nothing,
        # reports again.
        found = self.tables[jd.output].find(js.name, d.batch_id)
        assert (found.snapshot_id if found else None) == d.snapshot_id
        for report in self._reports_of(js, d):
            body = self.call("POST", "/commits", {200}, json=report).json()
            assert body["status"] == "duplicate" and body["batch_committed"], body
        if before is not None:
            assert self.state([jd.output], job_fields=False) == before, "replay changed the mapping"
        self.stats["replayed finished batch"] += 1
        self.log(f"replay {js.name} batch {d.batch_id} at {d.barrier}: same, duplicate report")
        return "replayed"

    def duplicate(self, pick: int = 0, batched: bool = False) -> str:
        if not self.history:
            return "no report yet"
        report = self.history[pick % len(self.history)]
        other = self.history[(pick * 7 + 3) % len(self.history)]
        touched = sorted({report["table"], other["table"]} if batched else {report["table"]})
        touched = [t for t in touched if t in self.tables]
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

    def _written_batch(self) -> tuple[JobState, Pending] | None:
        """A batch committed to its table but not reported: an existing one, or the
        next batch of the first job that has one to run, crashed before its report."""
        for _, js in self.live():
            p = js.pending
            if p is not None and p.written and p.known and not p.abandoned:
                return js, p
        for jd, js in self.live():
            if js.pending is not None or js.claims:
                continue
            if self.run(jd.name, fail="after_commit") == "crashed before report":
                return js, js.pending  # type: ignore[return-value]
        return None

    def conflict(self, pick: int = 0, kind: str = "other_snapshot", bundle: bool = False) -> str:
        if kind in ("plan_mismatch", "empty_range"):
            return self._refused_plan(pick, kind)
        if not self.history:
            return "no report yet"
        report = self.history[pick % len(self.history)]
        bad: dict | None = None
        if kind == "stolen_snapshot":
            # An open batch claims a snapshot the table already has for another batch.
            for jd, js in self.live():
                p = js.pending
                taken = self.tables[jd.output].reported()
                if p is not None and p.known and not p.abandoned and taken:
                    stolen = taken[pick % len(taken)].snapshot_id
                    bad = _report(js.name, p.batch_id, p.barrier, jd.output, stolen)
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
                js, p = written
                body.append(self._reports_of(js, p)[0])
            body.append(bad)
        codes = {"conflicting_report", "barrier_mismatch"}
        if len(body) == 1:
            self.refused("POST", "/commits", 409, codes, json=bad)
        else:
            self.refused("POST", "/commits/batch", 409, codes, json={"commits": body})
        self.stats["conflict refused"] += 1
        self.log(f"conflict {kind} {body}: refused")
        return "refused"

    def _refused_plan(self, pick: int, kind: str) -> str:
        """A derived batch Spark planned otherwise than the service handed it out."""
        for jd, js in self.live():
            if jd.is_source:
                continue
            path = f"/jobs/{js.name}/batches"
            if kind == "plan_mismatch" and js.done:
                d = js.done[pick % len(js.done)]
                body = {"start": d.start, "end": d.barrier + self.interval, "query_id": js.query}
                self.refused(
                    "POST", f"{path}/{d.batch_id}/barrier", 409, {"batch_plan_mismatch"}, json=body
                )
                self.stats["plan mismatch refused"] += 1
                return "refused"
            if kind == "empty_range" and js.planned is None and js.pending is None:
                body = {"start": js.offset, "end": js.offset, "query_id": js.query}
                self.refused(
                    "POST", f"{path}/{js.next_batch}/barrier", 409, {"empty_range"}, json=body
                )
                self.stats["empty range refused"] += 1
                return "refused"
        return "no derived batch"

    def reset_query(self, job: str) -> str:
        """A Spark query re-created under the job's name (a new checkpoint) starts at
        batch 0 from the job's frontier; its batch must be refused."""
        jd, js = self.topo.job(job), self.jobs[job]
        if not js.ran or js.asked:
            return "no batch yet"
        new = f"{js.query}-reset"
        path = f"/jobs/{js.name}/batches/0/barrier"
        if jd.is_source:
            self.refused("POST", path, 409, {"query_reset"}, json={"query_id": new})
            self.stats["reset query refused"] += 1
            return "refused"
        start = self.call("GET", f"/jobs/{js.name}", {200}).json()["frontier"]
        ends = set()
        for source in jd.inputs:
            r = self.call(
                "GET",
                f"/jobs/{js.name}/next-barrier",
                {200, 409},
                params={"after": start, "source": source},
            )
            if r.status_code == 409:
                # Its newest batch is not reported yet: the frontier is no batch's end.
                assert r.json()["code"] == "unknown_start", r.text
                return "unknown start"
            ends.add(r.json()["barrier"])
        assert len(ends) == 1, f"G1: the reset query's sources of {js.name} disagree: {ends}"
        end = ends.pop()
        if end == start:
            return "nothing to run"
        body = {"start": start, "end": end, "query_id": new}
        self.refused("POST", path, 409, {"query_reset"}, json=body)
        self.stats["reset query refused"] += 1
        return "refused"

    # ------------------------------------------------------------------ job changes

    def reregister(self, job: str, change: str = "same") -> str:
        jd, js = self.topo.job(job), self.jobs[job]
        path = f"/jobs/{js.name}"
        spec = self.spec(jd, js)
        extra = f"{jd.output}_x"
        if change == "same":
            before = self._frontiers_of_jobs()
            view = self.call("PUT", path, {200}, json=spec).json()
            assert (set(view["inputs"]), set(view["outputs"])) == (
                set(spec["inputs"]),
                set(spec["outputs"]),
            ), view
            assert self._frontiers_of_jobs() == before, "re-registering the same spec moved jobs"
            return "same"
        if change == "add_output":
            if extra in js.outputs:
                return "has it"
            if js.claims:
                return "claims undelivered"
            bigger = {**spec, "outputs": [*js.outputs, extra]}
            if self.edit("PUT", path, 200, json=bigger).status_code == 409:
                return "refused"  # (a table with history a job that has run may not take)
            js.outputs.append(extra)
            return "output added"
        if change == "drop_output":
            if extra not in js.outputs:
                return "nothing to drop"
            smaller = {**spec, "outputs": [o for o in js.outputs if o != extra]}
            if js.open_in_service():
                self.refused("PUT", path, 409, {"batch_open"}, json=smaller)
                self.stats["output removal refused"] += 1
                return "refused"
            self.call("PUT", path, {200}, json=smaller)
            js.outputs.remove(extra)
            self.stats["output dropped"] += 1
            return "output dropped"
        changed = self._identity_change(jd, change)
        if changed is None:
            return "no such change"
        new = {**spec, "inputs": changed}
        if js.ran:
            body = self.refused("PUT", path, 409, {"job_identity_changed"}, json=new)
            assert "new job" in body["message"], body
            self.stats["identity change refused"] += 1
            return "refused"
        # A job that never ran may still change; put it back at once.
        r = self.call("PUT", path, {200, 409}, json=new)
        if r.status_code == 409:
            # A derived job the service advanced has batches of the service's own.
            assert not jd.is_source and r.json()["code"] == "job_identity_changed", r.text
            return "refused"
        self.call("PUT", path, {200}, json=spec)
        self.stats["identity changed before the first batch"] += 1
        return "changed and put back"

    def _identity_change(self, jd: JobDef, change: str) -> list[str] | None:
        position = self.topo.jobs.index(jd)
        earlier = [j.output for j in self.topo.jobs[:position] if j.output not in jd.inputs]
        if jd.is_source:
            others = [j.output for j in self.topo.sources if j is not jd]
            return [others[0] if others else "ext.feed"] if change != "drop_input" else None
        if change == "kind":
            return []
        if change == "add_input":
            return [*jd.inputs, earlier[0]] if earlier else None
        if change == "drop_input":
            return list(jd.inputs[:-1]) if len(jd.inputs) > 1 else None
        raise ValueError(change)

    def _frontiers_of_jobs(self) -> dict[str, int]:
        items = self.call("GET", "/jobs", {200}, params={"limit": 1000}).json()["items"]
        return {j["name"]: j["frontier"] for j in items}

    def replace(self, job: str, drain: bool = True) -> str:
        """Replace the writer of the job's table by a new job (see :class:`Replace`)."""
        jd, js = self.topo.job(job), self.jobs[job]
        readers = self.topo.readers(jd.output)
        path = f"/jobs/{js.name}"
        if readers:
            self.refused("DELETE", path, 409, {"has_readers"})
            self.stats["replacement refused: has readers"] += 1
            return "refused"
        if drain:
            self.flush(js)
        elif js.pending is None and not js.claims:
            # The driver's last batch is in Iceberg, its report still on the way.
            self.run(jd.name, fail="report_later")
        unknown = [p for p in js.outbox if not p.known]  # undelivered claims die with it
        js.outbox = [p for p in js.outbox if p.known]
        if js.outbox:
            self.retired.append(js)
        self.call("DELETE", path, {204})
        # The table stays in the service, writerless, with its history.
        r = self.call("GET", "/versions/consistent", {409}, params={"tables": jd.output}).json()
        assert r["code"] == "no_writer", r
        self.call("GET", f"/tables/{jd.output}/expirable", {200})
        self._forget_driver(jd, js, unknown)
        name = f"{jd.name}.r{next(self._incarnations)}"
        view = self._take_over(name, {201}, json=self.spec(jd)).json()
        self._took_over(jd.output)
        new = self.jobs[jd.name] = JobState(jd.name, name, f"q-{name}", [jd.output])
        if not jd.is_source and view["frontier"]:
            # Its query starts where the table's history ends (its first batch after it).
            new.offset, new.ends = view["frontier"], {view["frontier"]}
        self.history = [r for r in self.history if r["job"] != js.name]
        self.stats["writer replaced"] += 1
        self.log(f"replaced {js.name} by {name} as the writer of {jd.output}")
        return "replaced"

    def _take_over(self, name: str, expect: set[int], **kwargs: Any) -> Any:
        """Register the job taking a table with history. The history may reach a slot
        still to come: 409 ``history_ahead``, whose message says to retry once the slot
        has passed, which is what happens here. With replicas, one whose clock is behind
        sees that; on one replica, a table whose writer was replaced in the slot its
        history reached (the new writer's batches are one slot ahead of the clock), and
        which is taken on again before the clock gets there."""
        for _ in range(8):
            response = self.call("PUT", f"/jobs/{name}", expect | {409}, **kwargs)
            if response.status_code != 409:
                return response
            assert response.json()["code"] == "history_ahead", response.text
            self.stats["takeover retried: history ahead of the clock"] += 1
            self.clock.advance(self.interval)
            self._fresh = self._advancer is None
        raise AssertionError(f"PUT /jobs/{name} still 409 history_ahead after 8 slots")

    def _took_over(self, table: str, writer: JobState | None = None) -> int:
        """A new writer took the table: it starts above its history, which may reach
        into the current slot (the old writer's batches there). So do the writer's
        other outputs (``writer``: a job that had some), which share its frontier.
        Returns the table's frontier."""
        front: int = self.call("GET", f"/tables/{table}", {200}).json()["frontier"] or 0
        for t in {table, *(writer.outputs if writer else ())}:
            self.held[t] = max(self.held.get(t, 0), front)
        return front

    def _forget_driver(self, jd: JobDef, js: JobState, unknown: list[Pending]) -> None:
        """The deleted job's batches that no report recorded: an operator rolls their
        commits back (the table keeps its history), and their rows were never ingested."""
        batches = {id(p): p for p in [*js.outbox, *unknown, *js.claims, js.pending] if p}
        table = self.tables[jd.output]
        for p in sorted(
            batches.values(),
            key=lambda p: table.position_any(p.snapshot) if p.snapshot else -1,
            reverse=True,
        ):
            if p.snapshot is not None and not p.snapshot.reported:
                table.roll_back(p.snapshot)
                p.snapshot = None
            if jd.is_source and not p.abandoned:
                self._forget_rows(jd, p.delta)

    def abandon(self, job: str, written: bool = False) -> str:
        """A source driver dies with an open batch, which an operator abandons."""
        jd, js = self.topo.job(job), self.jobs[job]
        if not jd.is_source:
            if js.done:
                path = f"/jobs/{js.name}/batches/{js.done[-1].batch_id}/abandon"
                self.refused("POST", path, 409, {"not_source"})
            return "not a source job"
        if js.pending is None and not js.claims:
            self.run(job, fail="after_commit" if written else "before_commit")
        p = js.pending
        if p is None or not p.known or p.abandoned:
            if js.done and (p is None or p.batch_id != js.done[-1].batch_id):
                path = f"/jobs/{js.name}/batches/{js.done[-1].batch_id}/abandon"
                self.refused("POST", path, 409, {"batch_committed"})
            return "no open batch"
        path = f"/jobs/{js.name}/batches/{p.batch_id}/abandon"
        for _ in range(2):  # idempotent
            view = self.call("POST", path, {200}).json()
            assert (view["batch_id"], view["barrier"]) == (p.batch_id, p.barrier), view
        p.abandoned = True
        self._forget_rows(jd, p.delta)  # not ingested: the replay ingests them anew
        self.stats["batch abandoned"] += 1
        self.log(f"abandoned {js.name} batch {p.batch_id} at {p.barrier} (written={p.written})")
        return "abandoned"

    def _zombie_reports(self, jd: JobDef, js: JobState, p: Pending) -> None:
        """The dead driver's commit of an abandoned batch reports late: refused (the
        operator then rolls the orphan snapshot back)."""
        if not p.written:
            return
        for report in self._reports_of(js, p):
            # (an output dropped since the batch opened is no longer the job's)
            codes = {"batch_abandoned"} if report["table"] in js.outputs else {"not_writer"}
            self.refused("POST", "/commits", 409, codes, json=report)
        if p.snapshot is not None:
            self.tables[jd.output].roll_back(p.snapshot)
        p.written, p.snapshot = False, None
        self.stats["late report of an abandoned batch refused"] += 1

    def _reclaim_abandoned(self, jd: JobDef, js: JobState, p: Pending) -> str:
        """The restarted driver of an abandoned batch cannot reach the service: holding
        a grant, it gives the batch a barrier of its own, commits it, and claims it when
        the service is back. The claim is either refused (the driver then replays the
        batch online) or accepted, and then so is its commit."""
        assert js.floor is not None
        self._zombie_reports(jd, js, p)
        b = max(js.floor, self.now_slot(), p.barrier)
        js.floor = b
        q = Pending(
            p.batch_id,
            b,
            {"offline": True},
            self._ingest(jd, max(1, len(p.delta)), b),
            _still_written(p, js),
        )
        q.claimed, q.known, q.reclaim = True, False, True
        js.pending = q
        js.claims.append(q)
        self.log(f"offline replay of abandoned {js.name} batch {p.batch_id} -> barrier {b}")
        result = self._finish(jd, js, q, "report_later", False)
        self.flush(js)  # the service is back
        return result

    def _reclaim_refused(self, js: JobState, p: Pending, r: Any) -> bool:
        """The claim of an abandoned batch's offline replay: refused (True), the driver
        drops its commit and replays the batch online; accepted, its barrier must lie
        past everything readers took as complete."""
        jd = self.topo.job(js.logical)
        if r.status_code == 200:
            for t in p.outputs:
                seen = self.complete.get(t, 0)
                assert p.barrier > seen, (
                    f"the offline claim of abandoned batch {p.batch_id} of {js.name} at "
                    f"{p.barrier} was accepted, but readers took {t} as complete at {seen}"
                )
            self.stats["offline replay of an abandoned batch accepted"] += 1
            return False
        js.claims.pop(0)
        js.outbox.remove(p)
        if p.snapshot is not None:
            self.tables[jd.output].roll_back(p.snapshot)
        self._forget_rows(jd, p.delta)
        js.pending = Pending(p.batch_id, p.barrier, {}, p.delta, p.outputs, abandoned=True)
        js.next_batch = p.batch_id
        self.stats["offline replay of an abandoned batch refused"] += 1
        return True

    def _replay_abandoned(
        self, jd: JobDef, js: JobState, p: Pending, fail: str, batched: bool
    ) -> str:
        """The restarted driver of an abandoned batch: a commit the dead driver made is
        reported late (refused) and rolled back; the replay gets a new barrier."""
        self._zombie_reports(jd, js, p)
        answer = self._ask(js, p.batch_id, {"query_id": js.query})
        b = answer["barrier"]
        seen = self.complete.get(jd.output, 0)
        assert b > seen and b >= self.slot_low() and b >= p.barrier, (
            f"the replay of abandoned batch {p.batch_id} of {js.name} (at {p.barrier}) got "
            f"{b}; readers took {seen} as complete"
        )
        q = js.pending = Pending(
            p.batch_id, b, answer, self._ingest(jd, max(1, len(p.delta)), b), _still_written(p, js)
        )
        js.newest = (p.batch_id, b)
        self.stats["abandoned batch replayed"] += 1
        self.log(f"replay of abandoned {js.name} batch {p.batch_id}: barrier {b}")
        return self._finish(jd, js, q, fail, batched)

    # ------------------------------------------------------------------ state changes

    def edit(self, method: str, path: str, ok: int | set[int], **kwargs: Any) -> Any:
        """A state change the service may refuse (409): then it must change nothing."""
        before = self.snapshot_state() if G3 in self.checks else None
        r = self.call(method, path, {ok, 409} if isinstance(ok, int) else {*ok, 409}, **kwargs)
        if r.status_code == 409:
            if before is not None:
                after = self.snapshot_state()
                assert after == before, (
                    f"refused {method} {path} {kwargs} ({r.text}) changed {after}"
                )
                self.stats["refused state change changed nothing"] += 1
            self.log(f"{method} {path}: refused {r.json()}")
        return r

    def _add_table(self, table: str) -> None:
        self.tables.setdefault(table, TableState(table))
        if self._lake is not None:
            self._lake.ensure(table)

    def late_output(self, job: str, done: bool = False) -> str:
        """An output added after a batch opened; a report of that batch for it is refused."""
        jd, js = self.topo.job(job), self.jobs[job]
        extra = f"{jd.output}_x"
        if extra in js.outputs or any(extra in o.outputs for _, o in self.live()):
            return "has it"
        if js.claims:
            return "claims undelivered"
        p: Pending | Done | None
        if done:
            p = js.done[-1] if js.done else None
        else:
            p = js.pending if js.pending is not None and js.pending.known else None
            if p is not None and p.abandoned:
                p = None
        if p is None:
            return "no batch"
        self._add_table(extra)
        bigger = {**self.spec(jd, js), "outputs": [*js.outputs, extra]}
        if self.edit("PUT", f"/jobs/{js.name}", 200, json=bigger).status_code == 409:
            return "adding refused"
        js.outputs.append(extra)
        late = _report(js.name, p.batch_id, p.barrier, extra, next(self._snapshot_ids))
        r = self.call("POST", "/commits", {200, 409}, json=late)
        assert r.status_code == 409, (
            f"a report of {js.name}'s batch {p.batch_id} (at {p.barrier}), opened before "
            f"{extra} was added to its outputs, was recorded for {extra}: {r.text}"
        )
        self.stats["late report for an added output refused"] += 1
        self.log(f"{extra} added to {js.name}; batch {p.batch_id}'s report for it refused")
        return "refused"

    def move_output(self, job: str) -> str:
        """The job's added output moves to the next job of the topology."""
        jd, js = self.topo.job(job), self.jobs[job]
        extra = f"{jd.output}_x"
        if js.claims:
            # (checked before the output is added: an offline batch is announced later,
            # and which outputs it was opened with is the driver's, not modelled here)
            return "claims undelivered"
        if extra not in js.outputs:
            if any(extra in o.outputs for _, o in self.live()):
                return "elsewhere"
            self._add_table(extra)
            bigger = {**self.spec(jd, js), "outputs": [*js.outputs, extra]}
            if self.edit("PUT", f"/jobs/{js.name}", 200, json=bigger).status_code == 409:
                return "adding refused"
            js.outputs.append(extra)
        names = [j.name for j in self.topo.jobs]
        to_jd = self.topo.jobs[(names.index(jd.name) + 1) % len(names)]
        to = self.jobs[to_jd.name]
        if to is js:
            return "no other job"
        if js.claims or to.claims:
            # (a batch given its barrier offline is announced later: which outputs it
            # was opened with is the driver's, not modelled here)
            return "claims undelivered"
        held = self.call("GET", f"/tables/{extra}", {200}).json()["frontier"] or 0
        smaller = [o for o in js.outputs if o != extra]
        r = self.edit(
            "PUT", f"/jobs/{js.name}", 200, json={**self.spec(jd, js), "outputs": smaller}
        )
        if r.status_code == 409:
            return "removal refused"
        js.outputs.remove(extra)
        bigger = [*to.outputs, extra]
        r = self.edit(
            "PUT", f"/jobs/{to.name}", 200, json={**self.spec(to_jd, to), "outputs": bigger}
        )
        if r.status_code == 409:
            return "adding refused"
        to.outputs.append(extra)
        now = self._took_over(extra, to)
        assert now >= held, (
            f"{extra} moved from {js.name} to {to.name}: its frontier went back from {held} "
            f"to {now} (a move keeps the table's history and frontier)"
        )
        self.stats["output moved to another job"] += 1
        self.log(f"{extra} moved from {js.name} to {to.name}")
        return "moved"

    def change_inputs(self, job: str, change: str = "add_input") -> str:
        """A derived job that never committed gets other inputs, after its sources planned."""
        jd, js = self.topo.job(job), self.jobs[job]
        if jd.is_source or js.ran or js.offset or js.pending is not None or js.planned:
            return "has run"
        if any(self.jobs[r.name].ran for r in self.topo.readers(jd.output)):
            return "read already"  # its readers' oracles would change under them
        inputs = self._identity_change(jd, change)
        if inputs is None:
            return "no such change"
        self.peek(job, len(jd.inputs))  # its sources fixed an end for the old inputs
        r = self.edit("PUT", f"/jobs/{js.name}", 200, json={**self.spec(jd, js), "inputs": inputs})
        if r.status_code == 409:
            # (or: a revision runs on the table it would start reading)
            assert r.json()["code"] in {"job_identity_changed", "revision_running"}, r.text
            return "refused"
        new = JobDef(jd.name, jd.output, tuple(inputs))
        self.topo = Topology(tuple(new if j is jd else j for j in self.topo.jobs))
        js.asked = {}  # the query restarts on its new sources
        # "The MetaService chooses the job's next target b <= min frontier(inputs)": of
        # its inputs now, not the plan its old inputs had. Its round may move them first
        # (an idle derived input advanced), so they are read after it.
        ends = {
            source: self.call(
                "GET",
                f"/jobs/{js.name}/next-barrier",
                {200},
                params={"after": js.offset, "source": source},
            ).json()["barrier"]
            for source in inputs
        }
        items = self.call("GET", "/tables", {200}, params={"limit": 1000}).json()["items"]
        shown = {t["name"]: t["frontier"] or 0 for t in items if t["name"] in inputs}
        if self._advancer is not None:
            # A derived job's own round seals the idle sources it reads up to its
            # replica's closed slot (below an offline floor), ahead of the watermark
            # the tables show: at most the newest replica's closed slot; with replicas
            # it also advances idle derived inputs up to there (a replica whose clock
            # is ahead of the one that last advanced them).
            for t in inputs:
                writer = self.topo.writer(t) if t in self.topo.tables else None
                if writer is not None and (writer.is_source or len(self.clocks) > 1):
                    floor = self.jobs[writer.name].floor
                    sealable = self.slot_high() - self.interval
                    if floor is not None:
                        sealable = min(sealable, floor - self.interval)
                    shown[t] = max(shown[t], sealable)
        least = min(shown.values())
        for source, end in ends.items():
            assert end <= max(least, js.offset), (
                f"G1: {js.name}'s inputs changed to {inputs} (least frontier {least}); its "
                f"source {source}'s next batch after {js.offset} ends at {end}, the "
                "plan made for its old inputs"
            )
        self.stats["inputs of a job that never committed changed"] += 1
        self.log(f"{js.name}'s inputs are now {inputs}")
        return "changed"

    def rejoin(self, job: str, rename: bool = False) -> str:
        """A source job deleted and registered again; its table keeps its history."""
        jd, js = self.topo.job(job), self.jobs[job]
        if not jd.is_source:
            return "not a source job"
        if self.topo.readers(jd.output):
            self.refused("DELETE", f"/jobs/{js.name}", 409, {"has_readers"})
            return "refused: has readers"
        self.release_grant(job)
        self.flush(js)
        if js.pending is not None or js.outbox or js.claims:
            return "batch open"
        r = self.edit("DELETE", f"/jobs/{js.name}", 204)
        if r.status_code == 409:
            return "refused"
        name = f"{jd.name}.r{next(self._incarnations)}" if rename else js.name
        self._take_over(name, {200, 201}, json=self.spec(jd, js))
        self._took_over(jd.output)
        self.history = [h for h in self.history if h["job"] != js.name]
        fresh = JobState(jd.name, name, f"q-{name}", list(js.outputs))
        if not rename:
            # The same driver comes back from its checkpoint: its batch ids go on (a
            # new query restarting at 0 would find the old batches in the summaries).
            fresh.query, fresh.next_batch = js.query, js.next_batch
        self.jobs[jd.name] = fresh
        self.stats["source job deleted and registered again"] += 1
        self.log(f"{js.name} deleted and registered again as {name}")
        return "rejoined"

    def reconcile(self) -> str:
        """``metaservice reconcile`` over every table's stamped snapshots."""
        if self._reconcile is None:
            return "no reconcile"
        stamps = {
            t: [
                {
                    "snapshot_id": s.snapshot_id,
                    "barrier": s.barrier,
                    "job": s.job,
                    "batch_id": s.batch_id,
                }
                for s in ts.snapshots
            ]
            for t, ts in self.tables.items()
            if ts.snapshots
        }
        report = self._reconcile(stamps)
        self.log(f"reconcile: {report}")
        # What it may record: every commit a live driver made and has not reported.
        for _, js in self.live():
            unreported = [
                p
                for p in [*js.outbox, *([js.pending] if js.pending is not None else [])]
                if p.written and p.known and not p.abandoned
            ]
            if not any(p.snapshot is not None for p in unreported):
                continue
            for p in unreported:
                # (a batch without a snapshot before one with it: completed empty)
                if p.snapshot is not None:
                    p.snapshot.reported = True
                p.reconciled = True
        # And the batches of offline claims not delivered yet that it recorded from their
        # stamps (the claim, delivered later, is answered at the same barrier, and the
        # report is a duplicate).
        added = {a["snapshot_id"] for t in report.get("tables", []) for a in t.get("added", [])}
        for _, js in self.live():
            for p in [*js.claims, *js.outbox]:
                if p.snapshot is not None and p.snapshot.snapshot_id in added:
                    p.snapshot.reported = True
                    p.reconciled = True
        self.stats["reconciled"] += 1
        return "reconciled"

    def retention(self, table: str, keep_last: int = 2) -> str:
        self.call("PUT", f"/tables/{table}/retention", {200}, json={"keep_last": keep_last})
        self.keep_last[table] = keep_last
        return "retention set"

    # ------------------------------------------------------------------ revisions

    def revise(self, table: str, back: int = 0) -> str:
        """Plan a revision of a derived table from a barrier its writer committed."""
        if self._lake is None:
            return "no Iceberg tables"
        jd = self.topo.writer(table)
        js = self.jobs[jd.name]
        if jd.is_source or self.revisions:
            return "a source table, or a revision already running"
        ends = sorted(e for e in js.ends if 0 < e <= js.committed)
        if not ends:
            return "nothing committed yet"
        b = ends[-1 - back % len(ends)]
        r = self.edit("POST", "/revisions", 201, json={"table": table, "from_barrier": b})
        if r.status_code == 409:
            return f"refused: {r.json()['code']}"
        view = r.json()
        rs = self.revisions[view["id"]] = RevisionState(view["id"], table, b)
        self._follow(rs, view)
        self.stats["revision planned"] += 1
        self.log(f"revision {rs.rid} of {table} from {b}: {view}")
        return "planned"

    def _follow(self, rs: RevisionState, view: dict) -> None:
        """Mirrors and revision jobs the service names that the simulator lacks (a
        reader or an output added during the revision may be taken into it)."""
        for m in view["tables"]:
            original, mirror = m["table"], m["mirror"]
            if original in rs.mirrors:
                continue
            start = m["start_snapshot"]
            expected = self.tables[original].snapshot_at(rs.from_barrier)
            assert start == expected, (
                f"G1: the mirror {mirror} of {original} starts at {start}; its snapshot at "
                f"{rs.from_barrier} is {expected} ({view})"
            )
            rs.mirrors[original] = mirror
            self.mirror_of[mirror] = original
            ts = self.tables[mirror] = TableState(mirror)
            if start is not None:
                # The mirror's history starts at the snapshot: the table's state there.
                old = self.tables[original].snapshots[self.tables[original].position(start)]
                content = self.tables[original].content(start)
                ts.append(Snapshot(start, old.barrier, old.job, old.batch_id, content, True, True))
        for must in view["must_run"]:
            logical = next(jd.name for jd, js in self.live() if js.name == must["job"])
            if logical in rs.jobs:
                continue
            main = self.mirror_name(rs, self.topo.job(logical).output)
            outs = [main, *sorted(o["mirror"] for o in must["outputs"] if o["mirror"] != main)]
            reads = {i["table"]: i["mirror"] for i in must["mirror_inputs"]}
            rj = JobState(logical, must["revision_job"], f"q-{must['revision_job']}", outs)
            rj.offset, rj.reads, rj.ends = rs.from_barrier, reads, {rs.from_barrier}
            rs.jobs[logical] = rj

    @staticmethod
    def mirror_name(rs: RevisionState, table: str) -> str:
        return rs.mirrors.get(table, table)

    def _revision(self) -> RevisionState | None:
        if not self.revisions:
            return None
        rs = next(iter(self.revisions.values()))
        view = self.call("GET", f"/revisions/{rs.rid}", {200}).json()
        self._follow(rs, view)
        return rs

    def superseded(self, logical: str) -> bool:
        """The job's writer is superseded by a revision that is swapping."""
        return any(rs.swapping and logical in rs.jobs for rs in self.revisions.values())

    def run_revision(self, pick: int | None = None, fail: str = "none") -> str:
        rs = self._revision()
        if rs is None:
            return "no revision"
        order = [j.name for j in self.topo.jobs if j.name in rs.jobs]
        names = order if pick is None else [order[pick % len(order)]]
        return ", ".join(
            self._run_derived(self.topo.job(n), rs.jobs[n], fail, False, "none") for n in names
        )

    def swap(self) -> str:
        rs = self._revision()
        if rs is None:
            return "no revision"
        for logical in rs.jobs:
            self.flush(self.jobs[logical])  # the original writers' reports are delivered
        r = self.edit("POST", f"/revisions/{rs.rid}/swap", {200, 202}, json={"wait_seconds": 0})
        if r.status_code == 409:
            return f"refused: {r.json()['code']}"
        if r.status_code == 202 or r.json()["state"] != "swapped":
            rs.swapping = True
            self.log(f"revision {rs.rid}: swapping")
            return "swapping"
        self._swapped(rs)
        return "swapped"

    def _swapped(self, rs: RevisionState) -> None:
        """The mirrors carry the original names and the revision's jobs are the writers.
        Answers naming the revised tables were of the replaced history: they go (the
        latest versions must still not go back)."""
        # "The affected set is the downstream closure at the swap": a reader or an output
        # added during the revision was refused or taken into it, never left behind.
        for logical in rs.jobs:
            left = sorted(set(self.jobs[logical].outputs) - set(rs.mirrors))
            assert not left, (
                f"revision {rs.rid} swapped without {left}, outputs of {logical} (superseded): "
                f"they are left on the replaced writer (mirrors {rs.mirrors})"
            )
        readers = {
            r.name for t in rs.mirrors if t in self.topo.tables for r in self.topo.readers(t)
        }
        assert readers <= set(rs.jobs), (
            f"revision {rs.rid} swapped without {sorted(readers - set(rs.jobs))}, readers of "
            f"the revised tables {sorted(rs.mirrors)}: they are left on the replaced tables"
        )
        for original, mirror in rs.mirrors.items():
            ts = self.tables[mirror]
            ts.name = original  # (the lake commits under the table's name)
            self.tables[original] = ts
            self.reserved[original] = set()
            self.forget_answers(original)
        for logical, rj in rs.jobs.items():
            rj.outputs = [self.mirror_of.get(o, o) for o in rj.outputs]
            rj.reads = {}
            self.jobs[logical] = rj
        gone = set(rs.mirrors) | set(rs.mirrors.values())
        self.history = [h for h in self.history if h["table"] not in gone]
        del self.revisions[rs.rid]
        self.stats["revision swapped"] += 1
        self.log(f"revision {rs.rid} swapped: {rs.mirrors}")

    def cancel_revision(self) -> str:
        rs = self._revision()
        if rs is None:
            return "no revision"
        r = self.edit("DELETE", f"/revisions/{rs.rid}", 200)
        if r.status_code == 409:
            return f"refused: {r.json()['code']}"
        del self.revisions[rs.rid]
        self.stats["revision cancelled"] += 1
        return "cancelled"

    # ------------------------------------------------------------------ expiry and tags

    def expire_now(self, table: str) -> str:
        """Expire the table's unused snapshots for real, after a dry run."""
        if self._lake is None:
            return "no Iceberg tables"
        self.expiry(table)  # the plan: G5 on what it lists
        path = f"/tables/{table}/expire"
        r = self.edit("POST", path, 200, json={"dry_run": True})
        if r.status_code == 409:
            return f"refused: {r.json()['code']}"
        dry = r.json()
        r = self.edit("POST", path, 200, json={"dry_run": False})
        if r.status_code == 409:
            return f"refused: {r.json()['code']}"
        done = r.json()
        listed = sorted(s["snapshot_id"] for s in dry["snapshots"])
        removed = sorted(s["snapshot_id"] for s in done["snapshots"])
        assert removed == listed, (
            f"the expiry of {table} removed {removed}; its dry run, with nothing changed in "
            f"between, listed {listed} (held by refs: dry {dry['held_by_refs']}, run "
            f"{done['held_by_refs']})"
        )
        in_use = self.in_use(table)
        wrong = {s: in_use[s] for s in removed if s in in_use}
        assert not wrong, f"G5: the expiry of {table} removed snapshots in use: {wrong}; {done}"
        self.expired.setdefault(table, set()).update(removed)
        if removed:
            self.stats["snapshots expired"] += 1
        self.log(f"expired {table}: {removed}")
        return "expired"

    def tag(self, tables: Sequence[str], at_or_before: int | None, retain_s: int | None) -> str:
        """Publish a consistent version as a tag: the version, and kept while it lives."""
        if self._lake is None:
            return "no Iceberg tables"
        written = {t for _, js in self.live() for t in js.outputs}
        if not set(tables) <= written:
            return "no such table"
        name = f"tag{len(self.tags)}"
        body: dict[str, Any] = {"name": name, "tables": list(tables)}
        if at_or_before is not None:
            body["at_or_before"] = at_or_before
        if retain_s is not None:
            body["retain_seconds"] = retain_s
        r = self.call("POST", "/versions/tags", {201, 409}, json=body)
        if r.status_code == 409:
            assert r.json()["code"] in {"no_consistent_version", "expired"}, r.text
            return "no version"
        view = r.json()
        b, snapshots = view["barrier"], view["snapshots"]
        assert set(snapshots) == set(tables) and (at_or_before is None or b <= at_or_before), view
        if G1 in self.checks:
            self.check_exact(snapshots, b, f"tag {view}")
        for t, s in snapshots.items():
            assert s not in self.expired.get(t, ()), f"G5: tag {view} names expired {s} of {t}"
        # A tag is a consistent version handed out: the same as versions answer.
        self._remember(tuple(sorted(tables)), None, b, snapshots)
        self.tags[name] = (view["expires_ms"], dict(snapshots))
        self.stats["tag published"] += 1
        self.log(f"tag {view}")
        return "tagged"

    def drop_tag(self, pick: int = 0) -> str:
        if not self.tags:
            return "no tag"
        name = sorted(self.tags)[pick % len(self.tags)]
        self.call("DELETE", f"/versions/tags/{name}", {200, 204, 404})
        del self.tags[name]
        return "dropped"

    # ------------------------------------------------------------------ G1, G2

    def oracle(self, table: str, barrier: int, _memo: dict | None = None) -> Counter:
        """The table recomputed from the source rows with barrier <= ``barrier``."""
        memo = {} if _memo is None else _memo
        if table in memo:
            return memo[table]  # type: ignore[no-any-return]
        table = self.mirror_of.get(table, table)  # a mirror: its original, recomputed
        if table not in self.topo.tables:
            return Counter()  # an added output: its batches only ever commit nothing
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

    def observe(self) -> dict[str, int]:
        """Every job's frontier (GET /jobs), by logical job; a derived job's frontier is
        a barrier one of its batches ended at (G2's record of batches)."""
        fronts = self._frontiers_of_jobs()
        out = {}
        for jd, js in self.live():
            front = fronts[js.name]
            out[jd.name] = front
            if not jd.is_source and front > 0:
                js.ends.add(front)
        return out

    def g2_floor(
        self, tables: Sequence[str], fronts: dict[str, int], at_or_before: int | None
    ) -> tuple[int, int] | None:
        """(M, P): the barrier the consistent version of ``tables`` must reach by the
        bound of ``frontiers.aligned_target`` (see :func:`g2_bound`), or None."""
        if any(t not in self.topo.tables for t in tables):
            return None  # an added output's frontier is not tracked
        least = min(fronts[self.topo.writer(t).name] for t in tables)
        if at_or_before is not None:
            least = min(least, at_or_before - at_or_before % self.interval)
        jobs = self.topo.derived_closure(tables)
        if not jobs:
            return (least, 1) if least > 0 else None
        return g2_bound(least, [self.jobs[j.name].ends for j in jobs], self.interval)

    def version(
        self,
        tables: Sequence[str],
        at_or_before: int | None = None,
        lease_seconds: int | None = None,
        post: bool = False,
    ) -> dict | None:
        """The consistent version of ``tables`` (None on 409), checked against the oracle
        (G1), the bound (G2) and the expiry reservations (G5); with a lease taken through
        ``GET /versions/consistent`` or, if ``post``, ``POST /leases``."""
        params: dict[str, Any] = {"tables": ",".join(tables)}
        if at_or_before is not None:
            params["at_or_before"] = at_or_before
        if lease_seconds is not None:
            params["lease_seconds"] = lease_seconds
        bound = None
        if self._advancer is not None and G2 in self.checks and not self._fresh:
            # Every other version the advancer runs first, so that G2's bound can be
            # checked; the others read what the last drawn raise and advance left.
            self._version_turn += 1
            if self._version_turn % 2:
                self.tick_advancer()
        fresh = self._fresh
        fronts = self.observe()
        if G2 in self.checks and fresh:
            bound = self.g2_floor(tables, fronts, at_or_before)
        # The answer for at_or_before is final once every table's frontier reached it
        # (frontiers only grow): no barrier up to it can become consistent later.
        settled = at_or_before is not None and all(
            t in self.topo.tables and fronts[self.topo.writer(t).name] >= at_or_before
            for t in tables
        )
        if post and lease_seconds is not None:
            body = {**params, "tables": list(tables)}
            r = self.call("POST", "/leases", {201, 409}, json=body)
        else:
            r = self.call("GET", "/versions/consistent", {200, 409}, params=params)
        key = tuple(sorted(tables))
        if r.status_code == 409:
            code = r.json()["code"]
            assert code in {"no_consistent_version", "expired"}, r.text
            if at_or_before is not None and (key, at_or_before) in self.memo:
                # (an answer of its own barrier's, or a settled one)
                assert code == "expired", (
                    f"a consistent version of {key} at or before {at_or_before} was answered "
                    f"{self.memo[key, at_or_before]}, now it is refused: {r.text}"
                )
            if code == "expired":
                self.stats["version refused: expired"] += 1
            else:
                assert bound is None, (
                    f"G2: no consistent version of {tables} (at_or_before {at_or_before}), "
                    f"but by the bound of aligned_target it is at least {bound[0]} "
                    f"(P = {bound[1]} slots)"
                )
            self.log(f"version {params}: {code}")
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
        self._remember(key, at_or_before if settled else None, b, v["snapshots"])
        if G2 in self.checks:
            if bound is not None:
                assert b >= bound[0], (
                    f"G2: consistent version {v} of {tables} (at_or_before {at_or_before}) "
                    f"is below {bound[0]}, the bound of aligned_target with P = {bound[1]} "
                    f"slots (frontiers and batches seen: "
                    f"{ {j.name: sorted(self.jobs[j.name].ends) for j in self.topo.derived} })"
                )
                self.stats["G2 bound checked"] += 1
                if bound[1] > 1:
                    self.stats["G2 bound checked with batches over one slot"] += 1
            if at_or_before is None:
                assert b >= self.last_version.get(key, 0), (
                    f"G2: the consistent version of {key} went back from "
                    f"{self.last_version[key]} to {b}"
                )
                self.last_version[key] = b
        for t, s in v["snapshots"].items():
            self.complete[t] = max(self.complete.get(t, 0), b)
            if G5 in self.checks:
                assert s not in self.expired.get(t, ()), (
                    f"G5: version {v} names snapshot {s} of {t}, expired"
                )
                assert s not in self.reserved.get(t, ()), (
                    f"G5: version {v} names snapshot {s} of {t}, reserved for expiry"
                )
        if lease_seconds is not None:
            assert v["lease_expires_ms"] == self.answering_now() + lease_seconds * 1000, v
            self.leases[v["lease_id"]] = LeaseRecord(
                v["lease_id"], v["lease_expires_ms"], b, dict(v["snapshots"])
            )
        return v  # type: ignore[no-any-return]

    def _remember(
        self, key: tuple[str, ...], at_or_before: int | None, b: int, snapshots: dict
    ) -> None:
        """Record an answer: for at_or_before, and for its own barrier (the latest
        consistent version at or before a consistent barrier is that barrier's)."""
        answer = (b, dict(snapshots))
        for at in {b, b if at_or_before is None else at_or_before}:
            given = self.memo.setdefault((key, at), answer)
            assert given == answer, (
                f"a consistent version changed: {key} at or before {at} was answered "
                f"{given}, now {answer}"
            )

    def forget_answers(self, table: str) -> None:
        """The table is written afresh (its writer replaced): earlier answers go."""
        self.memo = {k: v for k, v in self.memo.items() if table not in k[0]}

    def check_memo(self, every: bool = True, after: str = "") -> None:
        """Ask again for answers already given (all, or the next few in turn): each
        must be answered unchanged, unless a snapshot it names was expired since."""
        entries = sorted(self.memo.items())
        if not entries:
            return
        if not every:
            start = self._memo_turn % len(entries)
            entries = (entries[start:] + entries[:start])[:3]
            self._memo_turn = start + 3
        written = {t for _, js in self.live() for t in js.outputs}
        for (key, at), (b, snapshots) in entries:
            if not set(key) <= written:
                continue  # an output removed from every job since: nobody writes it
            r = self.call(
                "GET",
                "/versions/consistent",
                {200, 409},
                params={"tables": ",".join(key), "at_or_before": at},
            )
            got = r.json()
            if r.status_code == 409 and got.get("code") == "expired":
                gone = {t: self.expired.get(t, set()) | self.reserved.get(t, set()) for t in key}
                assert any(s in gone[t] for t, s in snapshots.items()), (
                    f"the consistent version of {key} at or before {at} was answered "
                    f"{(b, snapshots)}; after {after or 'a step'} it is refused as expired, "
                    "though none of its snapshots was expired"
                )
                continue
            now = (got.get("barrier"), got.get("snapshots")) if r.status_code == 200 else got
            assert now == (b, snapshots), (
                f"every state change keeps every answer: the consistent version of {key} at "
                f"or before {at} was answered {(b, snapshots)}, and after {after or 'a step'} "
                f"it is {now}"
            )
            self.stats["memo answers checked again"] += 1

    def frontiers(self) -> dict[str, int]:
        """Every table's frontier (GET /tables). For G1: each table contains, at its
        frontier, exactly the source data up to it; frontiers never go back."""
        items = self.call("GET", "/tables", {200}, params={"limit": 1000}).json()["items"]
        fronts = {t["name"]: t["frontier"] for t in items if t["name"] in self.topo.tables}
        assert set(fronts) == set(self.topo.tables), fronts
        for t, f in fronts.items():
            jd = self.topo.writer(t)
            js = self.jobs[jd.name]
            if f is None:  # no data yet: only a derived table that never had a frontier
                # (or, where the advancer raises the watermark, a source before the
                # first raise that never committed)
                unraised = self._advancer is not None and self.watermark == 0
                assert not self.last_frontier.get(t), (t, f)
                assert not jd.is_source or unraised, (t, f)
                fronts[t] = f = 0
            assert f % self.interval == 0, (t, f)
            assert f >= self.last_frontier.get(t, 0), (
                f"frontier of {t} went back from {self.last_frontier[t]} to {f}"
            )
            # A slot is over once the clock left it; a job's own batches ahead of the
            # clock (an offline claim) do not end a slot for anyone.
            # (or the history a new writer took over, which nothing can add to: N3)
            assert f < self.slot_high() or f == 0 or f <= self.held.get(t, 0), (
                f"frontier of {t} at {f}: its slot is not over"
            )
            if not jd.is_source and f > 0:
                js.ends.add(f)
            if f > 0:
                self.complete[t] = max(self.complete.get(t, 0), f)
            if G1 in self.checks and f > 0:
                self.check_exact({t: self.tables[t].snapshot_at(f)}, f, f"frontier of {t} = {f}")
                self.stats["G1 frontiers checked"] += 1
        self.last_frontier = fronts
        return fronts

    def catalog_session(self, at_or_before: int | None) -> dict | None:
        """A REST catalog session (None when refused): the tables it reads are those the
        catalog lists, each at the snapshot its lease keeps, checked as a consistent
        version of them is (G1, G5) and recorded as a lease."""
        warehouse = "consistent" if at_or_before is None else f"at:{at_or_before}"
        self._fresh = self._advancer is None  # where readers catch up, it seals
        r = self.client.request("GET", "/iceberg/v1/config", params={"warehouse": warehouse})
        assert r.status_code in {200, 400, 503}, f"config {warehouse}: {r.text}"
        if r.status_code != 200:
            self.stats["catalog session refused"] += 1
            self.log(f"catalog session {warehouse}: {r.status_code} {r.text}")
            return None
        prefix = r.json()["overrides"]["prefix"]
        names = self._catalog_tables(prefix)
        pins: dict[str, int | None] = {}
        barrier = expires = None
        for name in names:
            page = self.call("GET", f"/tables/{name}/leases", {200}, params={"limit": 500})
            (item,) = [i for i in page.json()["items"] if i["lease_id"] == prefix]
            pins[name], barrier, expires = item["snapshot_id"], item["barrier"], item["expires_ms"]
        self.log(f"catalog session {warehouse}: {prefix} at {barrier}: {pins}")
        if barrier is None or expires is None:
            return {"prefix": prefix, "snapshots": {}}
        if at_or_before is not None:
            assert barrier <= at_or_before, (warehouse, barrier)
        known = {t: s for t, s in pins.items() if t in self.tables}
        if G1 in self.checks and known:
            self.check_exact(known, barrier, f"catalog session {warehouse} at {barrier}")
            self.stats["G1 catalog sessions checked"] += 1
        if G5 in self.checks:
            for t, snapshot in known.items():
                assert snapshot not in self.expired.get(t, ()), (
                    f"G5: catalog session {prefix} reads snapshot {snapshot} of {t}, expired"
                )
                assert snapshot not in self.reserved.get(t, ()), (
                    f"G5: catalog session {prefix} reads snapshot {snapshot} of {t}, reserved"
                )
        self.leases[prefix] = LeaseRecord(prefix, expires, barrier, known)
        return {"prefix": prefix, "barrier": barrier, "snapshots": pins}

    def _catalog_tables(self, prefix: str) -> list[str]:
        """The tables a catalog session reads, as the catalog lists them."""
        base = f"/iceberg/v1/{prefix}/namespaces"
        r = self.client.request("GET", base)
        assert r.status_code == 200, r.text
        names = []
        for (namespace,) in r.json()["namespaces"]:
            listed = self.client.request("GET", f"{base}/{namespace}/tables")
            assert listed.status_code == 200, listed.text
            names += [f"{namespace}.{i['name']}" for i in listed.json()["identifiers"]]
        return sorted(names)

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
        for name, (ends, snapshots) in self.tags.items():
            snapshot = snapshots.get(table)
            if snapshot is not None and (ends is None or ends > self.now()) and ts.has(snapshot):
                reasons.setdefault(snapshot, []).append(f"tag {name}")
        keep = self.keep_last.get(table, 0)
        for snapshot in reported[len(reported) - keep :] if keep else []:
            reasons.setdefault(snapshot.snapshot_id, []).append(f"retention keep_last {keep}")
        for lease in self.leases.values():
            snapshot = lease.snapshots.get(table)
            if lease.expires_ms > self.now() and snapshot is not None and ts.has(snapshot):
                reasons.setdefault(snapshot, []).append(f"lease {lease.lease_id}")
        for reader in self.topo.readers(table):
            # The next batch of the reader's Spark query reads from its offset on (the
            # end of its last batch; a batch in flight still needs it).
            js = self.jobs[reader.name]
            start = ts.snapshot_at(js.offset)
            pinned = start if start is not None else reported[0].snapshot_id
            reasons.setdefault(pinned, []).append(f"start of {js.name} (offset {js.offset})")
        return reasons

    def expiry(self, table: str, reserve: bool = False) -> dict:
        if reserve and self._reserve is not None:
            plan = self._reserve(table)
            self.stats["expiry reserved"] += 1
        else:
            plan = self.call("GET", f"/tables/{table}/expirable", {200}).json()
        listed = [p["snapshot_id"] for p in plan["expirable"]]
        kept = [p["snapshot_id"] for p in plan["kept"]]
        gone = self.expired.get(table, set())
        reported = [
            s.snapshot_id for s in self.tables[table].reported() if s.snapshot_id not in gone
        ]
        # (in commit order, but for snapshots a tag keeps: the plan may expire past them)
        assert sorted(listed + kept) == sorted(reported) and listed == sorted(
            listed, key=reported.index
        ), f"plan of {table} {plan} vs reported {reported}"
        self.log(f"expiry {table}: expirable {listed}" + (" (reserved)" if reserve else ""))
        if G5 in self.checks:
            in_use = self.in_use(table)
            wrong = {s: in_use[s] for s in listed if s in in_use}
            assert not wrong, f"G5: plan of {table} lists snapshots in use: {wrong}; plan {plan}"
            blocking = [
                s for s, why in in_use.items() if not all(w.startswith("tag ") for w in why)
            ]
            if listed and blocking:
                oldest = min(reported.index(s) for s in blocking)
                assert reported.index(listed[-1]) < oldest, (
                    f"G5: {table}: expirable {listed} reaches past the oldest in use "
                    f"{reported[oldest]} ({in_use})"
                )
            self.stats["G5 plans checked"] += 1
            if listed:
                self.stats["G5 plans with expirable snapshots"] += 1
        if reserve and self._reserve is not None:
            self.reserved[table].update(listed)
        return plan


def _report(job: str, batch_id: int, barrier: int, table: str, snapshot_id: int | None) -> dict:
    return {
        "job": job,
        "batch_id": batch_id,
        "barrier": barrier,
        "table": table,
        "snapshot_id": snapshot_id,
    }


def _still_written(p: Pending, js: JobState) -> tuple[str, ...]:
    """The outputs the replay of a batch reports to: those it was opened with that the
    job still writes (an output added since takes effect from the job's next batch)."""
    return tuple(t for t in p.outputs if t in js.outputs)


def _fail(fail: str) -> str:
    return f" fail={fail}" if fail != "none" else ""


# --------------------------------------------------------------------------- strategies


@st.composite
def topologies(draw: Any, max_sources: int = 3, max_derived: int = 4) -> Topology:
    """1..max_sources source jobs writing one table each, then 1..max_derived derived
    jobs each reading 1-3 tables that already exist (in a random source order) and
    writing a new one (a DAG)."""
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
        jobs.append(JobDef(f"der{i}", f"dw.d{i}", tuple(inputs)))
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
    "expiry": 1,
}

_RUN_FAILS = ["none", "none", "none", "before_commit", "after_commit", "report_later"]


def step_strategy(topology: Topology, kind: str) -> st.SearchStrategy[Step]:
    names = [j.name for j in topology.jobs]
    jobs = st.sampled_from(names)
    derived = st.sampled_from([j.name for j in topology.derived])
    tables = st.sampled_from(topology.tables)
    picks = st.integers(0, 50)
    sources = st.sampled_from([j.name for j in topology.sources])
    if kind == "advance":
        return st.builds(
            Advance,
            st.one_of(st.integers(0, 3).map(lambda n: n * INTERVAL_MS), st.integers(0, 3000)),
        )
    if kind == "long":  # batches spanning hundreds of slots
        return st.builds(Advance, st.integers(100, 700).map(lambda n: n * INTERVAL_MS))
    if kind == "run":
        return st.builds(
            Run,
            jobs,
            rows=st.integers(0, 3),
            fail=st.sampled_from([*_RUN_FAILS, "before_plan"]),
            batched=st.booleans(),
            mid=st.sampled_from(["none", "none", "flush"]),
        )
    if kind == "tick":
        return st.builds(
            Tick,
            st.sets(st.sampled_from(names)).map(lambda js: tuple(n for n in names if n in js)),
        )
    if kind == "peek":
        return st.builds(Peek, derived, st.integers(1, 2))
    if kind == "replay":
        return st.builds(Replay, jobs, picks)
    if kind == "duplicate":
        return st.builds(Duplicate, picks, st.booleans())
    if kind == "conflict":
        return st.builds(
            Conflict,
            picks,
            st.sampled_from(
                [
                    "other_snapshot",
                    "no_snapshot",
                    "other_barrier",
                    "stolen_snapshot",
                    "plan_mismatch",
                    "empty_range",
                ]
            ),
            st.booleans(),
        )
    if kind == "version":
        return st.builds(
            Version,
            st.lists(tables, min_size=1, max_size=3, unique=True).map(lambda ts: tuple(sorted(ts))),
            st.none() | st.integers(0, 6000),
            st.none() | st.integers(1, 30),
        )
    if kind == "lease":
        return st.builds(
            Version,
            st.lists(tables, min_size=1, max_size=3, unique=True).map(lambda ts: tuple(sorted(ts))),
            st.none() | st.integers(0, 20_000),
            st.integers(1, 30),
            st.booleans(),
        )
    if kind == "catalog_session":
        return st.builds(CatalogSession, st.none() | st.integers(0, 20_000))
    if kind == "release":
        return st.builds(Release, picks)
    if kind == "expiry":
        return st.builds(Expiry, st.none() | tables, st.booleans())
    if kind == "frontiers":
        return st.just(Frontiers())
    if kind == "watermark":  # the advancer's raise, on a drawn replica
        return st.builds(Watermark, st.integers(0, 1))
    if kind == "advance_idle":  # the advancer's advance of idle derived jobs
        return st.builds(AdvanceIdle, st.integers(0, 1))
    if kind == "flush":
        return st.builds(Flush, st.none() | jobs)
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
    if kind == "skewed":  # offline claims from a clock up to 60 s ahead
        return st.builds(
            Run,
            sources,
            rows=st.integers(0, 3),
            fail=st.just("offline"),
            ahead_ms=st.integers(1, 59).map(lambda s: s * INTERVAL_MS),
        )
    if kind == "reregister":
        return st.builds(
            Reregister,
            jobs,
            st.sampled_from(
                ["same", "kind", "add_input", "drop_input", "add_output", "drop_output"]
            ),
        )
    if kind == "replace":  # source writers ("replace_derived": derived ones)
        return st.builds(Replace, sources, st.booleans())
    if kind == "replace_derived":
        return st.builds(Replace, derived, st.booleans())
    if kind == "abandon":
        return st.builds(Abandon, sources, st.booleans())
    if kind == "reset_query":
        return st.builds(ResetQuery, jobs)
    if kind == "late_output":
        return st.builds(LateOutput, jobs, st.booleans())
    if kind == "move_output":
        return st.builds(MoveOutput, jobs)
    if kind == "change_inputs":
        return st.builds(ChangeInputs, derived, st.sampled_from(["add_input", "drop_input"]))
    if kind == "rejoin":
        return st.builds(Rejoin, sources, st.booleans())
    if kind == "reconcile":
        return st.just(Reconcile())
    if kind == "retention":
        return st.builds(Retention, tables, st.integers(1, 3))
    if kind == "reclaim":  # a source batch (an abandoned one's replay) claimed offline
        return st.builds(Run, sources, fail=st.just("offline"), ahead_ms=st.just(INTERVAL_MS))
    if kind == "revise":
        return st.builds(Revise, st.sampled_from([j.output for j in topology.derived]), picks)
    if kind == "run_revision":
        return st.builds(
            RunRevision,
            st.none() | picks,
            st.sampled_from(["none", "none", "before_commit", "after_commit", "report_later"]),
        )
    if kind == "swap":
        return st.just(Swap())
    if kind == "cancel_revision":
        return st.just(CancelRevision())
    if kind == "expire_now":
        return st.builds(ExpireNow, tables)
    if kind == "tag":
        return st.builds(
            Tag,
            st.lists(tables, min_size=1, max_size=3, unique=True).map(lambda ts: tuple(sorted(ts))),
            st.none() | st.integers(0, 6000),
            st.none() | st.integers(1, 10),
        )
    if kind == "drop_tag":
        return st.builds(DropTag, picks)
    if kind == "version_x":  # a table with another job's added output
        return st.builds(
            lambda t, u, back: Version(tuple(sorted({t, f"{u}_x"})), back),
            tables,
            tables,
            st.none() | st.integers(0, 6000),
        )
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
