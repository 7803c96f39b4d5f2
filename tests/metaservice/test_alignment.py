"""G2: how derived jobs align their catch-up batches, and the bound it gives.

The rule and the proof of the bound are in the docstring of
:func:`metaservice.barriers.frontiers.aligned_target`. In short: after its first
batch, a job's batch ends on the most aligned barrier available (the slot number
divisible by the highest power of two); then the consistent version of a set of
jobs is at least the largest multiple M of P slots at or below their least
frontier F, for any power of two P such that M is past every first batch and no
member, nor any derived job upstream of one, has a batch of more than P slots
ending after F - P. So it trails F by less than the longest recent batch rounded
up to a power of two.

Pure-function tests check the rule and the bound over random schedules (several
jobs, batches from one slot to thousands, out of phase, chains of derived jobs);
the API tests drive the service in-process on a ManualClock, among them the
reproductions ``s2_align.py`` and ``s11_sim.py`` of issue 9, item 7.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from metaservice.barriers.frontiers import aligned_target, two_adic_valuation
from metaservice.clock import ManualClock
from metaservice.db import normalise_url
from tests.metaservice.helpers import API, SLOT, T0, barrier, commit, consistent, put_job

BASE = T0 // SLOT  # the ManualClock's start as a slot number (divisible by 2**8)


# -- the bound, as a checkable statement ------------------------------------------------


@dataclass
class History:
    """A job's committed batches (start, end] in slots, oldest first (the first batch
    starts at 0: the job had no frontier)."""

    batches: list[tuple[int, int]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    ended: set[int] = field(default_factory=set)
    longest: int = 0  # the longest batch after the first

    def add(self, start: int, end: int) -> None:
        if self.batches:
            self.longest = max(self.longest, end - start)
        self.batches.append((start, end))
        self.ends.append(end)
        self.ended.add(end)

    @property
    def frontier(self) -> int:
        return self.ends[-1]

    def covering_span(self, m: int) -> int:
        """Span of the batch (a, b] with a < m <= b (the frontier is at least m)."""
        a, b = self.batches[bisect.bisect_left(self.ends, m)]
        return b - a


def guaranteed(
    jobs: dict[str, History], members: Sequence[str], upstream: Iterable[str]
) -> list[int]:
    """The barriers the G2 bound says every member committed: for each power of two
    P, the largest multiple M of P at or below the least frontier F of the members,
    when M is past the first batch of every member and derived job upstream of one,
    and none of their batches ending after F - P spans more than P (only the batch
    covering M can: the others end before M or start after it)."""
    everyone = [*members, *upstream]
    if any(not jobs[j].batches for j in everyone):
        return []
    least = min(jobs[j].frontier for j in members)
    first = max(jobs[j].ends[0] for j in everyone)
    out = []
    p = 1
    while (m := least // p * p) > first:
        if m not in out and all(jobs[j].covering_span(m) <= p for j in everyone):
            out.append(m)
        p *= 2
    return out


def newest_common(jobs: dict[str, History], members: Sequence[str]) -> int | None:
    """The newest barrier every member committed (the consistent version's barrier)."""
    fewest = min(members, key=lambda j: len(jobs[j].ends))
    for end in reversed(jobs[fewest].ends):
        if all(end in jobs[j].ended for j in members):
            return end
    return None


def check_bound(jobs: dict[str, History], members: Sequence[str], upstream: Iterable[str]) -> None:
    for m in guaranteed(jobs, members, upstream):
        missing = [j for j in members if m not in jobs[j].ended]
        recent = {j: jobs[j].batches[-3:] for j in (*members, *upstream)}
        assert not missing, (
            f"G2: {members} should all have committed slot {m}, {missing} did not; "
            f"last batches {recent}"
        )


# -- a pure simulation: jobs reading a source and each other ------------------------------


@dataclass
class SimJob:
    inputs: tuple[str, ...]  # "S" is the source table, exact at every slot
    duration: Callable[[random.Random], int]
    done: History = field(default_factory=History)
    frontier: int = 0
    busy_until: int = 0
    open: tuple[int, int] | None = None


def upstream_of(jobs: dict[str, SimJob], members: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = [i for m in members for i in jobs[m].inputs]
    while todo:
        name = todo.pop()
        if name != "S" and name not in seen:
            seen.add(name)
            todo += jobs[name].inputs
    return seen - set(members)


Observer = Callable[[int, tuple[str, ...], dict[str, History]], None]


def simulate(
    jobs: dict[str, SimJob],
    slots: int,
    rng: random.Random,
    sets: Sequence[tuple[str, ...]],
    observe: Observer | None = None,
    *,
    plan_and_commit_at_once: bool = False,
    phases: int = 0,
) -> None:
    """Each job plans a batch (target from ``aligned_target`` over its inputs' frontiers
    and, for derived inputs, the barriers they all committed), runs it for a random
    duration, commits, and plans again; a job with nothing to do retries a slot later.
    ``plan_and_commit_at_once``: s11_sim's model (commit at once, then wait).
    After every commit the bound is checked for each set, then ``observe`` runs."""
    now = BASE + rng.randint(0, 4095)
    end = now + slots
    for job in jobs.values():
        job.busy_until = now + rng.randint(0, phases)
    upstream = {s: upstream_of(jobs, s) for s in sets}
    done = {name: job.done for name, job in jobs.items()}
    while (now := min(j.busy_until for j in jobs.values())) <= end:
        committed = False
        for job in jobs.values():
            if job.busy_until != now:
                continue
            if job.open is not None:
                job.done.add(*job.open)
                job.frontier = job.open[1]
                job.open = None
                committed = True
            limit = min(now - 1 if i == "S" else jobs[i].frontier for i in job.inputs)
            derived = [jobs[i].done for i in job.inputs if i != "S"]
            candidates = None
            if derived:
                newer = derived[0].ends[bisect.bisect_right(derived[0].ends, job.frontier) :]
                candidates = [c for c in newer if c <= limit and all(c in d.ended for d in derived)]
            target = aligned_target(job.frontier, limit, 1, candidates)
            if target is None:
                job.busy_until = now + 1
                continue
            job.open = (job.frontier, target)
            job.busy_until = now + job.duration(rng)
            if plan_and_commit_at_once:
                job.done.add(*job.open)
                job.frontier = target
                job.open = None
                committed = True
        if committed:
            for s in sets:
                check_bound(done, s, upstream[s])
                if observe is not None:
                    observe(now, s, done)


# -- the rule -------------------------------------------------------------------------------


def test_a_job_that_keeps_up_takes_every_slot() -> None:
    for slot in range(BASE - 300, BASE + 300):
        assert aligned_target(slot * SLOT, (slot + 1) * SLOT, SLOT) == (slot + 1) * SLOT
        candidates = [(slot - 1) * SLOT, (slot + 1) * SLOT]
        assert aligned_target(slot * SLOT, (slot + 1) * SLOT, SLOT, candidates) == (
            (slot + 1) * SLOT
        )


def test_first_batch_takes_everything_available() -> None:
    limit = (BASE + 12345) * SLOT
    assert aligned_target(0, limit, SLOT) == limit
    assert aligned_target(0, limit, SLOT, [BASE * SLOT, (BASE + 7) * SLOT]) == (BASE + 7) * SLOT
    assert aligned_target(0, limit, SLOT, []) is None
    assert aligned_target(limit, limit, SLOT) is None


def test_two_adic_valuation() -> None:
    assert [two_adic_valuation(n) for n in (1, 2, 3, 4, 12, 1 << 40, -8)] == [0, 1, 0, 2, 2, 40, 3]
    with pytest.raises(ValueError):
        two_adic_valuation(0)


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(1, 1 << 40),
    length=st.integers(1, 5000),
    picks=st.none() | st.lists(st.integers(0, 5000), max_size=30),
    interval=st.sampled_from([1, 1000, 250]),
)
def test_target_is_the_most_aligned_barrier_available(
    start: int, length: int, picks: list[int] | None, interval: int
) -> None:
    """Every available barrier in (start, limit] counts, however long the range (no window)."""
    available = range(start + 1, start + length + 1)
    candidates = None if picks is None else sorted({start + p for p in picks})
    pool = list(available) if candidates is None else [c for c in candidates if c in available]
    got = aligned_target(
        start * interval,
        (start + length) * interval,
        interval,
        None if candidates is None else [c * interval for c in candidates],
    )
    if not pool:
        assert got is None
        return
    best = max(pool, key=lambda c: (two_adic_valuation(c), c))
    assert got == best * interval


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(1, 1 << 30),
    length=st.integers(1, 5000),
    picks=st.none() | st.lists(st.integers(1, 5000), max_size=30),
)
def test_a_batch_passing_over_a_multiple_of_p_spans_more_than_p(
    start: int, length: int, picks: list[int] | None
) -> None:
    """The lemma: a batch that passes over an available multiple of P (a power of two)
    without ending on it spans more than P slots."""
    candidates = None if picks is None else sorted({start + p for p in picks})
    b = aligned_target(start, start + length, 1, candidates)
    if b is None:
        return
    inside = range(start + 1, b) if candidates is None else [c for c in candidates if start < c < b]
    for m in inside:
        assert b - start > 1 << two_adic_valuation(m), (start, b, m)


