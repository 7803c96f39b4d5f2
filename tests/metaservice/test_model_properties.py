"""Property tests of the model (G1, G2, G3, G5) without Spark.

Hypothesis draws a random ETL topology and a random schedule of job turns, clock
moves (some of hundreds of slots), crashes, replays, reports held back between a
derived job's barrier sources' calls, offline batches claimed from clocks running
ahead, dead drivers whose batches are abandoned, re-registrations, writer
replacements, reset Spark queries, duplicate and conflicting reports, leases,
consistent-version requests and expiry plans; ``simulation.Simulation`` plays it
against the real service (in-process ASGI app, real SQLite or PostgreSQL database,
ManualClock; real Iceberg tables in the service's catalog for revisions, expiry runs
and tags). After every step the answers already given are asked for again and must
be unchanged ("every state change keeps every answer already given"). Derived jobs
are incremental, as real ones: each batch appends f of the rows in the input ranges
the service hands out. Every answer is checked against
the simulator's own records and an oracle that recomputes each table from the
source rows: G1, G2 (with the bound of ``frontiers.aligned_target``), G3 and G5
throughout, in every test; each test weighs the steps towards one guarantee. Each
example gets a fresh, migrated database.

Set METASERVICE_PROPERTY_EXAMPLES=N to run N examples per test (deeper runs), and
METASERVICE_PROPERTY_NO_SHRINK=1 to see a failing example as drawn (shrinking the
long schedules can take minutes).
"""

from __future__ import annotations

import math
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, event, example, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, inspect, text

from metaservice.app import create_app
from metaservice.barriers import advancer, watermark
from metaservice.catalog_loading import open_catalog
from metaservice.clock import ManualClock
from metaservice.contract import encode_stamp
from metaservice.db import normalise_url
from metaservice.lifecycle import service as lifecycle
from metaservice.reconcile.schemas import Stamp
from metaservice.reconcile.service import reconcile as reconcile_stamps
from metaservice.settings import Settings
from tests.conftest import START_MS, pg_base_url
from tests.metaservice.simulation import (
    ALL_CHECKS,
    INTERVAL_MS,
    Abandon,
    Advance,
    CatalogSession,
    ChangeInputs,
    ExpireNow,
    Expiry,
    Flush,
    Frontiers,
    JobDef,
    LateOutput,
    MoveOutput,
    Peek,
    Reconcile,
    Rejoin,
    Release,
    ReleaseGrant,
    Replace,
    Replay,
    Replicas,
    ReportIn,
    Reregister,
    ResetQuery,
    Retention,
    Revise,
    Run,
    RunRevision,
    Simulation,
    SkewedClock,
    Step,
    Swap,
    Tag,
    Tick,
    Topology,
    Version,
    schedules,
    topologies,
)
from tests.migrated import migrate_fresh, with_search_path

_EXAMPLES = int(os.environ.get("METASERVICE_PROPERTY_EXAMPLES", "0"))
_NO_SHRINK = os.environ.get("METASERVICE_PROPERTY_NO_SHRINK", "") not in ("", "0")


def _settings(examples: int):  # type: ignore[no-untyped-def]
    return settings(
        max_examples=_EXAMPLES or examples,
        # In CI (CI=true) the same examples on every run, so that a submission lands or
        # not on its own code; elsewhere new ones each run, to find the next fault.
        derandomize=os.environ.get("CI") == "true",
        # METASERVICE_PROPERTY_NO_SHRINK=1: report the first failing example as drawn.
        phases=[p for p in Phase if not (_NO_SHRINK and p == Phase.shrink)],
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )


# --------------------------------------------------------------------------- databases


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request) -> str:  # type: ignore[no-untyped-def]
    if request.param == "postgres" and pg_base_url() is None:
        pytest.skip("set METASERVICE_TEST_PG_URL to run the PostgreSQL tests")
    return request.param  # type: ignore[no-any-return]


@contextmanager
def _database(backend: str) -> Iterator[str]:
    """A fresh database, migrated to head, dropped afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="ms-prop-") as folder:
            url = f"sqlite:///{folder}/metaservice.db"
            migrate_fresh(url)
            yield url
        return
    base = pg_base_url()
    assert base is not None
    schema = "p_" + uuid.uuid4().hex[:12]
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        try:
            url = with_search_path(base, schema)
            migrate_fresh(url)
            yield url
        finally:
            with admin.connect() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    finally:
        admin.dispose()


def _rows(engine: Engine, names: list[str]) -> dict[str, list[tuple]]:
    """Every row of every table of the service's database (G3: a refused request
    changes none)."""
    with engine.connect() as conn:
        return {
            name: sorted(
                (tuple(r) for r in conn.execute(text(f'SELECT * FROM "{name}"'))), key=repr
            )
            for name in names
        }


def _reconciler(app: Any) -> Callable[[dict[str, list[dict]]], dict]:
    """``metaservice reconcile`` on the given stamps (what it reads from the tables'
    snapshot summaries), in the service's own write transaction."""
    s = app.state.services

    def run(stamps: dict[str, list[dict]]) -> dict:
        given = {t: [Stamp(**x) for x in xs] for t, xs in stamps.items()}
        report = s.db.write(lambda session: reconcile_stamps(session, s.ctx, given))
        return report.model_dump()  # type: ignore[no-any-return]

    return run


def _reserver(app: Any) -> Callable[[str], dict] | None:
    """An executor's expiry reservation, once the service has one (else None: G5 is
    checked on plans and leases only)."""
    reserve = getattr(lifecycle, "reserve_expiry", None)
    if reserve is None:
        return None
    s = app.state.services

    def run(table: str) -> dict:
        plan = s.db.write(lambda session: reserve(session, s.ctx, table))
        return plan.model_dump()  # type: ignore[no-any-return]

    return run


class _Lake:
    """The jobs' Iceberg tables in the service's catalog (its own database): each batch
    one stamped fast append of its rows (as many integers), as the sink commits it."""

    def __init__(self, url: str, warehouse: str, clock: ManualClock) -> None:
        from tests.metaservice.test_expiry import Lake

        self.catalog = open_catalog(url, warehouse)
        self.lake = Lake(self.catalog, report=lambda *_: None, ask=lambda *_: 0, clock=clock)

    def ensure(self, table: str) -> None:
        self.lake.table(table)

    def commit(self, table: str, job: str, batch_id: int, barrier: int, rows: Counter) -> int:
        stamp = encode_stamp(barrier, job, batch_id)
        written = self.lake.commit(table, stamp, barrier, list(range(rows.total())), False)
        return written.snapshot_id

    def close(self) -> None:
        self.catalog.engine.dispose()  # type: ignore[attr-defined]


def _advancer(apps: list[Any]) -> Callable[[str, int], Any]:
    """The per-slot advancer of each replica, as the Watermark / AdvanceIdle steps run it."""

    def run(part: str, replica: int) -> Any:
        services = apps[replica].state.services
        if part == "raise":
            return services.db.write(
                lambda session: watermark.raise_to_closed_slot(session, services.ctx)
            )
        return services.db.write(lambda session: advancer.advance_all(session, services.ctx))

    return run


