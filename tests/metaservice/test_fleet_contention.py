"""What keeps a fleet of jobs from queueing on each other (issue 13).

A derived job's next-barrier round never waits for a row another transaction holds
locked: it seals idle sources and advances idle upstream jobs only where it can lock
them at once (``SKIP LOCKED``), and decides on their frontiers as committed otherwise
(a lower bound, so the answer is only less advanced, never wrong). And a Database runs
a bounded number of units of work at once, letting the urgent ones (a batch's barrier,
its report) in first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from metaservice.app import create_app
from metaservice.db import NORMAL, OLDEST_EVERY, POLL, URGENT, Database, _Turns
from metaservice.settings import Settings
from tests.metaservice.helpers import (
    SLOT,
    barrier,
    commit,
    custom_client,
    in_thread,
    locked_for_update,
    next_barrier,
    put_job,
)
from tests.migrated import migrate_fresh


def answered_within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread; its answer, asserted to come within ``seconds``."""
    started = time.monotonic()
    thread, answers = in_thread(call)
    thread.join(timeout=10)
    took = time.monotonic() - started
    assert answers, "no answer in 10 s: the call waited for a locked row"
    assert took < seconds, f"answered after {took:.1f} s: the call waited for a locked row"
    return answers[0]


def stored_frontier(db_url: str, job: str) -> int:
    """The job's frontier as its row holds it (the API shows an idle source's frontier
    as sealing would make it)."""
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            q = sa.text("SELECT frontier FROM jobs WHERE name = :n")
            return int(conn.execute(q, {"n": job}).scalar_one())
    finally:
        engine.dispose()


def job_row_locked(db_url: str, job: str) -> AbstractContextManager[None]:
    """One job's row locked by another transaction until the block ends."""
    return locked_for_update(db_url, "SELECT id FROM jobs WHERE name = :n FOR UPDATE", n=job)


def test_a_round_does_not_wait_for_a_locked_idle_source_and_decides_without_it(pg_url, clock):
    migrate_fresh(pg_url)
    with custom_client(pg_url, clock) as client:
        put_job(client, "s", ["ods.s"])
        put_job(client, "d", ["dw.d"], inputs=["ods.s"])
        b0 = barrier(client, "s", 0)["barrier"]
        commit(client, "s", 0, b0, "ods.s", 1)
        sealed = stored_frontier(pg_url, "s")  # sealed at the report
        clock.advance(3 * SLOT)  # s is idle: sealing would move it two slots further
        with job_row_locked(pg_url, "s"):
            first = answered_within(1.5, lambda: next_barrier(client, "d", after=0))
            # Decided on s's frontier as committed, not on what sealing would give.
            assert first["ready"] and first["barrier"] == sealed, (first, sealed)
            assert stored_frontier(pg_url, "s") == sealed  # not sealed meanwhile
        # The lock gone, the next round seals s (its start is the plan's end).
        r = client.post(
            "/api/v1/jobs/d/batches/0/barrier", json={"start": 0, "end": first["barrier"]}
        )
        assert r.status_code == 200, r.text
        commit(client, "d", 0, first["barrier"], "dw.d", 11)
        later = next_barrier(client, "d", after=first["barrier"])
        assert later["ready"] and later["barrier"] > sealed, later
        assert stored_frontier(pg_url, "s") >= later["barrier"]
        # G1: a batch of s after the round gets a barrier past what d took as complete.
        assert barrier(client, "s", 1)["barrier"] > later["barrier"]


def test_a_round_does_not_wait_for_a_locked_upstream_job(pg_url, clock):
    migrate_fresh(pg_url)
    with custom_client(pg_url, clock) as client:
        put_job(client, "s", ["ods.s"])
        put_job(client, "d1", ["dw.a"], inputs=["ods.s"])
        put_job(client, "d2", ["dw.b"], inputs=["dw.a"])
        b0 = barrier(client, "s", 0)["barrier"]
        commit(client, "s", 0, b0, "ods.s", 1)
        clock.advance(2 * SLOT)
        plan = next_barrier(client, "d1", after=0)
        r = client.post(
            "/api/v1/jobs/d1/batches/0/barrier", json={"start": 0, "end": plan["barrier"]}
        )
        assert r.status_code == 200, r.text
        commit(client, "d1", 0, plan["barrier"], "dw.a", 11)
        d2 = next_barrier(client, "d2", after=0)
        r = client.post(
            "/api/v1/jobs/d2/batches/0/barrier", json={"start": 0, "end": d2["barrier"]}
        )
        assert r.status_code == 200, r.text
        commit(client, "d2", 0, d2["barrier"], "dw.b", 21)
        clock.advance(3 * SLOT)  # d1 is idle (s wrote nothing since): d2's round may advance it
        with job_row_locked(pg_url, "d1"):
            held = answered_within(1.5, lambda: next_barrier(client, "d2", after=d2["barrier"]))
            assert not held["ready"], held  # d1 was left where it was
        after = next_barrier(client, "d2", after=d2["barrier"])
        assert after["ready"] and after["barrier"] > d2["barrier"], after  # d1 advanced now
        assert stored_frontier(pg_url, "d1") >= after["barrier"]