def test_no_window_gives_up_a_job_a_day_behind_catches_up_in_few_batches() -> None:
    """No window, no cap (the old setting claimed 64 slots per catch-up batch, yet one
    batch covered 86,400). From any start a day behind a fixed limit, the first batch
    may be short (onto a highly aligned barrier), then each batch takes the largest
    power of two that fits: at most log2(lag) + 2 batches, every later one ending on a
    barrier divisible by a power of two above half the lag left."""
    rng = random.Random(7)
    for _ in range(200):
        start = BASE + rng.randint(1, 1 << 20)
        limit = start + 86_400
        batches = 0
        while start < limit:
            target = aligned_target(start, limit, 1)
            assert target is not None and start < target <= limit
            if batches:
                assert 1 << two_adic_valuation(target) > (limit - start) // 2
            start, batches = target, batches + 1
        assert batches <= (86_400).bit_length() + 2


# -- the bound over random schedules --------------------------------------------------------


DURATIONS = [1, 2, 3, 5, 10, 30, 70, 130, 300, 600, 1000, 3000]


def longest_batch_bound(
    jobs: dict[str, History], members: Sequence[str], everyone: Sequence[str]
) -> int | None:
    """The corollary's P: the longest batch after the first of any job in ``everyone``,
    rounded up to a power of two; None when its multiple at or below the least
    frontier is not yet past every first batch."""
    if any(not jobs[j].batches for j in everyone):
        return None
    longest = max(jobs[j].longest for j in everyone)
    if not longest:
        return None
    p = 1 << (longest - 1).bit_length()
    least = min(jobs[j].frontier for j in members)
    return p if least // p * p > max(jobs[j].ends[0] for j in everyone) else None