@contextmanager
def simulated(
    backend: str,
    topology: Topology,
    checks: frozenset[str] = ALL_CHECKS,
    log: Callable[[str], None] = note,
    iceberg: bool = False,
    replicas: tuple[int, int] | None = None,
) -> Iterator[Simulation]:
    """The service on a fresh database and a manual clock, with the topology registered;
    the simulation's log goes to hypothesis' notes (``print`` outside hypothesis). With
    ``iceberg``, every batch is also committed to a real Iceberg table in the service's
    catalog (revisions make their mirrors from them). With ``replicas`` (skew, seed):
    two apps on the database, the second's clock ``skew`` ms off the first's, requests
    routed to either (drawn from ``seed``), no reader writing: the watermark is raised
    and idle jobs advanced by the advancer of a replica, as drawn steps."""
    with (
        _database(backend) as url,
        tempfile.TemporaryDirectory(prefix="ms-prop-wh-") as wh,
        ExitStack() as stack,
    ):
        clock = ManualClock(START_MS)
        engine = create_engine(normalise_url(url))
        lake = _Lake(url, wh, clock) if iceberg else None
        try:
            names = sorted(inspect(engine).get_table_names())
            options: dict[str, Any] = {"db_url": url, "warehouse": wh}
            options["revision_ready_lag_ms"] = 0
            clocks: list[Any] = [clock]
            extra: dict[str, Any] = {}
            if replicas is not None:
                options["idle_advance"] = "manual"
                clocks.append(SkewedClock(clock, replicas[0]))
            apps = [create_app(Settings(**options), c) for c in clocks]
            clients = [stack.enter_context(TestClient(a)) for a in apps]
            app, client = apps[0], clients[0]
            if replicas is not None:
                client = Replicas(clients, replicas[1])
                extra = {"advancer": _advancer(apps), "clocks": clocks}
            sim = Simulation(
                client,
                clock,
                topology,
                checks=checks,
                log=log,
                db_state=lambda: _rows(engine, names),
                reserve=_reserver(app),
                reconcile=_reconciler(app),
                lake=lake,
                **extra,
            )
            sim.register()
            yield sim
            if log is note:
                for name, count in sorted(sim.stats.items()):
                    event(f"{name}: {'some' if count else 'none'}")
        finally:
            engine.dispose()
            if lake is not None:
                lake.close()


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    topology: Topology
    steps: tuple[Step, ...]
    laggards: tuple[str, ...] = ()
    lag: int = 0

    def __repr__(self) -> str:
        lines = ["Scenario(", f"    {self.topology!r},", "    ("]
        lines += [f"        {step!r}," for step in self.steps]
        lines.append("    ),")
        for name in ("laggards", "lag"):
            value = getattr(self, name)
            if value:
                lines.append(f"    {name}={value!r},")
        return "\n".join([*lines, ")"])


@st.composite
def scenarios(  # type: ignore[no-untyped-def]
    draw,
    weights: dict[str, int],
    max_steps: int,
    min_steps: int = 0,
    max_sources: int = 3,
    max_derived: int = 4,
    max_lag: int = 0,
) -> Scenario:
    topology = draw(topologies(max_sources, max_derived))
    steps = draw(schedules(topology, weights, min_size=min_steps, max_size=max_steps))
    laggards: tuple[str, ...] = ()
    lag = 0
    if max_lag:
        names = [j.name for j in topology.derived]
        laggards = tuple(
            draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
        )
        lag = draw(st.integers(0, max_lag))
    return Scenario(topology, tuple(steps), laggards, lag)


def _table_sets(topology: Topology) -> list[tuple[str, ...]]:
    """All tables, each derived table with its inputs, and every pair of derived tables."""
    sets = [tuple(sorted(topology.tables))]
    for job in topology.derived:
        sets.append(tuple(sorted({job.output, *job.inputs})))
    for i, a in enumerate(topology.derived):
        for b in topology.derived[i + 1 :]:
            sets.append(tuple(sorted({a.output, b.output})))
    return list(dict.fromkeys(sets))


def play(
    backend: str,
    scenario: Scenario,
    iceberg: bool = False,
    replicas: tuple[int, int] | None = None,
) -> None:
    """Play the scenario, let every job finish what it started, and check every table
    set, every table's frontier, mapping (G3) and expiry plan (G5) on the way out
    (``replicas``: see :func:`simulated`)."""
    topology = scenario.topology
    note(repr(scenario))
    with simulated(backend, topology, iceberg=iceberg, replicas=replicas) as sim:
        for step in scenario.steps:
            sim.step(step)
        epilogue(sim)


def epilogue(sim: Simulation) -> None:
    topology = sim.topo
    sim.check_memo(after="the last step")
    sim.settle()
    sim.tick_advancer()  # (with replicas: readers write nothing, the advancer runs)
    sim.frontiers()
    for tables in _table_sets(topology):
        sim.version(tables)
    # Let every job run a couple of slots, then look at the whole topology again.
    for _ in range(2):
        sim.steady_step()
    sim.frontiers()
    sim.version(tuple(topology.tables))
    sim.settle()
    for table in topology.tables:
        # G3: each batch is recorded once, with the snapshot the table has for it.
        mapping = sim.state([table], job_fields=False)[table]["items"]
        # (deleted writers' batches show as job None: told apart by their barriers)
        batches = [(m["job"], m["batch_id"], m["job"] or m["barrier"]) for m in mapping]
        assert len(batches) == len(set(batches)), f"G3: {table} has a batch twice: {mapping}"
        snapshots = sim.tables[table].snapshots
        # (a swapped mirror's start is recorded as the service's own, under no batch)
        starts = {s.snapshot_id for s in snapshots if s.mirror_start}
        mine = sorted((s.batch_id, s.snapshot_id) for s in snapshots if not s.mirror_start)
        ids = [m["snapshot_id"] for m in mapping if m["snapshot_id"]]
        theirs = sorted(
            (m["batch_id"], m["snapshot_id"])
            for m in mapping
            if m["snapshot_id"] not in {None, *starts}
        )
        assert mine == theirs and starts <= set(ids), (
            f"G3: {table}: table has {mine} (and the mirror start {starts}), service maps {mapping}"
        )
    sim.apply(Expiry())
    sim.check_memo(after="the epilogue")


_S0 = JobDef("src0", "ods.s0")
_S1 = JobDef("src1", "ods.s1")
_D0 = JobDef("der0", "dw.d0", ("ods.s0",))
_D01 = JobDef("der0", "dw.d0", ("ods.s0", "ods.s1"))


# --------------------------------------------------------------------------- G1


G1_WEIGHTS = {
    "advance": 3,
    "long": 1,
    "run": 6,
    "tick": 2,
    "peek": 2,
    "replay": 1,
    "version": 6,
    "frontiers": 2,
    "flush": 2,
    "report_in": 2,
    "offline": 2,
    "skewed": 1,
    "release_grant": 1,
    "abandon": 1,
}


# A derived job reading a derived table that coalesced slots: it must end its batch
# on a barrier its derived input committed.
G1_TARGET_NOT_COMMITTED_UPSTREAM = Scenario(
    Topology((_S0, _D0, JobDef("der1", "dw.d1", ("dw.d0", "ods.s0")))),
    (
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        Run("der1"),
        Run("src0"),
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Run("src0"),
        Advance(4000),
        Run("der0"),
        Run("der1"),
    ),
)

# Two readers of one source whose first batches ended at different barriers: the
# consistent version of both is the older barrier only if the newer one committed it.
G1_FRONTIERS_NOT_COMMON = Scenario(
    Topology((_S0, _D0, JobDef("der1", "dw.d1", ("ods.s0",)))),
    (
        Run("src0", rows=2),
        Advance(2000),
        Run("src0", rows=2),
        Run("der1"),
        Advance(3000),
        Run("src0", rows=2),
        Run("der0"),
        Version(("dw.d0", "dw.d1")),
    ),
)

# A source job's report waits in its outbox while its next batch opens and crashes;
# delivering the first report must not move the frontier past the open batch.
G1_SOURCE_BATCH_STILL_OPEN = Scenario(
    Topology((_S0, _D0)),
    (
        Run("src0", fail="report_later"),
        Advance(1000),
        Run("src0", fail="before_commit"),
        Advance(2000),
        Flush(),
        Frontiers(),
        Run("der0"),
        Run("src0"),
        Run("der0"),
    ),
)