def test_turns_let_urgent_waiters_in_first_and_never_more_than_the_slots():
    turns = _Turns(1)
    order: list[str] = []
    assert turns.enter(NORMAL)  # the one turn, held by this thread

    def waiter(name: str, priority: int) -> threading.Thread:
        def run() -> None:
            took = turns.enter(priority)
            order.append(name)
            turns.leave(took)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        time.sleep(0.1)  # queued in this order
        return thread

    threads = [waiter("normal", NORMAL), waiter("poll", POLL), waiter("urgent", URGENT)]
    assert order == []  # nobody entered while the turn was held
    turns.leave(True)
    for thread in threads:
        thread.join(timeout=5)
    assert order == ["urgent", "poll", "normal"]


def test_a_waiter_of_low_priority_is_slowed_by_urgent_ones_never_starved():
    turns = _Turns(1)
    assert turns.enter(NORMAL)
    order: list[str] = []

    def waiter(name: str, priority: int) -> threading.Thread:
        def run() -> None:
            took = turns.enter(priority)
            order.append(name)
            time.sleep(0.01)
            turns.leave(took)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    threads = [waiter("event", NORMAL)]
    time.sleep(0.1)
    threads += [waiter(f"barrier {i}", URGENT) for i in range(3 * OLDEST_EVERY)]
    time.sleep(0.3)
    turns.leave(True)
    for thread in threads:
        thread.join(timeout=5)
    assert len(order) == 1 + 3 * OLDEST_EVERY
    assert 0 < order.index("event") < OLDEST_EVERY, order


def test_a_coroutine_waits_for_its_turn_without_a_thread_and_gives_it_back():
    turns = _Turns(1)
    assert turns.enter(NORMAL)
    order: list[str] = []

    async def main() -> None:
        async def one(name: str, priority: int) -> None:
            await turns.enter_async(priority)
            order.append(name)
            turns.give_back()

        tasks = [asyncio.create_task(one("later", NORMAL))]
        await asyncio.sleep(0.05)
        cancelled = asyncio.create_task(one("cancelled", URGENT))
        await asyncio.sleep(0.05)
        tasks.append(asyncio.create_task(one("urgent", URGENT)))
        await asyncio.sleep(0.05)
        cancelled.cancel()  # a waiter that goes away is skipped, its place not lost
        await asyncio.sleep(0.05)
        turns.leave(True)  # the held turn goes to the best waiter still there
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    asyncio.run(main())
    assert order == ["urgent", "later"]
    assert turns.enter(NORMAL)  # every turn was given back


def test_a_unit_of_work_inside_another_does_not_wait_for_a_second_turn(sqlite_url):
    migrate_fresh(sqlite_url)
    db = Database(sqlite_url, max_transactions=1)
    try:
        inner = db.read(lambda _s: db.read(lambda s: s.execute(sa.text("SELECT 1")).scalar()))
        assert inner == 1

        async def from_the_loop() -> Any:
            return await db.read_async(
                lambda _s: db.read(lambda s: s.execute(sa.text("SELECT 2")).scalar())
            )

        assert asyncio.run(from_the_loop()) == 2
    finally:
        db.dispose()


def test_the_services_setting_bounds_its_transactions(sqlite_url, clock):
    """``max_transactions=1``: while one unit of work runs, a request waits for its turn,
    and is answered once that unit ends."""
    migrate_fresh(sqlite_url)
    settings = Settings(db_url=sqlite_url, max_transactions=1)
    with TestClient(create_app(settings, clock)) as client:
        db = client.app.state.services.db  # type: ignore[attr-defined]
        started, release = threading.Event(), threading.Event()

        def hold_the_only_turn(_session: Any) -> None:
            started.set()
            release.wait(10)

        holder = threading.Thread(target=db.read, args=(hold_the_only_turn,), daemon=True)
        holder.start()
        assert started.wait(5)
        answers: list[Any] = []
        asking = threading.Thread(
            target=lambda: answers.append(client.get("/api/v1/jobs")), daemon=True
        )
        asking.start()
        asking.join(timeout=0.5)
        assert not answers, "the request ran beside the unit of work holding the only turn"
        release.set()
        asking.join(timeout=10)
        holder.join(timeout=10)
        assert answers and answers[0].status_code == 200, answers
