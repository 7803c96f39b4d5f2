"""Property tests of the model (G1, G2, G3, G5) without Spark.

Hypothesis draws a random ETL topology and a random schedule of job turns, clock
moves, crashes, replays, duplicate and conflicting reports, consistent-version
and expiry-plan requests; ``simulation.Simulation`` plays it against the real
service (in-process ASGI app, real SQLite or PostgreSQL database, ManualClock)
and checks every answer against its own records and an oracle that recomputes
each table from the source rows. Each example gets a fresh, migrated database.

Set METASERVICE_PROPERTY_EXAMPLES=N to run N examples per test (deeper runs).
"""

from __future__ import annotations

import math
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.migrate import upgrade
from metaservice.settings import Settings
from tests.conftest import START_MS, _with_search_path, pg_base_url
from tests.metaservice.simulation import (
    G1,
    G3,
    G5,
    INTERVAL_MS,
    Advance,
    Expiry,
    Flush,
    Frontiers,
    JobDef,
    Release,
    ReleaseGrant,
    ReportIn,
    Run,
    Simulation,
    Step,
    Topology,
    Version,
    schedules,
    topologies,
)

_EXAMPLES = int(os.environ.get("METASERVICE_PROPERTY_EXAMPLES", "0"))


def _settings(examples: int):  # type: ignore[no-untyped-def]
    return settings(
        max_examples=_EXAMPLES or examples,
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
            upgrade(url)
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
            url = _with_search_path(base, schema)
            upgrade(url)
            yield url
        finally:
            with admin.connect() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    finally:
        admin.dispose()


@contextmanager
def simulated(
    backend: str, topology: Topology, checks: set[str], window: int | None = None
) -> Iterator[Simulation]:
    """The service on a fresh database and a manual clock, with the topology registered.
    ``window``: the service's catch-up window (slots a lagging derived job takes per batch)."""
    with _database(backend) as url:
        clock = ManualClock(START_MS)
        config = Settings(db_url=url)
        if window is not None:
            config = Settings(db_url=url, catchup_window_slots=window)
        with TestClient(create_app(config, clock)) as client:
            sim = Simulation(client, clock, topology, checks=checks, log=note)
            sim.register()
            yield sim
            for name, count in sorted(sim.stats.items()):
                event(f"{name}: {'some' if count else 'none'}")


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    topology: Topology
    steps: tuple[Step, ...]
    laggards: tuple[str, ...] = ()
    lag: int = 0
    window: int | None = None

    def __repr__(self) -> str:
        lines = ["Scenario(", f"    {self.topology!r},", "    ("]
        lines += [f"        {step!r}," for step in self.steps]
        lines.append("    ),")
        for name in ("laggards", "lag", "window"):
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
    windows: tuple[int, ...] = (),
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
    # A small catch-up window makes lagging jobs coalesce less than the lag, so their
    # targets are not always barriers their derived inputs committed.
    window = draw(st.sampled_from(windows)) if windows else None
    return Scenario(topology, tuple(steps), laggards, lag, window)


def _table_sets(topology: Topology) -> list[tuple[str, ...]]:
    """All tables, and each derived table with its inputs' writers' outputs."""
    sets = [tuple(topology.tables)]
    for job in topology.derived:
        sets.append(tuple(sorted({job.output, *job.inputs})))
    return list(dict.fromkeys(sets))


# --------------------------------------------------------------------------- G1


G1_WEIGHTS = {
    "advance": 3,
    "run": 6,
    "tick": 2,
    "peek": 1,
    "replay": 1,
    "version": 6,
    "frontiers": 3,
    "flush": 1,
    "report_in": 2,
    "offline": 2,
    "release_grant": 1,
}


_S0 = JobDef("src0", "ods.s0")
_D0 = JobDef("der0", "dw.d0", ("ods.s0",))

# A lagging reader of a derived table, with a catch-up window that is not a power of
# two: der1's most aligned barrier within reach (slot 4) is one der0 coalesced over
# (it went 1 -> 6), so der1 must pick a barrier der0 committed (6) instead.
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
    window=3,
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


# A silent source job with a grant: the clock moves on while its offline batch's
# claim waits in the outbox; the derived job must not read past the job's floor.
G1_OFFLINE_SOURCE_SILENT = Scenario(
    Topology((_S0, _D0)),
    (
        ReportIn("src0"),
        Run("src0"),
        Advance(1000),
        ReportIn("src0"),
        Run("src0", fail="offline"),
        Advance(3000),
        Run("der0"),
        Frontiers(),
        Version(("ods.s0", "dw.d0")),
        Flush(),
        Advance(1000),
        ReportIn("src0"),
        Run("der0"),
        Version(("ods.s0", "dw.d0")),
    ),
)


@pytest.mark.slow
@_settings(examples=12)
@given(scenario=scenarios(G1_WEIGHTS, min_steps=8, max_steps=30, windows=(64, 3, 5, 2)))
@example(scenario=G1_TARGET_NOT_COMMITTED_UPSTREAM)
@example(scenario=G1_FRONTIERS_NOT_COMMON)
@example(scenario=G1_SOURCE_BATCH_STILL_OPEN)
@example(scenario=G1_OFFLINE_CLAIMS_ARRIVE_LATE)
@example(scenario=G1_OFFLINE_SOURCE_SILENT)
def test_g1_consistent_versions_equal_the_oracle(backend: str, scenario: Scenario) -> None:
    """Every consistent version (with or without at_or_before and leases), every
    table at its frontier, and every derived table at each barrier it commits holds
    exactly the source data up to that barrier."""
    topology = scenario.topology
    note(repr(scenario))
    with simulated(backend, topology, {G1}, scenario.window) as sim:
        for step in scenario.steps:
            sim.apply(step)
        sim.frontiers()
        # Tables at different frontiers: every pair of derived tables, with their inputs.
        for i, a in enumerate(topology.derived):
            for b in topology.derived[i + 1 :]:
                sim.version(tuple(sorted({a.output, b.output})))
        for tables in _table_sets(topology):
            sim.version(tables)
        # Let every job run a couple of slots, then look at the whole topology again.
        for _ in range(2):
            sim.steady_step()
        sim.frontiers()
        sim.version(tuple(topology.tables))


# --------------------------------------------------------------------------- G2


G2_WEIGHTS = {"advance": 4, "run": 8, "tick": 1, "peek": 1, "version": 1}


def _trails_by_at_most_one_interval(
    version: dict | None, tables: tuple[str, ...], fronts: dict[str, int]
) -> bool:
    return (
        version is not None and version["barrier"] >= min(fronts[t] for t in tables) - INTERVAL_MS
    )


@pytest.mark.slow
@_settings(examples=5)
@given(
    scenario=scenarios(
        G2_WEIGHTS, max_steps=8, max_sources=2, max_derived=4, max_lag=8, windows=(64, 4)
    )
)
def test_g2_versions_keep_up_and_catch_up_realigns(backend: str, scenario: Scenario) -> None:
    """After random progress and a phase in which some derived jobs stall while the
    rest keep up, every job runs every slot: within a bounded number of slots each
    table set has a consistent version trailing its min frontier by at most one
    interval, and from then on it advances every slot. Consistent versions never
    go back."""
    topology = scenario.topology
    note(repr(scenario))
    with simulated(backend, topology, set(), scenario.window) as sim:
        for step in scenario.steps:
            sim.apply(step)
        sim.steady_step()  # every job has committed once: later batches are catch-up batches
        for _ in range(scenario.lag):
            sim.steady_step(skip=scenario.laggards)
        fronts = sim.frontiers()
        lag_slots = (sim.now_slot() - INTERVAL_MS - min(fronts.values())) // INTERVAL_MS
        depth = max(topology.depth(t) for t in topology.tables)
        # A catch-up batch takes at most `window` slots and ends on the most aligned
        # barrier within reach, which at least halves what is left of the lag; a level
        # of the topology can only align once its inputs have.
        window = scenario.window or 64
        bound = (
            depth * (math.ceil(lag_slots / (window - 1)) + math.ceil(math.log2(lag_slots + 1)) + 2)
            + 1
        )
        steady = 3  # slots checked after convergence
        sets = [tuple(topology.tables)] + [
            tuple(sorted({job.output, *job.inputs}))
            for job in topology.derived
            if job.name in scenario.laggards
        ]
        last: dict[tuple[str, ...], int] = {}
        previous: dict[tuple[str, ...], dict | None] = {}
        converged_at: int | None = None
        slot = 0
        while converged_at is None or slot <= converged_at + steady:
            if converged_at is None and slot > bound:
                raise AssertionError(
                    f"G2: with every job running every slot, the table sets {sets} did not all "
                    f"get a consistent version within one interval of their min frontier in "
                    f"{bound} slots (lag was {lag_slots} slots, depth {depth}); now: frontiers "
                    f"{fronts}, versions {previous}"
                )
            sim.steady_step()
            fronts = sim.frontiers()
            versions = {s: sim.version(s) for s in sets}
            note(f"catch-up slot {slot}: frontiers {fronts}, versions {versions}")
            for s, v in versions.items():
                if v is not None:
                    assert v["barrier"] >= last.get(s, 0), (
                        f"G2: consistent version of {s} went back from {last[s]} to {v['barrier']}"
                    )
                    last[s] = v["barrier"]
            everything = versions[sets[0]]
            for s in sets[1:]:  # a subset's version is at least the whole set's
                assert everything is None or (
                    versions[s] is not None and versions[s]["barrier"] >= everything["barrier"]  # type: ignore[index]
                ), f"G2: consistent version of {s} ({versions[s]}) is older than all tables'"
            trailing = all(_trails_by_at_most_one_interval(versions[s], s, fronts) for s in sets)
            # Caught up: every table has reached the last closed slot, so the version
            # trails the clock, not only a lagging table, by at most one interval.
            converged = trailing and min(fronts.values()) == sim.now_slot() - INTERVAL_MS
            if converged_at is not None:
                assert trailing, (
                    f"G2: steady since slot {converged_at}, but at slot {slot} a consistent "
                    f"version trails its min frontier by more than one interval: {fronts} {versions}"
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
    """Job i runs in the slots where (slot + phases[i]) % periods[i] == 0; a source
    job with period 0 never runs (idle: its tables advance with the clock)."""

    topology: Topology
    periods: tuple[int, ...]
    phases: tuple[int, ...]

    def runs(self, job: str, slot: int) -> bool:
        i = [j.name for j in self.topology.jobs].index(job)
        return self.periods[i] > 0 and (slot + self.phases[i]) % self.periods[i] == 0


@st.composite
def cadences(draw) -> Cadences:  # type: ignore[no-untyped-def]
    topology = draw(topologies(max_sources=2, max_derived=3))
    periods = tuple(
        draw(st.sampled_from([1, 2, 3, 4, 0] if job.is_source else [1, 2, 3, 4]))
        for job in topology.jobs
    )
    phases = tuple(draw(st.integers(0, max(p - 1, 0))) for p in periods)
    return Cadences(topology, periods, phases)


CADENCE_SLOTS = 20


@pytest.mark.slow
@_settings(examples=4)
@given(plan=cadences())
def test_g2_jobs_at_different_cadences_keep_a_common_exact_barrier(
    backend: str, plan: Cadences
) -> None:
    """Jobs that each run every p-th slot (p in 1..4) coalesce about p slots per batch.
    Catch-up batches end on the most aligned barrier within reach, so derived jobs
    keep committing the multiples of the alignment unit U (the power of two >= 2p)
    and the consistent version of all tables (hence of any subset) advances: it
    trails the clock by at most U + 2p + depth slots and never goes back."""
    topology = plan.topology
    note(repr(plan))
    with simulated(backend, topology, set()) as sim:
        idle = [j.name for j, p in zip(topology.jobs, plan.periods, strict=True) if p == 0]
        sim.steady_step(skip=idle)
        derived = [topology.jobs.index(j) for j in topology.derived]
        longest = max(plan.periods[i] for i in derived)
        depth = max(topology.depth(t) for t in topology.tables)
        unit = 1 << math.ceil(math.log2(2 * longest))
        bound = unit + 2 * longest + depth  # slots
        everything = tuple(topology.tables)
        last = 0
        worst = 0
        for slot in range(1, CADENCE_SLOTS + 1):
            sim.clock.advance(INTERVAL_MS)
            for job in topology.jobs:
                if plan.runs(job.name, slot):
                    sim.run(job.name)
            version = sim.version(everything)
            closed = sim.now_slot() - INTERVAL_MS
            note(f"slot {slot}: closed {closed}, version {version}")
            assert version is not None, "G2: the consistent version of all tables disappeared"
            assert version["barrier"] >= last, (
                f"G2: consistent version went back from {last} to {version['barrier']}"
            )
            last = version["barrier"]
            trail = (closed - last) // INTERVAL_MS
            worst = max(worst, trail)
            assert trail <= bound, (
                f"G2: at slot {slot} the consistent version of all tables ({last}) trails the "
                f"last closed slot ({closed}) by {trail} slots; with periods {plan.periods} and "
                f"depth {depth} it should trail by at most {bound}"
            )
        event(f"longest period {longest}, depth {depth}: worst trail {worst} (bound {bound})")


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
}


@pytest.mark.slow
@_settings(examples=10)
@given(scenario=scenarios(G3_WEIGHTS, min_steps=10, max_steps=30, windows=(64, 2)))
def test_g3_replays_and_reports_are_exactly_once(backend: str, scenario: Scenario) -> None:
    """Replayed batches (open or finished) get the same barrier and input ranges;
    duplicate reports answer 'duplicate' and change nothing; conflicting reports,
    alone or inside a batch with valid ones, get 409 and change nothing."""
    note(repr(scenario))
    with simulated(backend, scenario.topology, {G3}, scenario.window) as sim:
        for step in scenario.steps:
            sim.apply(step)
        # Every crashed batch is finished by its replay and every delayed report
        # delivered: each batch is then recorded exactly once.
        for job in scenario.topology.jobs:
            if sim.jobs[job.name].pending is not None:
                sim.run(job.name)
        sim.apply(Flush())
        for table in scenario.topology.tables:
            mapping = sim.state([table], job_fields=False)[table]["items"]
            batches = [(m["job"], m["batch_id"]) for m in mapping]
            assert len(batches) == len(set(batches)), f"G3: {table} has a batch twice: {mapping}"
            mine = sorted((s.batch_id, s.snapshot_id) for s in sim.tables[table].snapshots)
            theirs = sorted((m["batch_id"], m["snapshot_id"]) for m in mapping if m["snapshot_id"])
            assert mine == theirs, f"G3: {table}: table has {mine}, service maps {theirs}"


# --------------------------------------------------------------------------- G5


G5_WEIGHTS = {
    "advance": 2,
    "run": 4,
    "tick": 4,
    "peek": 1,
    "version": 4,
    "release": 1,
    "expiry": 1,
    "flush": 1,
}


@pytest.mark.slow
@_settings(examples=8)
@given(scenario=scenarios(G5_WEIGHTS, min_steps=10, max_steps=35, windows=(64, 2)))
def test_g5_expiry_plans_never_list_a_snapshot_in_use(backend: str, scenario: Scenario) -> None:
    """No plan lists the current snapshot, a snapshot of a live lease, or the start
    snapshot of a derived reader (computed from the simulator's own records)."""
    note(repr(scenario))
    with simulated(backend, scenario.topology, {G5}, scenario.window) as sim:
        for step in scenario.steps:
            sim.apply(step)
        sim.apply(Expiry())
        # Pin a version of everything, let every job move past it, and look again: the
        # leased snapshots are now older than every reader's start.
        everything = tuple(scenario.topology.tables)
        sim.steady_step()
        leased = sim.version(everything, lease_seconds=60)
        for _ in range(2):
            sim.steady_step()
        sim.apply(Expiry())
        if leased is not None:
            event("a lease pins snapshots older than every reader's start")
            sim.apply(Release(0))
            sim.apply(Expiry())