# A source job holding a grant goes offline: its batch asked online lost its answer,
# so it claims its own barrier; another batch commits offline; the derived job must
# not read past them before the claims arrive, and reads them after.
G1_OFFLINE_CLAIMS_ARRIVE_LATE = Scenario(
    Topology((_S0, _D0)),
    (
        ReportIn("src0"),
        Run("src0"),
        Advance(1000),
        ReportIn("src0"),
        Run("src0", fail="before_commit"),
        Advance(2000),
        Run("src0", fail="offline"),
        Advance(1000),
        Run("src0", rows=2, fail="offline"),
        ReportIn("src0"),
        Advance(3000),
        Run("der0"),
        Frontiers(),
        Version(("ods.s0", "dw.d0")),
        Flush(),
        ReportIn("src0"),
        Advance(1000),
        ReportIn("src0"),
        Run("der0"),
        Frontiers(),
        Version(("ods.s0", "dw.d0")),
        ReleaseGrant("src0"),
        Advance(1000),
        Frontiers(),
    ),
)

# s1_race: a two-input derived job's batch report lands between its two barrier
# sources' offset calls (and between their range reads): both sources end the batch
# at the same barrier and read up to it.
G1_REPORT_BETWEEN_SOURCES = Scenario(
    Topology((_S0, _S1, _D01)),
    (
        Run("src0", rows=2),
        Run("src1", rows=2),
        Advance(2000),
        Run("der0", fail="report_later"),
        Advance(1000),
        Run("src0"),
        Run("src1"),
        Advance(2000),
        Peek("der0"),
        Flush("der0"),
        Run("src0"),
        Advance(1000),
        Run("der0", mid="flush"),
        Version(("dw.d0", "ods.s0", "ods.s1")),
    ),
)

# s10_skew: one source job's clock runs 50 s ahead and it claims its barrier offline;
# the other source's barriers stay the service's slots, and so do readers' versions.
G1_SKEWED_CLAIM = Scenario(
    Topology(
        (
            _S0,
            _S1,
            JobDef("der0", "dw.d0", ("ods.s1",)),
            JobDef("der1", "dw.d1", ("ods.s0", "ods.s1")),
        )
    ),
    (
        ReportIn("src0"),
        Advance(1000),
        Run("src0", rows=2, fail="offline", ahead_ms=50_000),
        Flush(),
        Advance(5000),
        Run("src1"),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        Run("der1"),
        Version(("dw.d0", "ods.s1")),
        Frontiers(),
        Advance(60_000),
        Run("src0"),
        Run("src1"),
        Advance(1000),
        Run("der1"),
        Version(("dw.d1", "ods.s0", "ods.s1")),
    ),
)

# s12_dead: a source driver dies with its batch committed to Iceberg but not reported;
# an operator abandons the batch, readers move on, the late report is refused, and the
# restarted driver's replay lands past what readers took as complete.
G1_DEAD_DRIVER = Scenario(
    Topology((_S0, _D0)),
    (
        Run("src0"),
        Advance(1000),
        Run("src0", fail="after_commit"),
        Advance(30_000),
        Run("der0"),
        Abandon("src0"),
        Advance(2000),
        Run("der0"),
        Version(("dw.d0", "ods.s0")),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        Version(("dw.d0", "ods.s0")),
    ),
)


@pytest.mark.slow
@_settings(examples=10)
@given(scenario=scenarios(G1_WEIGHTS, min_steps=8, max_steps=30))
@example(scenario=G1_TARGET_NOT_COMMITTED_UPSTREAM)
@example(scenario=G1_FRONTIERS_NOT_COMMON)
@example(scenario=G1_SOURCE_BATCH_STILL_OPEN)
@example(scenario=G1_OFFLINE_CLAIMS_ARRIVE_LATE)
@example(scenario=G1_REPORT_BETWEEN_SOURCES)
@example(scenario=G1_SKEWED_CLAIM)
@example(scenario=G1_DEAD_DRIVER)
def test_g1_incremental_jobs_match_the_oracle(backend: str, scenario: Scenario) -> None:
    """Incremental derived jobs (each batch appends f of the ranges the service hands
    out), reports held back between a job's sources' calls, offline claims from clocks
    ahead, dead drivers' batches abandoned: every consistent version, every table at
    its frontier and every derived table at each barrier it commits holds exactly the
    source data up to that barrier (G2, G3 and G5 checked on the way)."""
    play(backend, scenario)


# --------------------------------------------------------------------------- job changes


CHANGE_WEIGHTS = {
    "advance": 3,
    "run": 6,
    "tick": 3,
    "peek": 1,
    "replay": 1,
    "version": 4,
    "lease": 1,
    "release": 1,
    "expiry": 1,
    "frontiers": 1,
    "flush": 1,
    "reregister": 5,
    "replace": 2,
    "abandon": 2,
    "reset_query": 2,
}

# s3_kind, s13_out: a derived job that has run is re-registered as a source job while
# its batch is open (refused, nothing changed); an added output is removed while a
# batch is open (refused) and after it (allowed).
CHANGES_WHILE_BATCHES_ARE_OPEN = Scenario(
    Topology((_S0, _D0, JobDef("der1", "dw.d1", ("dw.d0",)))),
    (
        Run("src0", rows=2),
        Advance(2000),
        Run("der0"),
        Reregister("src0", "add_output"),
        Run("src0", fail="report_later"),
        Reregister("src0", "drop_output"),
        Run("der0", fail="before_commit"),
        Reregister("der0", "kind"),
        Reregister("der0", "add_input"),
        Flush(),
        Reregister("src0", "drop_output"),
        Advance(3000),
        Run("src0"),
        Run("der0"),
        Run("der1"),
        Reregister("der1", "drop_input"),
        ResetQuery("der0"),
        ResetQuery("src0"),
        Version(("dw.d0", "dw.d1", "ods.s0")),
    ),
)

# s5_lease: a lease pins the table of a writer that is then replaced: plans must not
# fail, and the new writer's table starts afresh; its late reports are refused.
REPLACED_WRITER_UNDER_A_LEASE = Scenario(
    Topology((_S0, _D0)),
    (
        Run("src0", rows=2),
        Advance(2000),
        Run("der0"),
        Version(("dw.d0",), lease_s=30),
        Run("der0", fail="report_later"),
        Replace("der0", drain=False),
        Expiry(),
        Replace("src0"),
        Advance(1000),
        Run("src0"),
        Advance(2000),
        Run("der0"),
        Version(("dw.d0", "ods.s0")),
        Expiry(),
    ),
)


# An output added, a batch opened with it and abandoned, the output dropped (no batch is
# open any more): the late report to the dropped output is not the job's any more, and
# the replay of the batch reports to the job's outputs as they are now.
OUTPUT_DROPPED_AFTER_ABANDON = Scenario(
    Topology((_S0, _D0)),
    (
        Reregister("src0", "add_output"),
        Abandon("src0", written=True),
        Reregister("src0", "drop_output"),
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Run("der0"),
    ),
)


# A batch that wrote an added output finishes, the output is dropped, and Spark replays
# the batch: its reports were recorded before the drop, so sending them again is a
# duplicate (an outbox retry whose answer was lost looks the same), not a refusal.
FINISHED_BATCH_REPLAYED_AFTER_ITS_OUTPUT_DROPPED = Scenario(
    Topology((_S0, _D0)),
    (
        Reregister("src0", "add_output"),
        Run("src0"),
        Reregister("src0", "drop_output"),
        Replay("src0"),
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Run("der0"),
    ),
)


@pytest.mark.slow
@_settings(examples=10)
@given(scenario=scenarios(CHANGE_WEIGHTS, min_steps=10, max_steps=30))
@example(scenario=CHANGES_WHILE_BATCHES_ARE_OPEN)
@example(scenario=OUTPUT_DROPPED_AFTER_ABANDON)
@example(scenario=FINISHED_BATCH_REPLAYED_AFTER_ITS_OUTPUT_DROPPED)
def test_job_changes_never_break_consistency(backend: str, scenario: Scenario) -> None:
    """Re-registrations (same spec; kind or inputs changed: refused with nothing changed
    once the job has run; outputs added, and removed only between batches), writers of
    unread tables replaced (DELETE, then a new job taking the table with its history,
    starting above it; the old driver's late reports refused),
    reset Spark queries refused, dead drivers' batches abandoned: G1, G2, G3 and G5
    hold throughout."""
    play(backend, scenario)


