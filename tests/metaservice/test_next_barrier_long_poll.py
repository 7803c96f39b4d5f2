"""The next-barrier long poll waits for a change instead of re-running the locking round
(issue 13): it answers a fixed plan without taking a row lock, sends few statements
while nothing it waits on moves, and answers soon after a report makes the batch ready,
on the same replica (notified) and on another one on the same PostgreSQL (it looks
again shortly)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from metaservice.barriers import endpoints
from tests.metaservice.helpers import (
    SLOT,
    commit,
    custom_client,
    in_thread,
    locked_for_update,
    next_barrier,
    put_job,
    run_batch,
)
from tests.metaservice.test_statement_counts import counting
from tests.migrated import migrate_fresh


def two_layers(client: TestClient, clock: Any) -> int:
    """``s`` writes ods.s; ``d1`` reads it into dw.a and has opened (not reported) its
    batch 0, ending at the returned barrier; ``d2`` reads dw.a into dw.b."""
    put_job(client, "s", ["ods.s"])
    put_job(client, "d1", ["dw.a"], inputs=["ods.s"])
    put_job(client, "d2", ["dw.b"], inputs=["dw.a"])
    run_batch(client, "s", 0, {"ods.s": 1})
    clock.advance(2 * SLOT)
    first = next_barrier(client, "d1", after=0, source="ods.s")
    assert first["ready"], first
    r = client.post("/api/v1/jobs/d1/batches/0/barrier", json={"start": 0, "end": first["barrier"]})
    assert r.status_code == 200, r.text
    return int(first["barrier"])


def test_a_waiting_long_poll_is_woken_by_the_report_that_makes_its_batch_ready(
    client, clock, db_url, monkeypatch
):
    # Looking again on its own only every 10 s: an answer well before that came from
    # the report's notification.
    monkeypatch.setattr(endpoints, "NEXT_BARRIER_RECHECK_S", 10.0)
    b0 = two_layers(client, clock)
    with counting(client) as statements:
        thread, answers = in_thread(
            lambda: next_barrier(client, "d2", after=0, source="dw.a", wait_ms=20_000)
        )
        time.sleep(1.0)
        assert not answers, "d2 was answered before d1 committed its batch"
    # The old poll re-ran the round (about 10 statements) every 50 ms: 200 a second.
    assert statements.count <= 20, f"{statements.count} statements while nothing moved"
    commit(client, "d1", 0, b0, "dw.a", 11)
    reported = time.monotonic()
    thread.join(timeout=15)
    assert answers and answers[0]["ready"] and answers[0]["barrier"] == b0, answers
    assert time.monotonic() - reported < 5, "the long poll was not woken by the report"


def test_a_long_poll_on_another_replica_answers_soon_after_the_report(pg_url, clock):
    migrate_fresh(pg_url)
    with custom_client(pg_url, clock) as one, custom_client(pg_url, clock) as other:
        b0 = two_layers(one, clock)
        thread, answers = in_thread(
            lambda: next_barrier(other, "d2", after=0, source="dw.a", wait_ms=20_000)
        )
        time.sleep(0.5)
        assert not answers
        commit(one, "d1", 0, b0, "dw.a", 11)
        reported = time.monotonic()
        thread.join(timeout=15)
        assert answers and answers[0]["ready"] and answers[0]["barrier"] == b0, answers
        assert time.monotonic() - reported < 5, "the other replica's poll waited out wait_ms"


def test_a_report_on_one_replica_wakes_a_long_poll_on_another(pg_url, clock, monkeypatch):
    # Looking again on its own only every 10 s: an answer well before that came from
    # the other replica's NOTIFY (metaservice/barriers/replica_changes.py).
    monkeypatch.setattr(endpoints, "NEXT_BARRIER_RECHECK_S", 10.0)
    migrate_fresh(pg_url)
    with custom_client(pg_url, clock) as one, custom_client(pg_url, clock) as other:
        for replica in (one, other):
            replicas = replica.app.state.services.changes.on_local.__self__  # type: ignore[attr-defined,union-attr]
            assert replicas.listening.wait(10), "the replica does not listen"
        b0 = two_layers(one, clock)
        thread, answers = in_thread(
            lambda: next_barrier(other, "d2", after=0, source="dw.a", wait_ms=20_000)
        )
        time.sleep(1.0)
        assert not answers
        commit(one, "d1", 0, b0, "dw.a", 11)
        reported = time.monotonic()
        thread.join(timeout=15)
        assert answers and answers[0]["ready"] and answers[0]["barrier"] == b0, answers
        assert time.monotonic() - reported < 3, "the other replica's poll was not woken"


def test_the_advancer_process_wakes_every_poll_of_a_replica(pg_url, clock):
    # The advancer's process serves no poll: it tells the replicas through NOTIFY
    # that every job may have moved (metaservice/barriers/advancer.py).
    import asyncio

    from metaservice.barriers.changes import EVERY_JOB
    from metaservice.barriers.replica_changes import ReplicaNotifier

    migrate_fresh(pg_url)
    with custom_client(pg_url, clock) as one:
        changes = one.app.state.services.changes
        assert changes.on_local.__self__.listening.wait(10), "the replica does not listen"  # type: ignore[union-attr]
        notify = ReplicaNotifier(pg_url)
        try:

            async def poll() -> tuple[bool, float]:
                seen = changes.mark()
                began = time.monotonic()
                waiting = asyncio.ensure_future(changes.wait(["src"], since=seen, timeout=10))
                await asyncio.sleep(0.2)
                await asyncio.to_thread(notify, [EVERY_JOB])
                return await waiting, time.monotonic() - began

            woken, took = one.portal.call(poll)  # type: ignore[union-attr]
        finally:
            notify.close()
    assert woken and took < 5, (woken, took)


def test_replicas_of_other_schemas_do_not_hear_each_other(pg_url, clock):
    from sqlalchemy import create_engine

    from metaservice.barriers.replica_changes import ReplicaChanges, channel_for

    migrate_fresh(pg_url)
    with custom_client(pg_url, clock) as one:
        mine = one.app.state.services.changes.on_local.__self__  # type: ignore[union-attr]
        assert isinstance(mine, ReplicaChanges)
        engine = create_engine(pg_url)
        with engine.connect() as conn:
            schema = conn.exec_driver_sql("SELECT current_schema()").scalar_one()
        engine.dispose()
        assert mine.channel == channel_for(schema) != channel_for(schema + "x")


def test_a_replica_stops_listening_at_once(pg_url, clock, monkeypatch):
    # The listener waits for notifications a long while at a time; stopping the replica
    # wakes it (a note of its own) rather than waiting that out (it took 0.5 s a stop).
    from metaservice.barriers import replica_changes

    monkeypatch.setattr(replica_changes, "LISTEN_WAIT_S", 60.0)
    migrate_fresh(pg_url)
    with custom_client(pg_url, clock) as one:
        mine = one.app.state.services.changes.on_local.__self__  # type: ignore[union-attr]
        assert mine.listening.wait(10), "the replica does not listen"
        time.sleep(0.2)  # the listener is inside its wait
    alive = [t.name for t in mine._threads if t.is_alive()]
    assert not alive, f"still running after the replica stopped: {alive}"


@contextmanager
def rows_locked(db_url: str) -> Iterator[None]:
    """Every job row locked by another transaction (PostgreSQL: FOR UPDATE; SQLite: the
    database's write lock, BEGIN IMMEDIATE) until the block ends."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    with locked_for_update(db_url, "SELECT id FROM jobs ORDER BY id FOR UPDATE"):
        yield


def test_a_long_poll_for_a_fixed_plan_takes_no_row_lock(client, clock, db_url):
    put_job(client, "sa", ["ods.a"])
    put_job(client, "sb", ["ods.b"])
    put_job(client, "d", ["dw.d"], inputs=["ods.a", "ods.b"])
    run_batch(client, "sa", 0, {"ods.a": 1})
    run_batch(client, "sb", 0, {"ods.b": 2})
    clock.advance(2 * SLOT)
    first = next_barrier(client, "d", after=0, source="ods.a", wait_ms=2_000)
    assert first["ready"], first
    with rows_locked(db_url):
        started = time.monotonic()
        thread, answers = in_thread(
            lambda: next_barrier(client, "d", after=0, source="ods.b", wait_ms=2_000)
        )
        thread.join(timeout=10)
        took = time.monotonic() - started
        assert answers == [first], answers
    assert took < 1.5, f"the poll waited {took:.1f} s for the locks of the jobs' rows"


@pytest.mark.parametrize("wait_ms", [0, 2_000])
def test_a_fixed_plan_is_answered_the_same_with_or_without_a_wait(client, clock, db_url, wait_ms):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    run_batch(client, "s", 0, {"ods.s": 1})
    clock.advance(2 * SLOT)
    first = next_barrier(client, "d", after=0, source="ods.s")
    run_batch(client, "s", 1, {"ods.s": 2})
    clock.advance(5 * SLOT)  # more is ready now; the plan after 0 stays
    assert next_barrier(client, "d", after=0, source="ods.s", wait_ms=wait_ms) == first
    assert next_barrier(client, "d", wait_ms=wait_ms) == first