@st.composite
def schedules(draw: Any) -> tuple[dict[str, SimJob], list[tuple[str, ...]], int, int]:
    count = draw(st.integers(2, 5))
    jobs: dict[str, SimJob] = {}
    longest = 1
    for i in range(count):
        readable = ["S", *jobs]
        inputs = tuple(
            draw(st.lists(st.sampled_from(readable), min_size=1, max_size=2, unique=True))
        )
        lo = draw(st.sampled_from(DURATIONS))
        hi = lo * draw(st.sampled_from([1, 2, 3]))
        stall = draw(st.sampled_from([0.0, 0.0, 0.02]))  # now and then a long stop

        def duration(rng: random.Random, lo: int = lo, hi: int = hi, stall: float = stall) -> int:
            d = rng.randint(lo, hi)
            return d + (rng.randint(hi, 10 * hi) if rng.random() < stall else 0)

        jobs[f"d{i}"] = SimJob(inputs, duration)
        longest = max(longest, hi)
    names = list(jobs)
    sets = [tuple(names)] + [
        tuple(draw(st.lists(st.sampled_from(names), min_size=2, max_size=3, unique=True)))
        for _ in range(2)
    ]
    seed = draw(st.integers(0, 2**32 - 1))
    # long enough for several batches of the slowest job, short enough to stay fast
    slots = min(10 * longest + 400, 12_000)
    return jobs, sets, seed, slots


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=schedules())
def test_g2_bound_holds_over_random_schedules(
    plan: tuple[dict[str, SimJob], list[tuple[str, ...]], int, int],
) -> None:
    """Several jobs, batches of one slot to thousands (and now and then a long stop),
    out of phase, derived jobs reading derived jobs: after every commit, every
    barrier the bound names is common to each set (``simulate`` checks it), so a
    set's consistent version trails its least frontier by less than the longest
    batch of its members and their derived upstream, rounded up to a power of two."""
    jobs, sets, seed, slots = plan
    upstream = {s: sorted(upstream_of(jobs, s)) for s in sets}
    named = 0

    def observe(now: int, members: tuple[str, ...], done: dict[str, History]) -> None:
        nonlocal named
        p = longest_batch_bound(done, members, [*members, *upstream[members]])
        if p is None:
            return
        version = newest_common(done, members)
        least = min(done[j].frontier for j in members)
        assert version is not None and least - version < p, (members, least, version, p)
        named += 1

    simulate(jobs, slots, random.Random(seed), sets, observe, phases=3000)