# --------------------------------------------------------------------------- G2


G2_WEIGHTS = {
    "advance": 3,
    "long": 2,
    "run": 6,
    "tick": 3,
    "peek": 1,
    "version": 8,
    "flush": 1,
    "report_in": 1,
    "offline": 1,
    "skewed": 1,
    "abandon": 1,
}


@pytest.mark.slow
@_settings(examples=8)
@given(scenario=scenarios(G2_WEIGHTS, min_steps=10, max_steps=30))
def test_g2_versions_meet_the_alignment_bound_throughout(backend: str, scenario: Scenario) -> None:
    """Whatever the jobs do (stall, catch up over hundreds of slots, run out of phase,
    claim barriers ahead of the clock), every consistent version reaches the bound of
    ``aligned_target``: the largest multiple of P slots at or below the least frontier,
    P the longest recent batch of the members and their derived upstream rounded up to
    a power of two; and it never goes back."""
    play(backend, scenario)


@pytest.mark.slow
@_settings(examples=5)
@given(
    scenario=scenarios(
        {"advance": 4, "long": 1, "run": 8, "tick": 1, "peek": 1},
        max_steps=8,
        max_sources=2,
        max_derived=4,
        max_lag=300,
    )
)
def test_g2_versions_keep_up_and_catch_up_realigns(backend: str, scenario: Scenario) -> None:
    """After random progress and a phase in which some derived jobs stall for up to
    hundreds of slots while the rest keep up, every job runs every slot: within
    depth * (log2(lag) + 2) + 1 slots each table set has a consistent version at its
    least frontier (catch-up batches end on ever less aligned barriers, halving what is
    left of the lag, with no window), and from then on it advances every slot."""
    topology = scenario.topology
    note(repr(scenario))
    with simulated(backend, topology) as sim:
        for step in scenario.steps:
            sim.apply(step)
        sim.settle()
        sim.steady_step()  # every job has committed once: later batches are catch-up batches
        sim.clock.advance(scenario.lag * INTERVAL_MS)
        sim.steady_step(skip=scenario.laggards)
        fronts = sim.frontiers()
        lag_slots = (sim.now_slot() - INTERVAL_MS - min(fronts.values())) // INTERVAL_MS
        depth = max(topology.depth(t) for t in topology.tables)
        bound = depth * (math.ceil(math.log2(lag_slots + 1)) + 2) + 1
        sets = [tuple(topology.tables)] + [
            tuple(sorted({job.output, *job.inputs}))
            for job in topology.derived
            if job.name in scenario.laggards
        ]
        previous: dict[tuple[str, ...], dict | None] = {}
        converged_at: int | None = None
        slot = 0
        steady = 3  # slots checked after convergence
        while converged_at is None or slot <= converged_at + steady:
            if converged_at is None and slot > bound:
                raise AssertionError(
                    f"G2: with every job running every slot, the table sets {sets} did not all "
                    f"get a consistent version at their least frontier in {bound} slots (lag "
                    f"was {lag_slots} slots, depth {depth}); now: frontiers {fronts}, "
                    f"versions {previous}"
                )
            sim.steady_step()
            fronts = sim.frontiers()
            versions = {s: sim.version(s) for s in sets}
            note(f"catch-up slot {slot}: frontiers {fronts}, versions {versions}")
            at_least = {s: min(fronts[t] for t in s) for s in sets}
            trailing = all(
                v is not None and v["barrier"] >= at_least[s] for s, v in versions.items()
            )
            converged = trailing and min(fronts.values()) == sim.now_slot() - INTERVAL_MS
            if converged_at is not None:
                assert trailing, (
                    f"G2: steady since slot {converged_at}, but at slot {slot} a consistent "
                    f"version trails its least frontier: {fronts} {versions}"
                )
                for s in sets:
                    assert versions[s]["barrier"] > previous[s]["barrier"], (  # type: ignore[index]
                        f"G2: steady state, but the consistent version of {s} stayed at "
                        f"{versions[s]} at slot {slot}"
                    )
            elif converged:
                converged_at = slot
            previous = versions
            slot += 1
        event(f"lag {lag_slots} depth {depth}: aligned after {converged_at} slots")


@dataclass(frozen=True)
class Cadences:
    """Job i runs at the slots where (slot + phases[i]) % periods[i] == 0; a source job
    with period 0 never runs (idle: its tables advance with the clock)."""

    topology: Topology
    periods: tuple[int, ...]
    phases: tuple[int, ...]
    slots: int

    def runs(self, job: str, slot: int) -> bool:
        i = [j.name for j in self.topology.jobs].index(job)
        return self.periods[i] > 0 and (slot + self.phases[i]) % self.periods[i] == 0

    def next_event(self, slot: int) -> int:
        """The next slot after ``slot`` at which some job runs."""
        return min(
            slot + 1 + ((-(slot + 1 + phase)) % period)
            for period, phase in zip(self.periods, self.phases, strict=True)
            if period > 0
        )


@st.composite
def cadences(draw) -> Cadences:  # type: ignore[no-untyped-def]
    """Short periods (1-4 slots, 24 slots long) or long ones (batches of tens to hundreds
    of slots, out of phase, over a few of the longest periods)."""
    topology = draw(topologies(max_sources=2, max_derived=3))
    long = draw(st.booleans())
    choices = [7, 16, 50, 64, 100, 128, 200, 300] if long else [1, 2, 3, 4]
    periods = tuple(
        draw(st.sampled_from([*choices, 0] if job.is_source else choices)) for job in topology.jobs
    )
    phases = tuple(draw(st.integers(0, max(p - 1, 0))) for p in periods)
    slots = 4 * max(periods) if long else 24
    return Cadences(topology, periods, phases, slots)


# s2_align: two derived jobs batching 128 slots at a time, 64 slots out of phase.
OUT_OF_PHASE = Cadences(
    Topology((_S0, _D0, JobDef("der1", "dw.d1", ("ods.s0",)))),
    periods=(32, 128, 128),
    phases=(5, 0, 64),
    slots=4 * 128,
)

# s11_sim: a chain whose jobs take 70 to 300 slots per batch.
LONG_BATCHES = Cadences(
    Topology((_S0, _S1, _D01, JobDef("der1", "dw.d1", ("dw.d0", "ods.s1")))),
    periods=(16, 50, 200, 300),
    phases=(3, 7, 11, 150),
    slots=1200,
)

# Two jobs that run every 100 slots, one reading the other: each one's lag adds up.
SLOW_CHAIN = Cadences(
    Topology(
        (
            _S0,
            _S1,
            _D0,
            JobDef("der1", "dw.d1", ("ods.s0", "ods.s1")),
            JobDef("der2", "dw.d2", ("ods.s0", "dw.d1")),
        )
    ),
    periods=(7, 7, 7, 100, 100),
    phases=(0, 6, 1, 47, 96),
    slots=400,
)


