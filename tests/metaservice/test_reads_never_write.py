"""Reads that never write (issue 32): a consistent-version read sends no INSERT, UPDATE
or DELETE, whatever the state of its writers, with the watermark S raised and idle
derived jobs advanced by the per-slot advancer (``barriers/advancer.py``), not by
readers; a lease writes its own rows and nothing else; a replica whose clock is behind
the one that raised S still gives source batches barriers above it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event

from metaservice.barriers import advancer, watermark
from metaservice.clock import ManualClock
from tests.metaservice.helpers import (
    API,
    SLOT,
    barrier,
    commit,
    custom_client,
    db_state,
    next_barrier,
    put_job,
    wait_for,
)
from tests.migrated import migrate_fresh

# (SQLite, PostgreSQL): the statements of the read of all 100 tables (SQLite counts its
# BEGIN): the tables with their writers, the sources' progress with S, the exactness
# rounds of the derived jobs (one here), the snapshots. The read that wrote sent 22 /
# 19 for 50 tables (test_statement_counts.py).
READ_BOUND = (5, 4)
WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


@contextmanager
def statements(client: TestClient) -> Iterator[list[str]]:
    engine = client.app.state.services.db.engine  # type: ignore[attr-defined]
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def tick(client: TestClient) -> advancer.Tick:
    services = client.app.state.services  # type: ignore[attr-defined]
    return advancer.tick(services.db, services.ctx)


def _run_derived(client: TestClient, job: str, batch_id: int, table: str, snapshot: int) -> int:
    nxt = next_barrier(client, job)
    assert nxt["ready"], nxt
    r = client.post(
        f"{API}/jobs/{job}/batches/{batch_id}/barrier",
        json={"start": nxt["start_barrier"], "end": nxt["barrier"]},
    )
    assert r.status_code == 200, r.text
    b: int = r.json()["barrier"]
    commit(client, job, batch_id, b, table, snapshot)
    return b


def _topology(client: TestClient, clock: ManualClock) -> tuple[list[str], list[str]]:
    """40 sources, 40 derived jobs reading two sources each, 20 reading two of those:
    every job runs one batch, then the sources 0-9 and the derived jobs of layer 1
    reading them keep running; the rest go idle."""
    sources = [f"ods.s{i:02d}" for i in range(40)]
    layer1 = [f"dwd.d{i:02d}" for i in range(40)]
    layer2 = [f"dws.e{i:02d}" for i in range(20)]
    for i, t in enumerate(sources):
        put_job(client, f"s{i:02d}", outputs=[t])
    for i, t in enumerate(layer1):
        put_job(client, f"d{i:02d}", inputs=[sources[i], sources[(i + 1) % 40]], outputs=[t])
    for i, t in enumerate(layer2):
        put_job(client, f"e{i:02d}", inputs=[layer1[2 * i], layer1[2 * i + 1]], outputs=[t])
    for i, t in enumerate(sources):
        commit(client, f"s{i:02d}", 0, barrier(client, f"s{i:02d}", 0)["barrier"], t, 10 + i)
    clock.advance(SLOT)
    tick(client)
    for prefix, tables in (("d", layer1), ("e", layer2)):
        for i, t in enumerate(tables):
            _run_derived(client, f"{prefix}{i:02d}", 0, t, 5_000 + 100 * i)
    for step in range(1, 3):
        for i in range(10):
            b = barrier(client, f"s{i:02d}", step)["barrier"]
            commit(client, f"s{i:02d}", step, b, sources[i], 1_000 * step + i)
        clock.advance(SLOT)
        tick(client)
        for i in range(9):
            _run_derived(client, f"d{i:02d}", step, layer1[i], 9_000 + 100 * step + i)
    return sources + layer1 + layer2, layer2


def _read(client: TestClient, tables: list[str]) -> tuple[dict[str, Any], list[str]]:
    with statements(client) as sent:
        r = client.get(f"{API}/versions/consistent", params={"tables": ",".join(tables)})
    assert r.status_code == 200, r.text
    return r.json(), sent


def test_a_consistent_read_of_a_hundred_tables_never_writes(db_url, clock):
    with custom_client(db_url, clock, idle_advance="manual") as client:
        tables, _ = _topology(client, clock)
        before = db_state(db_url)
        # The watermark behind the clock (no tick for three slots) and idle jobs not
        # advanced: the read neither seals nor advances, and answers what state gives.
        clock.advance(3 * SLOT)
        stale, sent = _read(client, tables)
        assert not [s for s in sent if WRITE.match(s)], sent
        assert len(sent) <= READ_BOUND[0 if db_url.startswith("sqlite") else 1], sent
        assert db_state(db_url) == before
        # The advancer's tick raises S and advances the idle derived jobs: the same
        # read, still without a write, answers the newer version.
        done = tick(client)
        assert done.raised == clock.now_ms() // SLOT * SLOT - SLOT and done.advanced > 0
        fresh, sent = _read(client, tables)
        assert not [s for s in sent if WRITE.match(s)], sent
        assert len(sent) <= READ_BOUND[0 if db_url.startswith("sqlite") else 1], sent
        assert fresh["barrier"] >= stale["barrier"]
        # d20 (reads s20 and s21, idle) and e10 (reads d20 and d21) did not run since
        # their first batch: the advancer moved them to the idle sources' frontier, S.
        items = client.get(f"{API}/jobs", params={"limit": 1000}).json()["items"]
        jobs = {j["name"]: j["frontier"] for j in items}
        assert jobs["d20"] == jobs["e10"] == jobs["s20"] == done.raised
        # d09 reads s09, which ran since: it is not idle, and holds the version back
        assert jobs["d09"] < done.raised
        assert fresh["barrier"] == min(jobs.values())
        again, sent = _read(client, tables)
        assert again == fresh and not [s for s in sent if WRITE.match(s)]


def test_a_lease_writes_its_own_rows_only(db_url, clock):
    with custom_client(db_url, clock, idle_advance="manual") as client:
        tables, _ = _topology(client, clock)
        clock.advance(2 * SLOT)
        params = {"tables": ",".join(tables), "lease_seconds": 60}
        with statements(client) as sent:
            r = client.get(f"{API}/versions/consistent", params=params)
        assert r.status_code == 200, r.text
        written = {
            m.group(2).strip('"').lower()
            for s in sent
            if (m := re.match(r"^\s*(INSERT INTO|UPDATE|DELETE FROM)\s+(\S+)", s, re.I))
        }
        assert written == {"leases", "lease_snapshots"}, sent


def test_a_replica_behind_the_raiser_still_gives_barriers_above_the_watermark(db_url):
    """Two replicas on one database, the second's clock 2.5 slots behind: after the
    first raised S, a source batch asking the second gets a barrier above S, and the
    frontier either shows never goes back."""
    ahead = ManualClock(1_700_000_000_000)
    behind = ManualClock(ahead.now_ms() - 2_500)
    with (
        custom_client(db_url, ahead, idle_advance="manual") as a,
        custom_client(db_url, behind, idle_advance="manual") as b,
    ):
        put_job(a, "src", outputs=["ods.src"])
        commit(a, "src", 0, barrier(a, "src", 0)["barrier"], "ods.src", 1)
        for c in (ahead, behind):
            c.advance(3 * SLOT)
        raised = tick(a).raised
        assert raised is not None and raised == ahead.now_ms() // SLOT * SLOT - SLOT
        shown = [c.get(f"{API}/jobs/src").json()["frontier"] for c in (a, b, a)]
        assert shown == [raised] * 3
        got = barrier(b, "src", 1)["barrier"]
        assert got > raised > behind.now_ms()
        assert tick(b).raised is None  # its own closed slot is below S: nothing to do
        shown = [c.get(f"{API}/jobs/src").json()["frontier"] for c in (a, b)]
        assert shown == [raised, raised]  # the open batch holds it at S
        r = a.get(f"{API}/versions/consistent", params={"tables": "ods.src"})
        assert r.status_code == 200 and r.json()["barrier"] == raised, r.text
        commit(b, "src", 1, got, "ods.src", 2)
        r = b.get(f"{API}/versions/consistent", params={"tables": "ods.src"})
        assert r.status_code == 200 and r.json()["barrier"] >= raised, r.text


def test_the_background_advancer_raises_the_watermark_each_slot(db_url):
    """On the system clock the app's lifespan runs the advancer: S follows the last
    closed slot, and idle derived jobs are advanced, with no read at all; of two
    replicas on PostgreSQL one leads."""
    import time

    from metaservice.app import create_app
    from metaservice.settings import Settings

    settings = Settings(db_url=db_url, barrier_interval_ms=100)
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        put_job(a, "src", outputs=["ods.src"])
        put_job(a, "der", inputs=["ods.src"], outputs=["dw.der"])
        commit(a, "src", 0, barrier(a, "src", 0)["barrier"], "ods.src", 1)
        time.sleep(0.25)
        nxt = next_barrier(a, "der")
        assert nxt["ready"], nxt
        r = a.post(
            f"{API}/jobs/der/batches/0/barrier",
            json={"start": nxt["start_barrier"], "end": nxt["barrier"]},
        )
        assert r.status_code == 200, r.text
        commit(a, "der", 0, r.json()["barrier"], "dw.der", 2)
        first = a.get(f"{API}/jobs/der").json()["frontier"]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.1)
            shown = b.get(f"{API}/jobs/der").json()["frontier"]
            if shown > first + 200:
                break
        assert shown > first + 200, (first, shown)  # advanced while idle, by the advancer
        source = b.get(f"{API}/jobs/src").json()["frontier"]
        assert time.time() * 1000 - source < 1_000, source  # S follows the clock
        runners = [c.app.state.services for c in (a, b)]  # type: ignore[attr-defined]
        assert all(s.ctx.idle_advance == "background" for s in runners)
        if not db_url.startswith("sqlite"):
            # each replica's advancer is a process of its own; one holds the lock
            advancers = [c.app.state.advancer for c in (a, b)]  # type: ignore[attr-defined]
            assert all(x.pid is not None for x in advancers)
            assert _advancer_lock_holders(db_url) == 1


def _advancer_lock_holders(db_url: str) -> int:
    """Sessions holding the advancer's leader lock on this schema (PostgreSQL)."""
    from sqlalchemy import create_engine, func, select, text

    from metaservice.db import normalise_url

    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            key = conn.scalar(select(func.hashtext(func.current_schema()))) & 0xFFFFFFFF
            return int(
                conn.scalar(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                        " AND classid = :lock AND objid = :key AND objsubid = 2"
                    ),
                    {"lock": watermark.ADVANCER_LOCK, "key": key},
                )
            )
    finally:
        engine.dispose()


def test_the_advancer_process_is_started_again_and_stopped_with_the_service(pg_url):
    """On PostgreSQL the advancer is a process of its own: killed, it is started again
    and leads again; the service's stop ends it."""
    import os
    import signal
    import time

    from metaservice.app import create_app
    from metaservice.settings import Settings

    migrate_fresh(pg_url)
    settings = Settings(db_url=pg_url, barrier_interval_ms=100)
    with TestClient(create_app(settings)) as client:
        process = client.app.state.advancer  # type: ignore[attr-defined]
        assert wait_for(lambda: _advancer_lock_holders(pg_url) == 1, timeout=20), "no leader"
        first = process.pid
        assert os.getsid(first) == first  # a Ctrl-C to the service's group misses it
        os.kill(first, signal.SIGKILL)
        assert wait_for(
            lambda: process.pid != first and _advancer_lock_holders(pg_url) == 1, timeout=20
        ), "not started again, or not leading"
        second = process.pid
    assert second != first
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{second}") or _is_zombie(second), "still running"
    assert _advancer_lock_holders(pg_url) == 0


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