def test_jobs_that_keep_up_commit_every_slot_and_the_version_is_the_least_frontier() -> None:
    jobs = {
        "a": SimJob(("S",), lambda r: 1),
        "b": SimJob(("S",), lambda r: 1),
        "c": SimJob(("a", "b"), lambda r: 1),
    }
    seen = 0

    def observe(now: int, members: tuple[str, ...], done: dict[str, History]) -> None:
        nonlocal seen
        if all(len(done[j].batches) > 3 for j in members):
            least = min(done[j].frontier for j in members)
            assert newest_common(done, members) == least
            assert all(done[j].batches[-1][1] - done[j].batches[-1][0] == 1 for j in members)
            seen += 1

    simulate(jobs, 2000, random.Random(1), [("a", "b", "c")], observe, phases=5)
    assert seen > 1000


def test_no_rule_bounds_the_version_by_the_least_frontier_members_own_batches() -> None:
    """Why the bound names the longest recent batch of all members, not only those of
    the member with the least frontier (DESIGN's wording). y takes every slot; x was
    stopped for 1,000 slots and catches up in one batch, ending past y's frontier.
    Then y has the least frontier and one-slot batches, yet the newest common
    barrier is x's previous end, 999 slots below. Any rule that lets a lagging job
    catch up does this: x's end is chosen without knowing y, and a y one slot
    behind that end (reading through a slower chain, say) makes the same picture."""
    m = BASE * 4  # divisible by 1024
    x, y = History(), History()
    x.add(0, m - 1000)
    y.add(0, m - 1000)
    while y.frontier < m - 1:
        target = aligned_target(y.frontier, y.frontier + 1, 1)
        assert target is not None
        y.add(y.frontier, target)
    target = aligned_target(x.frontier, m + 2, 1)  # x's limit: the source's frontier
    assert target == m
    x.add(x.frontier, target)
    done = {"x": x, "y": y}
    least = min(x.frontier, y.frontier)
    version = newest_common(done, ["x", "y"])
    assert (least, y.batches[-1], version) == (m - 1, (m - 2, m - 1), m - 1000)
    assert version is not None
    assert least - version == 999  # not within one of y's one-slot batches
    assert least - version < 1024  # within x's 1,000-slot batch rounded up
    check_bound(done, ["x", "y"], [])


# -- s11_sim.py (issue 9, item 7), pure ---------------------------------------------------------


