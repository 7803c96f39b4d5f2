"""G5 at execution time: reserving an expiry against leases and consistent versions.

``lifecycle.service.reserve_expiry`` is what an executor calls before it expires
anything: under the table's row lock it recomputes what is in use and raises the
table's expiry horizon, and from then on no version or lease names a snapshot below
it. These tests interleave leases, plans and reservations, on SQLite and PostgreSQL,
in one thread and in several.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from metaservice.clock import ManualClock
from metaservice.db import normalise_url
from metaservice.deps import Services
from metaservice.errors import Conflict, NotFound
from metaservice.iceberg_rest import service as catalog
from metaservice.lifecycle import service as lifecycle
from metaservice.lifecycle.schemas import ExpiryPlan
from metaservice.versions import service as versions
from metaservice.versions.schemas import ConsistentVersion
from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    commit,
    consistent,
    get_json,
    put_job,
    run_batch,
)


def _services(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def _reserve(client: TestClient, table: str) -> ExpiryPlan:
    s = _services(client)
    return s.db.write(lambda session: lifecycle.reserve_expiry(session, s.ctx, table))


def _lease(
    client: TestClient, tables: list[str], at_or_before: int | None = None, seconds: int = 3600
) -> ConsistentVersion:
    s = _services(client)
    return s.db.write(
        lambda session: versions.lease_version(session, s.ctx, tables, at_or_before, seconds)
    )


def _ids(snapshots: list[Any]) -> list[int]:
    return [p.snapshot_id if hasattr(p, "snapshot_id") else p["snapshot_id"] for p in snapshots]


def _source(
    client: TestClient, clock: ManualClock, job: str, table: str, ids: list[int]
) -> list[int]:
    """One source batch per slot, committing each of ``ids``; returns their barriers."""
    put_job(client, job, [table])
    start = get_json(client, f"/tables/{table}/snapshots")["total"]
    barriers = []
    for i, snapshot in enumerate(ids):
        barriers.append(run_batch(client, job, start + i, {table: snapshot}))
        clock.advance(SLOT)
    return barriers


def _s6(client: TestClient, clock: ManualClock) -> list[int]:
    """repro s6_plan.py: src writes ods.s (10..13 at T0..T0+3s); der reads it and has
    committed up to T0+4s, so its start position is the current snapshot 13."""
    bs = _source(client, clock, "s", "ods.s", [10, 11, 12, 13])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    clock.advance(SLOT)
    assert run_batch(client, "d", 0, {"dw.d": 90}) == T0 + 4 * SLOT
    return bs


# -- one request after the other ------------------------------------------------------------


def test_a_reservation_makes_leases_on_what_the_plan_listed_answer_409_expired(client, clock):
    """s6_plan.py: the plan listed 10, 11, 12 and a lease was then granted on 10."""
    bs = _s6(client, clock)
    plan = get_json(client, "/tables/ods.s/expirable")
    assert _ids(plan["expirable"]) == [10, 11, 12]
    assert plan["expiry_horizon"] is None

    reserved = _reserve(client, "ods.s")
    assert _ids(reserved.expirable) == [10, 11, 12]
    assert reserved.expiry_horizon == bs[3]

    r = consistent(client, "ods.s", at_or_before=bs[0], lease_seconds=600)
    body = assert_error(r, 409, "expired", field="at_or_before")
    assert "snapshot 10 of 'ods.s'" in body["message"] and str(bs[3]) in body["message"]
    assert_error(
        client.post(
            f"{API}/leases", json={"tables": ["ods.s"], "at_or_before": bs[2], "lease_seconds": 60}
        ),
        409,
        "expired",
    )
    assert_error(consistent(client, "ods.s", at_or_before=bs[1]), 409, "expired")
    assert get_json(client, "/tables/ods.s/expirable")["kept"] == [
        {
            "snapshot_id": 13,
            "barrier": bs[3],
            "batch_id": 3,
            "reasons": [
                "current snapshot",
                "retention: one of the newest 1",
                f"start position of job 'd' (committed up to barrier {T0 + 4 * SLOT})",
            ],
        }
    ]
    # at and above the horizon, versions and leases are handed out as before
    assert consistent(client, "ods.s", at_or_before=bs[3]).json()["snapshots"] == {"ods.s": 13}
    lease = consistent(client, "ods.s,dw.d", lease_seconds=60).json()
    assert lease["snapshots"] == {"ods.s": 13, "dw.d": 90}


def test_no_version_or_lease_names_a_snapshot_below_a_recorded_horizon(client, clock, db_url):
    """The horizon as an executor left it (s6_plan.py's lease on snapshot 10 is refused)."""
    bs = _s6(client, clock)
    engine = create_engine(normalise_url(db_url))
    with engine.begin() as conn:
        conn.execute(text("UPDATE tables SET expiry_horizon = :h"), {"h": bs[2]})
    engine.dispose()
    for at in bs[:2]:
        assert_error(consistent(client, "ods.s", at_or_before=at, lease_seconds=60), 409, "expired")
        assert_error(consistent(client, "ods.s", at_or_before=at), 409, "expired")
    assert consistent(client, "ods.s", at_or_before=bs[2]).json()["snapshots"] == {"ods.s": 12}
    assert get_json(client, "/tables/ods.s/expirable")["expiry_horizon"] == bs[2]


def test_a_lease_granted_after_the_plan_keeps_its_snapshot_out_of_the_reservation(client, clock):
    bs = _s6(client, clock)
    assert _ids(get_json(client, "/tables/ods.s/expirable")["expirable"]) == [10, 11, 12]
    lease = consistent(client, "ods.s", at_or_before=bs[0], lease_seconds=600).json()
    assert lease["snapshots"] == {"ods.s": 10}
    reserved = _reserve(client, "ods.s")
    assert (reserved.expirable, reserved.oldest_in_use, reserved.expiry_horizon) == ([], 10, bs[0])
    # the lease ends: 10, 11 and 12 may go now
    assert client.delete(f"{API}/leases/{lease['lease_id']}").status_code == 204
    reserved = _reserve(client, "ods.s")
    assert (_ids(reserved.expirable), reserved.expiry_horizon) == ([10, 11, 12], bs[3])


def test_an_expired_lease_no_longer_holds_the_reservation_back(client, clock):
    bs = _s6(client, clock)
    consistent(client, "ods.s", at_or_before=bs[1], lease_seconds=5)
    assert _ids(_reserve(client, "ods.s").expirable) == [10]
    clock.advance(5 * SLOT)
    assert _ids(_reserve(client, "ods.s").expirable) == [10, 11, 12]


def test_the_horizon_never_moves_down_when_a_new_reader_pins_an_older_snapshot(client, clock):
    bs = _source(client, clock, "s", "ods.s", [1, 2, 3])
    assert _reserve(client, "ods.s").expiry_horizon == bs[2]
    # a new reader starts from the very first snapshot, which may be gone already
    put_job(client, "late", ["dw.late"], inputs=["ods.s"])
    plan = _reserve(client, "ods.s")
    assert (plan.expirable, plan.oldest_in_use, plan.expiry_horizon) == ([], 1, bs[2])
    assert plan.kept[0].reasons == ["start position of job 'late' (committed up to barrier 0)"]
    assert_error(consistent(client, "ods.s", at_or_before=bs[0]), 409, "expired")


def test_a_table_still_empty_at_a_barrier_below_the_horizon_is_no_obstacle(client, clock):
    bs = _source(client, clock, "s", "ods.s", [1, 2, 3])
    assert _reserve(client, "ods.s").expiry_horizon == bs[2]
    before = consistent(client, "ods.s", at_or_before=T0 - SLOT, lease_seconds=60)
    assert before.status_code == 200, before.text
    assert before.json()["snapshots"] == {"ods.s": None}


def test_a_version_a_lagging_table_holds_below_another_tables_horizon_is_409_until_it_moves(
    client, clock
):
    """The latest version of {a, b} trails b's open batch; a's expiry went past it."""
    _source(client, clock, "sa", "ods.a", [1, 2])
    put_job(client, "sb", ["ods.b"])
    held = barrier(client, "sb", 0)["barrier"]  # T0+2s: ods.b stays below it
    _source(client, clock, "sa", "ods.a", [3, 4])
    assert consistent(client, "ods.a,ods.b").json() == {
        "barrier": held - SLOT,
        "snapshots": {"ods.a": 2, "ods.b": None},
    }
    assert _ids(_reserve(client, "ods.a").expirable) == [1, 2, 3]
    body = assert_error(consistent(client, "ods.a,ods.b"), 409, "expired", field="tables")
    assert "snapshot 2 of 'ods.a'" in body["message"]
    assert_error(consistent(client, "ods.a,ods.b", lease_seconds=60), 409, "expired")
    commit(client, "sb", 0, held, "ods.b", 50)
    clock.advance(SLOT)
    after = consistent(client, "ods.a,ods.b", lease_seconds=60)
    assert after.status_code == 200, after.text
    assert after.json()["snapshots"] == {"ods.a": 4, "ods.b": 50}


def test_a_derived_readers_start_position_is_never_reserved(client, clock):
    bs = _source(client, clock, "s", "ods.s", [1, 2])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    assert run_batch(client, "d", 0, {"dw.d": 90}) == bs[1]
    _source(client, clock, "s", "ods.s", [3, 4])
    reserved = _reserve(client, "ods.s")
    assert (_ids(reserved.expirable), reserved.expiry_horizon) == ([1], bs[1])
    # d's next batch reads (bs[1], ...] from its start position 2, still there
    ranges = barrier(client, "d", 1)["inputs"]
    assert [r["from_snapshot"] for r in ranges] == [2]


def test_reserving_an_unknown_table_is_404_and_an_empty_one_changes_nothing(client):
    with pytest.raises(NotFound):
        _reserve(client, "ods.nope")
    put_job(client, "s", ["ods.s"])
    plan = _reserve(client, "ods.s")
    assert (plan.expirable, plan.kept, plan.expiry_horizon) == ([], [], None)


# -- concurrent requests ------------------------------------------------------------------


def _paused(
    client: TestClient, work: Callable[[Session], Any]
) -> tuple[threading.Thread, threading.Event, list[Any]]:
    """Run ``work`` in a write transaction on a thread that stops before committing,
    holding its locks, until the returned ``release`` event is set."""
    s = _services(client)
    inside, release = threading.Event(), threading.Event()
    out: list[Any] = []

    def run(session: Session) -> Any:
        result = work(session)
        inside.set()
        assert release.wait(30)
        return result

    def thread() -> None:
        try:
            out.append(s.db.write(run))
        except Exception as exc:  # handed to the test
            out.append(exc)

    t = threading.Thread(target=thread)
    t.start()
    assert inside.wait(30)
    return t, release, out


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def thread() -> None:
        try:
            out.append(fn())
        except Exception as exc:
            out.append(exc)

    t = threading.Thread(target=thread)
    t.start()
    return t, out


def test_a_reservation_waits_for_a_lease_in_flight_and_leaves_its_snapshot_out(client, clock):
    bs = _s6(client, clock)
    s = _services(client)
    lease_thread, release, leased = _paused(
        client, lambda session: versions.lease_version(session, s.ctx, ["ods.s"], bs[0], 600)
    )
    reserve_thread, reserved = _in_thread(lambda: _reserve(client, "ods.s"))
    reserve_thread.join(0.5)
    assert reserve_thread.is_alive(), "the reservation must wait for the lease's transaction"
    release.set()
    lease_thread.join(30)
    reserve_thread.join(30)
    assert leased[0].snapshots == {"ods.s": 10}
    assert (reserved[0].expirable, reserved[0].oldest_in_use) == ([], 10)
    assert reserved[0].expiry_horizon == bs[0]


def test_a_lease_asked_while_a_reservation_runs_waits_and_is_refused_409_expired(client, clock):
    bs = _s6(client, clock)
    s = _services(client)
    reserve_thread, release, reserved = _paused(
        client, lambda session: lifecycle.reserve_expiry(session, s.ctx, "ods.s")
    )
    lease_thread, leased = _in_thread(lambda: _lease(client, ["ods.s"], bs[0]))
    lease_thread.join(0.5)
    assert lease_thread.is_alive(), "the lease must wait for the reservation's transaction"
    release.set()
    reserve_thread.join(30)
    lease_thread.join(30)
    assert _ids(reserved[0].expirable) == [10, 11, 12]
    assert isinstance(leased[0], Conflict) and leased[0].code == "expired", leased
    # a lease at the horizon is granted
    assert _lease(client, ["ods.s"], bs[3]).snapshots == {"ods.s": 13}


def _catalog_session(client: TestClient, barrier: int) -> str:
    """A catalog session on ``at:<barrier>`` (a lease of all tables), as config opens it."""
    s = _services(client)
    return s.db.write(lambda session: catalog.open_session(session, s.ctx, f"at:{barrier}"))


def test_a_catalog_session_keeps_its_snapshot_out_of_a_reservation(client, clock):
    """A catalog session's one lease row (of all tables) keeps each table's snapshot at
    its barrier, as a lease naming the snapshot does, until it ends."""
    bs = _source(client, clock, "s", "ods.s", [10, 11, 12, 13])
    _catalog_session(client, bs[1])
    reserved = _reserve(client, "ods.s")
    assert (_ids(reserved.expirable), reserved.oldest_in_use) == ([10], 11)
    assert reserved.kept[0].snapshot_id == 11
    assert any(r.startswith("lease ") for r in reserved.kept[0].reasons), reserved.kept[0]


def test_a_reservation_waits_for_a_catalog_session_in_flight_and_keeps_its_snapshot(client, clock):
    bs = _source(client, clock, "s", "ods.s", [10, 11, 12, 13])
    s = _services(client)
    session_thread, release, opened = _paused(
        client, lambda session: catalog.open_session(session, s.ctx, f"at:{bs[0]}")
    )
    reserve_thread, reserved = _in_thread(lambda: _reserve(client, "ods.s"))
    reserve_thread.join(0.5)
    assert reserve_thread.is_alive(), "the reservation must wait for the session's transaction"
    release.set()
    session_thread.join(30)
    reserve_thread.join(30)
    assert isinstance(opened[0], str), opened
    assert (reserved[0].expirable, reserved[0].oldest_in_use) == ([], 10)


def test_a_catalog_session_opened_while_a_reservation_runs_waits_and_is_refused(client, clock):
    bs = _source(client, clock, "s", "ods.s", [10, 11, 12, 13])
    s = _services(client)
    reserve_thread, release, reserved = _paused(
        client, lambda session: lifecycle.reserve_expiry(session, s.ctx, "ods.s")
    )
    session_thread, opened = _in_thread(lambda: _catalog_session(client, bs[0]))
    session_thread.join(0.5)
    assert session_thread.is_alive(), "the session must wait for the reservation's transaction"
    release.set()
    reserve_thread.join(30)
    session_thread.join(30)
    assert _ids(reserved[0].expirable) == [10, 11, 12]
    # refused as the REST spec's bad request, whether the version's read or the check
    # under the lock found the horizon (SQLite's writers wait at BEGIN, before the read)
    assert isinstance(opened[0], catalog.CatalogError), opened
    assert opened[0].status == 400 and "may have been expired" in opened[0].message
    assert isinstance(_catalog_session(client, bs[3]), str)  # at the horizon: granted


def test_commit_reports_do_not_wait_for_a_reservation_on_postgresql(client, clock, db_url):
    """The reservation's lock (FOR NO KEY UPDATE) leaves commits' foreign keys alone;
    SQLite serialises every write anyway."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite serialises all writers")
    _s6(client, clock)
    s = _services(client)
    held = barrier(client, "s", 4)["barrier"]
    reserve_thread, release, reserved = _paused(
        client, lambda session: lifecycle.reserve_expiry(session, s.ctx, "ods.s")
    )
    commit_thread, committed = _in_thread(lambda: commit(client, "s", 4, held, "ods.s", 14))
    commit_thread.join(10)
    finished = not commit_thread.is_alive()
    release.set()
    reserve_thread.join(30)
    commit_thread.join(30)
    assert finished, "the commit report waited for the reservation"
    assert committed[0]["status"] == "recorded", committed
    assert _ids(reserved[0].expirable) == [10, 11, 12]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_leases_and_reservations_from_many_threads_never_share_a_snapshot(client, clock, seed):
    """Rounds of new snapshots, then leases of a few seconds at random barriers and
    reservations from eight threads at once. No reservation returns a snapshot of a
    lease that was live then, or of a lease granted after it; no plan lists one."""
    rng = random.Random(seed)
    rounds, per_round = 8, 12
    put_job(client, "s", ["ods.s"])
    barriers: list[int] = []
    leases: list[tuple[int, ConsistentVersion]] = []  # (round, lease)
    reservations: list[tuple[int, int, ExpiryPlan]] = []  # (round, now, plan)
    refused = 0
    for round_ in range(rounds):
        for _ in range(2):
            barriers.append(run_batch(client, "s", len(barriers), {"ods.s": 100 + len(barriers)}))
            clock.advance(SLOT)
        calls: list[Callable[[], Any]] = []
        for _ in range(per_round):
            if rng.random() < 0.3:
                calls.append(lambda: _reserve(client, "ods.s"))
            else:
                at, seconds = rng.choice(barriers[-8:]), rng.randint(1, 4)
                calls.append(lambda at=at, n=seconds: _lease(client, ["ods.s"], at, n))
        with ThreadPoolExecutor(8) as pool:
            for future in [pool.submit(call) for call in calls]:
                try:
                    result = future.result(60)
                except Conflict as exc:
                    assert exc.code == "expired", exc.message
                    refused += 1
                    continue
                if isinstance(result, ExpiryPlan):
                    reservations.append((round_, clock.now_ms(), result))
                else:
                    leases.append((round_, result))
        plan = get_json(client, "/tables/ods.s/expirable")
        live = {v.snapshots["ods.s"] for _, v in leases if v.lease_expires_ms > clock.now_ms()}
        assert not live & set(_ids(plan["expirable"])), (live, plan)
    assert refused + len(leases) + len(reservations) == rounds * per_round
    assert leases and any(plan.expirable for _, _, plan in reservations)
    for reserved_in, now, plan in reservations:
        for granted_in, lease in leases:
            if granted_in > reserved_in or (lease.lease_expires_ms or 0) > now:
                assert lease.snapshots["ods.s"] not in _ids(plan.expirable), (lease, plan)