@pytest.mark.slow
@_settings(examples=4)
@given(plan=cadences())
@example(plan=OUT_OF_PHASE)
@example(plan=LONG_BATCHES)
@example(plan=SLOW_CHAIN)
def test_g2_jobs_at_different_cadences_keep_a_common_exact_barrier(
    backend: str, plan: Cadences
) -> None:
    """Jobs that each run every p-th slot (p from 1 to 300) coalesce p slots per batch,
    out of phase. At every run the consistent version of all tables and of each job
    with its inputs meets the bound of ``aligned_target`` (G2, checked by the
    simulation) and never goes back; at the end it trails the last closed slot by less
    than twice the sum of the periods along the slowest chain of jobs, plus the depth:
    each job on the chain ran less than one of its periods ago, and its batch then
    ended less than one period below its inputs' frontier, on the most aligned barrier
    it could reach (a chain of two jobs that run every 100 slots trailed by 208 slots
    at the end of a 400-slot run; the bound of G2 itself is checked at every run)."""
    topology = plan.topology
    note(repr(plan))
    with simulated(backend, topology) as sim:
        idle = [j.name for j, p in zip(topology.jobs, plan.periods, strict=True) if p == 0]
        sim.steady_step(skip=idle)
        sets = _table_sets(topology)
        slot = 0
        while True:
            slot = plan.next_event(slot)
            if slot > plan.slots:
                break
            sim.clock.set(START_MS + (slot + 1) * INTERVAL_MS)
            for job in topology.jobs:
                if plan.runs(job.name, slot):
                    sim.run(job.name)
            sim.version(sets[0])
        for tables in sets:
            sim.version(tables)
        closed = sim.now_slot() - INTERVAL_MS
        final = sim.version(sets[0])
        assert final is not None, "G2: the consistent version of all tables disappeared"
        depth = max(topology.depth(t) for t in topology.tables)
        longest = max(plan.periods)
        trail = (closed - final["barrier"]) // INTERVAL_MS
        assert trail < 2 * _slowest_chain(plan) + depth + 2, (
            f"G2: the consistent version of all tables ({final}) trails the last closed slot "
            f"by {trail} slots with periods {plan.periods}"
        )
        event(f"longest period {'long' if longest > 4 else 'short'}: bound held")


def _slowest_chain(plan: Cadences) -> int:
    """The largest sum of the periods of the jobs on one path from a source to a table."""
    topology = plan.topology
    period = {j.name: p for j, p in zip(topology.jobs, plan.periods, strict=True)}

    def lag(table: str) -> int:
        writer = topology.writer(table)
        return period[writer.name] + max((lag(t) for t in writer.inputs), default=0)

    return max(lag(t) for t in topology.tables)


def catch_up(sim: Simulation, most: int = 60) -> None:
    """Sources stop ingesting; derived jobs run, a slot apart, until each has read every
    snapshot of its inputs (and at least once: a trigger of theirs is complete)."""
    for _ in range(most):
        sim.clock.advance(INTERVAL_MS)
        for job in sim.topo.derived:
            sim.run(job.name)  # a query that stopped in a trigger comes back once
        behind = [
            job.name
            for job in sim.topo.derived
            if sim.jobs[job.name].committed
            < max((s.barrier for t in job.inputs for s in sim.tables[t].reported()), default=0)
        ]
        if not behind:
            return
    raise AssertionError(f"derived jobs still behind their inputs after {most} slots")


# s12_dead and the stalls of DESIGN.md: a stopped derived job whose inputs did not
# change never holds a version back; a dead driver's open batch does until abandoned.
@pytest.mark.slow
@_settings(examples=5)
@given(
    scenario=scenarios(
        {
            "advance": 3,
            "run": 6,
            "tick": 3,
            "peek": 1,
            "version": 2,
            "offline": 1,
            "report_in": 1,
            "abandon": 1,
        },
        min_steps=5,
        max_steps=20,
    ),
    stopped=st.integers(20, 400),
    dead=st.booleans(),
)
def test_g2_idle_jobs_and_dead_drivers_never_hold_versions_back_for_good(
    backend: str, scenario: Scenario, stopped: int, dead: bool
) -> None:
    """After random progress, every job finishes what it started and stops (sources
    ingest nothing more); ``stopped`` slots later the consistent version of all tables
    reaches the last closed slot within log2(stopped) + depth + 2 requests: the service
    advances idle derived jobs itself. With ``dead``, a source driver first dies with an
    open batch: versions of its table stay below that batch until an operator abandons
    it, then catch up the same way."""
    topology = scenario.topology
    note(repr(scenario))
    with simulated(backend, topology) as sim:
        for step in scenario.steps:
            sim.apply(step)
        sim.settle()
        for job in topology.sources:
            sim.release_grant(job.name)
        catch_up(sim)
        everything = tuple(topology.tables)
        victim = topology.sources[0]
        if dead:
            sim.clock.advance(INTERVAL_MS)
            sim.run(victim.name, fail="after_commit")
            held = sim.jobs[victim.name].pending
            assert held is not None
        sim.clock.advance(stopped * INTERVAL_MS)
        if dead:
            for _ in range(3):
                v = sim.version(everything)
                assert v is None or v["barrier"] < held.barrier, (
                    f"a version {v} passed the dead driver's open batch at {held.barrier}"
                )
            sim.abandon(victim.name)
        depth = max(topology.depth(t) for t in topology.tables)
        closed = sim.now_slot() - INTERVAL_MS
        tries = math.ceil(math.log2(stopped + 1)) + depth + 2
        got = []
        for _ in range(tries):
            v = sim.version(everything)
            got.append(v["barrier"] if v else None)
            if v is not None and v["barrier"] >= closed:
                break
        else:
            raise AssertionError(
                f"G2: every job stopped with nothing left to read, but after {tries} requests "
                f"the consistent version of all tables is {got}, not the last closed slot "
                f"{closed}"
            )
        event(f"caught up after {len(got)} requests")
        if dead:
            sim.run(victim.name)  # the restarted driver replays its batch, past the version
            epilogue(sim)


def test_g2_a_job_stopped_after_its_sources_fixed_an_end_is_still_advanced(
    backend: str,
) -> None:
    """A derived job's query stops in a trigger: its barrier source got the end of the
    next batch (next-barrier fixed it), Spark never wrote the batch. None of its inputs
    changes afterwards, so by DESIGN.md ("Stalls", G2) the service advances it and it
    holds no version back; the plan it was handed must not stop that (a query coming
    back from its checkpoint asks for the same end, reads an empty range, and commits
    below the advanced frontier)."""
    topology = Topology((_S0, _D0, JobDef("der1", "dw.d1", ("dw.d0",))))
    with simulated(backend, topology, log=print) as sim:
        sim.run("src0", rows=2)
        sim.clock.advance(2 * INTERVAL_MS)
        sim.run("der0")
        sim.run("der1")
        sim.clock.advance(INTERVAL_MS)
        assert sim.run("der0", fail="before_plan") == "crashed before planning"
        committed = sim.jobs["der0"].committed
        sim.clock.advance(200 * INTERVAL_MS)
        closed = sim.now_slot() - INTERVAL_MS
        got = [sim.version(("dw.d0", "dw.d1", "ods.s0")) for _ in range(12)]
        barriers = [v["barrier"] if v else None for v in got]
        assert barriers[-1] == closed, (
            f"G2: der0 stopped with its last end fixed after {committed}; nothing changed in "
            f"its input since, yet 200 slots later the consistent versions of all tables are "
            f"{barriers}, not the last closed slot {closed}"
        )
        sim.run("der0")  # the query comes back: the planned batch reads nothing new
        sim.run("der1")
        epilogue(sim)


def test_g2_a_skewed_claim_puts_no_frontier_and_no_other_jobs_barrier_in_the_future(
    backend: str,
) -> None:
    """s10_skew, one step further: a source job claims a barrier 50 s ahead of the
    service's clock (its machine's clock runs fast), delivers it, releases its grant
    (a clean stop) and restarts; its next batch, online, rightly follows its own newest
    barrier. While that batch is open, its table's frontier must still be a slot that
    is over, the consistent version of it must not go back once the batch commits, and
    a derived job reading it must get no barrier ahead of the clock ("one job's clock
    skew never moves another job's barriers")."""
    topology = Topology((_S0, _S1, _D0))
    with simulated(backend, topology, log=print) as sim:
        for step in (
            ReportIn("src0"),
            Advance(1000),
            Run("src0", rows=2, fail="offline", ahead_ms=50_000),
            ReleaseGrant("src0"),  # delivers the claim and the report first
            Advance(1000),
            Run("src0", fail="report_later"),  # open at its own newest barrier
            Run("src1"),
        ):
            sim.apply(step)
        ahead = sim.jobs["src0"].newest[1]  # type: ignore[index]
        now = sim.now_slot()
        assert ahead >= now + 40 * INTERVAL_MS
        table = sim.call("GET", "/tables/ods.s0", {200}).json()
        first = sim.call(
            "GET", "/versions/consistent", {200, 409}, params={"tables": "ods.s0"}
        ).json()
        planned = sim.call(
            "GET", "/jobs/der0/next-barrier", {200}, params={"after": 0, "source": "ods.s0"}
        ).json()
        sim.apply(Flush())
        later = sim.call(
            "GET", "/versions/consistent", {200, 409}, params={"tables": "ods.s0"}
        ).json()
        problems = []
        if table["frontier"] >= now:
            problems.append(f"frontier of ods.s0 at {table['frontier']}, clock slot {now}")
        if planned["barrier"] >= now:
            problems.append(f"der0's next batch ends at {planned['barrier']}, clock slot {now}")
        if "barrier" in first and later.get("barrier", 0) < first["barrier"]:
            problems.append(
                f"consistent version of ods.s0 went back from {first['barrier']} to {later}"
            )
        assert not problems, "G2: " + "; ".join(problems)
        sim.run("der0")
        epilogue(sim)