@pytest.mark.parametrize(
    ("lo", "hi", "old_worst"),
    [(10, 60, 123), (70, 200, 1388), (130, 260, 3341), (300, 600, 16147)],
)
def test_s11_catch_up_staleness_stays_within_the_bound(lo: int, hi: int, old_worst: int) -> None:
    """s11_sim's model: two readers of one source commit as they plan, then wait
    lo..hi slots, for 200,000 slots. With the old 64-slot window the worst staleness
    (clock minus the newest common barrier) was ``old_worst``. Now every barrier the
    bound names is common, the version trails the least frontier by less than the
    longest batch rounded up to a power of two, and the staleness is within 2.5
    batch durations."""
    jobs = {n: SimJob(("S",), lambda r: r.randint(lo, hi)) for n in ("a", "b")}
    worst = 0
    longest = 0

    def observe(now: int, members: tuple[str, ...], done: dict[str, History]) -> None:
        nonlocal worst, longest
        version = newest_common(done, members)
        if version is None:
            return
        worst = max(worst, now - version)
        for j in members:
            if len(done[j].batches) > 1:
                longest = max(longest, done[j].batches[-1][1] - done[j].batches[-1][0])
        if all(len(done[j].batches) > 2 for j in members):
            least = min(done[j].frontier for j in members)
            assert least - version < 1 << (longest - 1).bit_length()

    simulate(
        jobs,
        200_000,
        random.Random(1),
        [("a", "b")],
        observe,
        plan_and_commit_at_once=True,
        phases=hi,
    )
    assert worst <= 2.5 * hi, worst
    if hi > 64:  # beyond the old window: far better than before
        assert worst < old_worst / 3, worst


# -- through the API --------------------------------------------------------------------------