def test_g2_a_skewed_jobs_abandoned_batch_moves_no_other_jobs_barrier(backend: str) -> None:
    """A source job claims a barrier 37 s ahead of the service's clock; its next batch,
    online, follows it (its own newest barrier) and its driver dies before committing.
    An operator abandons the batch; the restarted driver's replay gets a new barrier,
    again its own. Another source job's next batch must still get the service's
    current slot."""
    topology = Topology((_S0, _S1, JobDef("der0", "dw.d0", ("ods.s0", "ods.s1"))))
    with simulated(backend, topology, log=print) as sim:
        for step in (
            Run("src1", rows=0, fail="offline", ahead_ms=37_000),
            Flush(),
            Run("src1", fail="before_commit"),
            Abandon("src1"),
            Run("src1"),
            Run("src0"),  # asserts: the current slot, not src1's barrier
            Advance(40_000),
        ):
            sim.apply(step)
        epilogue(sim)


# --------------------------------------------------------------------------- G3


G3_WEIGHTS = {
    "advance": 3,
    "run": 6,
    "tick": 2,
    "peek": 1,
    "replay": 3,
    "duplicate": 3,
    "conflict": 3,
    "flush": 1,
    "offline": 1,
    "report_in": 1,
    "reset_query": 1,
    "abandon": 1,
}


@pytest.mark.slow
@_settings(examples=8)
@given(scenario=scenarios(G3_WEIGHTS, min_steps=10, max_steps=30))
def test_g3_replays_and_reports_are_exactly_once(backend: str, scenario: Scenario) -> None:
    """Replayed batches (open or finished) get the same barrier and input ranges;
    duplicate reports answer 'duplicate' and change nothing; conflicting reports, alone
    or inside a batch with valid ones, batches Spark planned otherwise, reset queries
    and late reports of abandoned batches are refused and change no row; at the end
    each table maps each batch once, to the snapshot it holds for it."""
    play(backend, scenario)


# --------------------------------------------------------------------------- G5


G5_WEIGHTS = {
    "advance": 2,
    "run": 4,
    "tick": 4,
    "peek": 1,
    "version": 2,
    "lease": 4,
    "catalog_session": 2,
    "release": 2,
    "expiry": 4,
    "flush": 1,
    "replace": 1,
}

# s6_plan: a plan lists old snapshots, then a lease is asked for a version that names
# one of them.
LEASE_AFTER_PLAN = Scenario(
    Topology((_S0, _D0)),
    (
        Run("src0"),
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        Expiry("ods.s0", reserve=True),
        Version(("ods.s0",), back_ms=3000, lease_s=30, post=True),
        Expiry("ods.s0"),
        Release(0),
        Expiry("ods.s0", reserve=True),
    ),
)


# A catalog session's one lease of all tables keeps what it reads out of reservations
# until it is released; one on at: reads an older version.
CATALOG_SESSION_AND_RESERVATIONS = Scenario(
    Topology((_S0, _D0)),
    (
        Run("src0"),
        Advance(1000),
        Run("der0"),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        CatalogSession(),
        CatalogSession(back_ms=1000),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        Expiry(reserve=True),
        Release(0),
        Expiry(reserve=True),
        Release(0),
        Expiry(reserve=True),
    ),
)


@pytest.mark.slow
@_settings(examples=8)
@given(scenario=scenarios(G5_WEIGHTS, min_steps=10, max_steps=35))
@example(scenario=LEASE_AFTER_PLAN)
@example(scenario=CATALOG_SESSION_AND_RESERVATIONS)
def test_g5_plans_and_leases_never_meet_on_a_snapshot(backend: str, scenario: Scenario) -> None:
    """Leases interleaved with plans (and reservations): no plan lists the current
    snapshot, a snapshot of a live lease, or the start of a reader's next batch (from
    the simulator's own records); no version or lease names a reserved snapshot."""
    topology = scenario.topology
    note(repr(scenario))
    with simulated(backend, topology) as sim:
        for step in scenario.steps:
            sim.apply(step)
        sim.apply(Expiry())
        # Pin a version of everything, let every job move past it, and look again: the
        # leased snapshots are now older than every reader's start.
        everything = tuple(topology.tables)
        sim.settle()
        sim.steady_step()
        leased = sim.version(everything, lease_seconds=60)
        for _ in range(2):
            sim.steady_step()
        sim.apply(Expiry())
        if leased is not None:
            event("a lease pins snapshots older than every reader's start")
            sim.apply(Release(0))
            sim.apply(Expiry(reserve=True))
        epilogue(sim)


# --------------------------------------------------------------------------- state changes


STATE_CHANGE_WEIGHTS = {
    "advance": 3,
    "run": 6,
    "tick": 3,
    "peek": 1,
    "version": 5,
    "version_x": 2,
    "lease": 1,
    "expiry": 1,
    "retention": 1,
    "flush": 1,
    "report_in": 1,
    "abandon": 2,
    "reclaim": 1,
    "reconcile": 2,
    "reregister": 1,
    "late_output": 2,
    "move_output": 2,
    "change_inputs": 2,
    "rejoin": 2,
    "replace": 1,
    "replace_derived": 1,
    "catalog_session": 1,
}

# s13_out's sibling: an output is added while a batch is open, and a report of that
# batch arrives for it (as after a finished batch): refused, nothing changed.
OUTPUT_ADDED_MID_BATCH = Scenario(
    Topology((_S0, _D0)),
    (
        Run("src0"),
        Advance(1000),
        Run("der0"),
        LateOutput("der0", done=True),
        Advance(1000),
        Run("src0", fail="after_commit"),
        LateOutput("src0"),
        Run("src0"),
        Advance(1000),
        Run("der0"),
    ),
)

# An added output moves to another job between batches: versions of it handed out
# before stay, and its new writer never stamps it at or below what it holds.
OUTPUT_MOVED = Scenario(
    Topology((_S0, _D0)),
    (
        Reregister("src0", "add_output"),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        Advance(1000),
        Version(("ods.s0", "ods.s0_x")),
        MoveOutput("src0"),
        Run("src0"),
        Run("der0"),
        Advance(1000),
        Run("src0"),
        Run("der0"),
        Version(("ods.s0", "ods.s0_x")),
    ),
)

# s4_inputs, before the first commit: der0's source planned an end on ods.s0 alone, then
# der0 also reads ods.s1, whose batch is still open: the plan must go with the old inputs.
INPUTS_CHANGED_AFTER_A_PLAN = Scenario(
    Topology((_S0, _S1, JobDef("der0", "dw.d0", ("ods.s0",)))),
    (
        Run("src0"),
        Run("src1"),
        Advance(1000),
        Run("src1", fail="after_commit"),
        Advance(2000),
        Run("src0"),
        Advance(1000),
        ChangeInputs("der0", "add_input"),
        Run("der0"),
        Version(("dw.d0", "ods.s0", "ods.s1")),
        Run("src1"),
        Advance(1000),
        Run("der0"),
        Version(("dw.d0", "ods.s0", "ods.s1")),
    ),
)

# n1: a source job deleted and registered again: the versions of its table handed out
# before are answered again, unchanged.
SOURCE_DELETED_AND_REGISTERED_AGAIN = Scenario(
    Topology((_S0, _S1, JobDef("der0", "dw.d0", ("ods.s1",)))),
    (
        Run("src0"),
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Version(("ods.s0",)),
        Version(("ods.s0", "ods.s1")),
        Rejoin("src0"),
        Run("src0"),
        Advance(1000),
        Rejoin("src0", rename=True),
        Run("src0"),
        Advance(1000),
        Version(("ods.s0",)),
    ),
)

# f6: an abandoned source batch is replayed offline: its claim is refused, or accepted
# and then so is its commit (never a claim accepted and a commit refused: a lost batch).
ABANDONED_BATCH_CLAIMED_OFFLINE = Scenario(
    Topology((_S0, _D0)),
    (
        ReportIn("src0"),
        Run("src0"),
        Advance(1000),
        Run("src0", fail="before_commit"),
        Advance(3000),
        Abandon("src0"),
        ReportIn("src0"),
        Advance(1000),
        Run("src0", fail="offline", ahead_ms=1000),
        Advance(1000),
        Run("der0"),
        Version(("dw.d0", "ods.s0")),
    ),
)

# f2: `metaservice reconcile` finds a dead driver's commit of an abandoned batch in the
# table: the fence holds (the version handed out stays, the batch is not completed again).
RECONCILE_AFTER_AN_ABANDON = Scenario(
    Topology((_S0, _D0)),
    (
        Run("src0"),
        Advance(1000),
        Run("src0", fail="after_commit"),
        Advance(3000),
        Abandon("src0", written=True),
        Run("der0"),
        Version(("dw.d0", "ods.s0")),
        Reconcile(),
        Version(("dw.d0", "ods.s0")),
        Advance(2000),
        Version(("ods.s0",)),
        Run("src0"),
        Advance(5000),
        Version(("ods.s0",)),
        Run("der0"),
    ),
)


# Found by the state-change schedules once catalog sessions were drawn among them: a
# derived job that has not run, writing dw.d0, takes on a table with a history (its
# writer src2 sealed it to T0). Registration moved the job's frontier to that history,
# so its first batch started after T0 and dw.d0 never got ods.s0's rows up to T0, while
# versions at T0 named dw.d0 as exact (G1); starting lower instead would write them into
# the table taken on a second time. The take-over is refused now (409 history_gap):
# every output of a derived job taking on a history must have that history.
TAKE_OVER_BY_A_DERIVED_JOB_WITH_INPUT_CHANGES = Scenario(
    Topology((_S0, JobDef("src2", "ods.s2"), _D0)),
    (Run("src0", rows=2), Tick(()), MoveOutput("src2"), Peek("der0"), Run("der0")),
)


@_settings(examples=1)
@given(scenario=st.just(TAKE_OVER_BY_A_DERIVED_JOB_WITH_INPUT_CHANGES))
def test_a_derived_job_taking_on_a_table_keeps_its_inputs_changes(
    backend: str, scenario: Scenario
) -> None:
    play(backend, scenario)


@pytest.mark.slow
@_settings(examples=6)
@given(scenario=scenarios(STATE_CHANGE_WEIGHTS, min_steps=10, max_steps=25))
def test_every_state_change_keeps_every_answer(backend: str, scenario: Scenario) -> None:
    """Every state change drawn between batches (outputs added mid-batch, removed and
    moved between jobs; inputs of never-run jobs changed; source jobs deleted and
    registered again; abandons followed by offline claims, zombie commits and
    ``reconcile``; retention, leases, expiry plans): after every step the answers
    already given (each consistent version, by tables and at_or_before) are asked for
    again and must come back unchanged, the latest version of a set never goes back,
    and G1's oracle holds; an edit the service refuses (409) changes nothing."""
    play(backend, scenario)


# The G1 and the state-change schedules, with the advancer's steps drawn among them.
# (Not Reconcile: with an offline claim's report still in the outbox it trips the
# simulator on one replica too, on main as well: its report comes back "duplicate".)
REPLICA_WEIGHTS = [
    {**{k: w for k, w in weights.items() if k != "reconcile"}, "frontiers": 2}
    | {"watermark": 4, "advance_idle": 3}
    for weights in (G1_WEIGHTS, STATE_CHANGE_WEIGHTS)
]
# How far the second replica's clock is off the first's: within a slot, and by slots.
SKEWS = st.sampled_from([0, 1, -1, 400, -400, 999, -999, 1000, -1000, 2500, -2500, 4200])


@pytest.mark.slow
@_settings(examples=12)
@given(
    scenario=st.sampled_from(REPLICA_WEIGHTS).flatmap(
        lambda weights: scenarios(weights, min_steps=12, max_steps=30)
    ),
    skew=SKEWS,
    seed=st.integers(0, 2**16),
)
def test_two_replicas_with_skewed_clocks_keep_every_answer(
    backend: str, scenario: Scenario, skew: int, seed: int
) -> None:
    """Reads that never write, on two replicas of one database whose clocks differ by a
    drawn skew, each request routed to either: the watermark S is raised (on either
    replica, by its own clock) and idle derived jobs advanced only as drawn steps, and
    consistent versions read in between still hold G1's oracle, never change when asked
    again and never go back (whichever replica answers); G2's bound is checked on the
    reads made right after the advancer ran; a source barrier lies above S, and within
    the replicas' slots."""
    note(f"skew {skew} ms, routing seed {seed}")
    play(backend, scenario, replicas=(skew, seed))


REVISION_WEIGHTS = {
    "advance": 2,
    "run": 4,
    "tick": 4,
    "version": 4,
    "lease": 1,
    "catalog_session": 1,
    "expiry": 1,
    "revise": 2,
    "run_revision": 5,
    "swap": 2,
    "cancel_revision": 1,
    "late_output": 1,
    "move_output": 1,
    "change_inputs": 2,
    "flush": 1,
}

_D1 = JobDef("der1", "dw.d1", ("ods.s0",))

# f5: the revision job catches up in aligned batches; at the swap the version of the
# revised table with an unaffected one must not go back.
SWAP_WITH_AN_UNAFFECTED_TABLE = Scenario(
    Topology((_S0, _D0, _D1)),
    (
        *[Tick(("src0", "der0", "der1"))] * 3,
        Version(("dw.d0", "dw.d1")),
        Revise("dw.d0"),
        *[Tick(("src0", "der0", "der1"))] * 9,
        Advance(1000),
        *[RunRevision()] * 5,
        Version(("dw.d0", "dw.d1")),
        Swap(),
        Version(("dw.d0", "dw.d1")),
        RunRevision(),
        Swap(),
        Version(("dw.d0", "dw.d1")),
    ),
)

# f3: a reader of the revised table registered (its inputs changed before it ever
# committed) while the revision runs: refused, or taken into the revision; never left
# reading the replaced table.
READER_ADDED_DURING_A_REVISION = Scenario(
    Topology((_S0, _D0, _D1)),
    (
        Tick(("src0", "der0")),
        Tick(("src0", "der0")),
        Revise("dw.d0"),
        ChangeInputs("der1", "add_input"),
        Tick(("src0", "der0", "der1")),
        RunRevision(),
        Advance(1000),
        RunRevision(),
        Swap(),
        RunRevision(),
        Swap(),
        Tick(("src0", "der0", "der1")),
        Version(("dw.d0", "dw.d1")),
    ),
)

# f3b: an output added to a revised job while the revision runs.
OUTPUT_ADDED_DURING_A_REVISION = Scenario(
    Topology((_S0, _D0)),
    (
        Tick(("src0", "der0")),
        Tick(("src0", "der0")),
        Revise("dw.d0"),
        MoveOutput("src0"),
        Tick(("src0", "der0")),
        RunRevision(),
        Swap(),
        RunRevision(),
        Swap(),
        Tick(("src0", "der0")),
        Version(("dw.d0", "ods.s0_x")),
    ),
)