def db_histories(db_url: str, names: Sequence[str]) -> dict[str, History]:
    """Every committed batch of these jobs, Spark's and the ones the MetaService advanced
    (in slots, oldest first)."""
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT j.name, b.start_barrier, b.barrier FROM batches b "
                    "JOIN jobs j ON j.id = b.job_id WHERE b.committed AND NOT b.abandoned "
                    "ORDER BY b.barrier"
                )
            ).all()
    finally:
        engine.dispose()
    out = {n: History() for n in names}
    for name, start, end in rows:
        if name in out:
            out[name].add((start or 0) // SLOT, end // SLOT)
    return out


def version_slot(client: TestClient, tables: Sequence[str]) -> int | None:
    r = consistent(client, ",".join(tables))
    if r.status_code == 409:
        assert r.json()["code"] == "no_consistent_version", r.text
        return None
    assert r.status_code == 200, r.text
    return r.json()["barrier"] // SLOT  # type: ignore[no-any-return]


class Driver:
    """Source job ``src`` writing ``ods.s`` and derived jobs ``X`` writing ``dw.X``, each
    planning a batch (POST .../barrier), working, committing and planning again."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.src_batch = 0
        self.snapshot = 1
        self.next_id: dict[str, int] = {}
        self.open: dict[str, tuple[int, int]] = {}
        put_job(client, "src", ["ods.s"])
        self.source_batch()

    def add(self, name: str, inputs: Sequence[str]) -> None:
        put_job(self.client, name, [f"dw.{name}"], inputs=list(inputs))
        self.next_id[name] = 0

    def source_batch(self) -> None:
        b = barrier(self.client, "src", self.src_batch)["barrier"]
        commit(self.client, "src", self.src_batch, b, "ods.s", self.snapshot)
        self.src_batch += 1
        self.snapshot += 1

    def step(self, name: str, *, commit_now: bool = False) -> bool:
        """Commit the job's open batch, if any, and plan the next; False if none is ready.
        ``commit_now``: commit the new batch at once too (s2_align.py's model)."""
        if name in self.open:
            batch_id, b = self.open.pop(name)
            commit(self.client, name, batch_id, b, f"dw.{name}", self.snapshot)
            self.snapshot += 1
        batch_id = self.next_id[name]
        r = self.client.post(f"{API}/jobs/{name}/batches/{batch_id}/barrier")
        if r.status_code == 409:
            assert r.json()["code"] == "no_barrier_ready", r.text
            return False
        assert r.status_code == 200, r.text
        self.open[name] = (batch_id, r.json()["barrier"])
        self.next_id[name] = batch_id + 1
        if commit_now:
            batch_id, b = self.open.pop(name)
            commit(self.client, name, batch_id, b, f"dw.{name}", self.snapshot)
            self.snapshot += 1
        return True


@pytest.mark.parametrize(("length", "phase"), [(128, 64), (100, 37), (1000, 333)])
def test_s2_two_jobs_batching_out_of_phase_share_barriers(
    client: TestClient, clock: ManualClock, db_url: str, length: int, phase: int
) -> None:
    """s2_align.py: two readers of one source take ``length`` slots per batch, ``phase``
    slots apart. With the 64-slot window, at 128 slots one always ended on 0 mod 128
    and the other on 64 mod 128: no consistent version ever. Now there is one from
    the third round on, it never goes back, and it trails the least frontier by less
    than the longest batch rounded up to a power of two (at 128 slots: not at all)."""
    drive = Driver(client)
    drive.add("d1", ["ods.s"])
    drive.add("d2", ["ods.s"])
    start = (BASE // length + 2) * length  # as s2_align.py
    seen = []
    for k in range(12):
        for name, offset in (("d1", 0), ("d2", phase)):
            clock.set((start + length * k + offset + 1) * SLOT)
            drive.source_batch()
            assert drive.step(name, commit_now=True)
            version = version_slot(client, ["dw.d1", "dw.d2"])
            done = db_histories(db_url, ["d1", "d2"])
            forced = guaranteed(done, ["d1", "d2"], [])
            assert not forced or (version is not None and version >= max(forced))
            if k >= 2:
                assert version is not None, (k, name, done)
                least = min(done[j].frontier for j in ("d1", "d2"))
                longest = max(b - a for j in ("d1", "d2") for a, b in done[j].batches[1:])
                assert least - version < 1 << (longest - 1).bit_length()
                seen.append((least, version))
    if length == 128:  # the exact s2 case: both end on every multiple of 128
        assert all(least == version for least, version in seen), seen
    assert [v for _, v in seen] == sorted(v for _, v in seen)


def test_api_jobs_that_keep_up_give_the_least_frontier_every_slot(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    """Steady state: readers and a reader of readers that run every slot take every
    slot, and the consistent version of all their tables is their least frontier."""
    drive = Driver(client)
    for name, inputs in (("a", ["ods.s"]), ("b", ["ods.s"]), ("c", ["dw.a", "dw.b"])):
        drive.add(name, inputs)
    for slot in range(1, 16):
        clock.set(T0 + slot * SLOT)
        drive.source_batch()
        for name in ("a", "b", "c"):
            drive.step(name)
        if slot > 4:
            done = db_histories(db_url, ["a", "b", "c"])
            least = min(done[j].frontier for j in ("a", "b", "c"))
            assert version_slot(client, ["dw.a", "dw.b", "dw.c"]) == least, done
            assert all(b - a == 1 for j in "abc" for a, b in done[j].batches[2:]), done


@pytest.mark.slow
def test_s11_through_the_api_random_batches_and_a_chain_meet_the_bound(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    """s11_sim.py through the service: two readers of a source taking 70-200 slots per
    batch and a reader of one of them and the source taking 130-260, out of phase.
    After every step, every barrier the bound names (from the batches in the
    database, advanced ones included) is at or below the service's consistent
    version of the set."""
    rng = random.Random(11)
    drive = Driver(client)
    spec = {
        "d1": (["ods.s"], 70, 200),
        "d2": (["ods.s"], 70, 200),
        "d3": (["dw.d1", "ods.s"], 130, 260),
    }
    for name, (inputs, _, _) in spec.items():
        drive.add(name, inputs)
    now = BASE + 1
    due = {name: now + rng.randint(0, 200) for name in spec}
    sets: dict[tuple[str, ...], tuple[list[str], list[str]]] = {
        ("d1", "d2"): (["dw.d1", "dw.d2"], []),
        ("d2", "d3"): (["dw.d2", "dw.d3"], ["d1"]),
        ("d1", "d2", "d3"): (["dw.d1", "dw.d2", "dw.d3"], []),
    }
    checked = 0
    while now < BASE + 3000:
        now = min(due.values())
        clock.set(now * SLOT)
        drive.source_batch()
        for name, (_, lo, hi) in spec.items():
            if due[name] == now:
                ready = drive.step(name)  # not ready: Spark's next trigger
                due[name] = now + (rng.randint(lo, hi) if ready else rng.randint(5, 20))
        done = db_histories(db_url, list(spec))
        for members, (tables, upstream) in sets.items():
            forced = guaranteed(done, members, upstream)
            if forced:
                version = version_slot(client, tables)
                assert version is not None and version >= max(forced), (members, forced, version)
                assert all(max(forced) in done[j].ended for j in members)
                checked += 1
    assert checked > 20