# f8: the revision job's report waits in its outbox across the swap: it still lands.
SWAP_WITH_A_REVISION_REPORT_QUEUED = Scenario(
    Topology((_S0, _D0)),
    (
        Tick(("src0", "der0")),
        Tick(("src0", "der0")),
        Revise("dw.d0"),
        Tick(("src0", "der0")),
        RunRevision(),
        Tick(("src0",)),
        RunRevision(fail="report_later"),
        Swap(),
        Flush(),
        RunRevision(),
        Swap(),
        Flush(),
        Tick(("src0", "der0")),
        Version(("dw.d0", "ods.s0")),
    ),
)


@pytest.mark.slow
@_settings(examples=3)
@given(scenario=scenarios(REVISION_WEIGHTS, min_steps=10, max_steps=25, max_derived=3))
def test_revisions_keep_every_answer(backend: str, scenario: Scenario) -> None:
    """Revisions (on real Iceberg tables in the default catalog) created, run, swapped
    and cancelled, with readers and outputs added and versions asked for meanwhile: the
    mirrors start at their originals' snapshots at the barrier, revision jobs' batches
    match the oracle, answers given are answered again unchanged (those naming a
    revised table until its swap), no version goes back at the swap, a report queued
    across the swap lands, and a refused step changes nothing."""
    play(backend, scenario, iceberg=True)


LIFECYCLE_WEIGHTS = {
    "advance": 3,
    "run": 4,
    "tick": 4,
    "version": 3,
    "lease": 2,
    "catalog_session": 2,
    "release": 1,
    "expiry": 1,
    "expire_now": 3,
    "tag": 2,
    "drop_tag": 1,
    "retention": 2,
    "revise": 1,
    "run_revision": 3,
    "swap": 1,
}

# f1 (lifecycle): a tag that has ended still holds its Iceberg tag: the dry run and the
# run that follows it must agree on what goes.
EXPIRY_AFTER_A_TAG_ENDED = Scenario(
    Topology((_S0, _D0)),
    (
        Run("src0"),
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Tag(("ods.s0",), retain_s=5),
        Run("src0"),
        Advance(1000),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        Advance(10_000),
        Run("src0"),
        Advance(1000),
        Run("der0"),
        ExpireNow("ods.s0"),
        Version(("dw.d0", "ods.s0")),
    ),
)

# f3 (lifecycle): a table's retention follows its name through a swap.
RETENTION_ACROSS_A_SWAP = Scenario(
    Topology((_S0, _D0)),
    (
        Retention("dw.d0", keep_last=3),
        *[Tick(("src0", "der0"))] * 3,
        Revise("dw.d0"),
        *[Tick(("src0", "der0")), RunRevision()] * 3,
        Swap(),
        RunRevision(),
        Swap(),
        *[Tick(("src0", "der0"))] * 4,
        Expiry("dw.d0"),
        ExpireNow("dw.d0"),
    ),
)


@pytest.mark.slow
@_settings(examples=3)
@given(scenario=scenarios(LIFECYCLE_WEIGHTS, min_steps=10, max_steps=25, max_derived=3))
def test_expiry_tags_and_retention_keep_every_answer(backend: str, scenario: Scenario) -> None:
    """Snapshots expired for real (after a dry run that must list exactly what the run
    removes), tags published and dropped, retention set, leases taken, revisions swapped,
    on real Iceberg tables: nothing in use is expired (current, leased, a reader's
    start, retained, tagged), no version, lease or tag names an expired snapshot, a tag
    is the consistent version, and every answer given is answered again unchanged
    unless a snapshot it named was expired since."""
    play(backend, scenario, iceberg=True)


# `reconcile` records an offline batch from its stamp before its claim is delivered: the
# claim is then answered at its barrier and its report is a duplicate (the model had
# expected the report to record it).
RECONCILE_BEFORE_AN_OFFLINE_CLAIM = Scenario(
    Topology((_S0, JobDef("src1", "ods.s1"), _D0)),
    (
        Run("src1", fail="offline", ahead_ms=1000),
        Abandon("src0", written=True),
        Advance(1000),
        Run("der0", rows=2),
        Reconcile(),
        Run("der0", rows=0, fail="before_commit", mid="flush"),
    ),
)


# Found by the state-change schedules: `reconcile` after a source job was deleted and
# registered again met the former job's commits (kept by the table, their job id gone)
# and looked the job up by a null id; they are reported as present now.
REJOIN_AFTER_RECONCILE = Scenario(
    Topology((_S0, _S1, JobDef("der0", "dw.d0", ("ods.s1",)))),
    (Run("src0"), Reconcile(), Tick(()), Rejoin("src0"), Reconcile()),
)

# Found by the same schedules: an output moved to a job that never ran, from one whose
# frontier reached the current slot (taken over from its former registration). The job
# taking it starts above its history, so all its outputs' frontiers are in that slot:
# the history it took on, which nothing can add to (the simulator held only the table).
MOVE_AFTER_REJOIN = Scenario(
    Topology((_S0, _S1, JobDef("der0", "dw.d0", ("ods.s1",)))),
    (Run("src0"), Reconcile(), Rejoin("src0"), MoveOutput("src0")),
)


# Each state change's own scenario (above), once per database: the operation that finds
# the fault it is named after (they failed on the code before the fixes).
STATE_CHANGE_SCENARIOS = [
    pytest.param(REPLACED_WRITER_UNDER_A_LEASE, False, id="replaced_writer_under_a_lease"),
    pytest.param(OUTPUT_ADDED_MID_BATCH, False, id="output_added_mid_batch"),
    pytest.param(OUTPUT_MOVED, False, id="output_moved"),
    pytest.param(INPUTS_CHANGED_AFTER_A_PLAN, False, id="inputs_changed_after_a_plan"),
    pytest.param(SOURCE_DELETED_AND_REGISTERED_AGAIN, False, id="source_deleted_and_registered"),
    pytest.param(ABANDONED_BATCH_CLAIMED_OFFLINE, False, id="abandoned_batch_claimed_offline"),
    pytest.param(RECONCILE_AFTER_AN_ABANDON, False, id="reconcile_after_an_abandon"),
    pytest.param(RECONCILE_BEFORE_AN_OFFLINE_CLAIM, False, id="reconcile_before_an_offline_claim"),
    pytest.param(SWAP_WITH_AN_UNAFFECTED_TABLE, True, id="swap_with_an_unaffected_table"),
    pytest.param(READER_ADDED_DURING_A_REVISION, True, id="reader_added_during_a_revision"),
    pytest.param(OUTPUT_ADDED_DURING_A_REVISION, True, id="output_added_during_a_revision"),
    pytest.param(SWAP_WITH_A_REVISION_REPORT_QUEUED, True, id="swap_with_a_report_queued"),
    pytest.param(EXPIRY_AFTER_A_TAG_ENDED, True, id="expiry_after_a_tag_ended"),
    pytest.param(RETENTION_ACROSS_A_SWAP, True, id="retention_across_a_swap"),
    pytest.param(REJOIN_AFTER_RECONCILE, False, id="rejoin_after_reconcile"),
    pytest.param(MOVE_AFTER_REJOIN, False, id="move_after_rejoin"),
]


@pytest.mark.parametrize(("scenario", "iceberg"), STATE_CHANGE_SCENARIOS)
def test_state_change_keeps_every_answer(backend: str, scenario: Scenario, iceberg: bool) -> None:
    """One state change at a time (the sequence that showed each fault), with every
    answer given asked for again after each step and the epilogue's checks."""
    with simulated(backend, scenario.topology, log=print, iceberg=iceberg) as sim:
        for step in scenario.steps:
            print(f"step {step!r}: {sim.step(step)}")
        epilogue(sim)
