"""The fence every path that records a commit meets (DESIGN.md, "Every state change keeps
every answer already given"): an output added to a job takes effect from its next batch,
and an abandoned batch stays abandoned at its barrier, whether its commit comes as a
report, from a zombie driver, as an offline claim or through `metaservice reconcile`;
on one replica and across two on one PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from metaservice.clock import ManualClock
from metaservice.context import Context
from metaservice.db import Database, normalise_url
from metaservice.migrate import upgrade
from metaservice.reconcile import service as reconcile_service
from metaservice.reconcile.schemas import ReconcileReport, Stamp
from metaservice.settings import Settings
from tests.metaservice.helpers import (
    API,
    SLOT,
    assert_error,
    barrier,
    commit,
    consistent,
    custom_client,
    get_json,
    put_job,
    report,
    run_batch,
    source_and_derived,
    unchanged,
)

DERIVED_SET = "dw.detail,dw.extra,ods.orders"


def open_batches(db_url: str, job: str) -> int:
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            count = conn.execute(
                text("SELECT open_batches FROM jobs WHERE name = :name"), {"name": job}
            ).scalar_one()
            return int(count)
    finally:
        engine.dispose()


def reconcile(db_url: str, clock: ManualClock, stamps: dict[str, list[Stamp]]) -> ReconcileReport:
    db = Database(db_url)
    try:
        ctx = Context(settings=Settings(db_url=db_url), clock=clock)
        return db.write(lambda s: reconcile_service.reconcile(s, ctx, stamps))
    finally:
        db.dispose()


def skipped(result: ReconcileReport) -> list[tuple[str, str, int]]:
    return [(t.table, i.code, i.batch_id) for t in result.tables for i in t.skipped]


def abandon(client: TestClient, job: str, batch_id: int) -> dict[str, Any]:
    r = client.post(f"{API}/jobs/{job}/batches/{batch_id}/abandon")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def grant(client: TestClient, job: str, floor: int) -> dict[str, Any]:
    r = client.put(f"{API}/jobs/{job}/offline-grant", json={"floor": floor})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# -- an output added after its batch was opened -------------------------------------------


def test_a_late_report_for_an_output_added_after_its_batch_is_refused_and_changes_no_version(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    b = source_and_derived(client, clock)  # der's batch 0 committed dw.detail at der0
    put_job(client, "der", ["dw.detail", "dw.extra"], inputs=["ods.orders"])
    version = consistent(client, DERIVED_SET).json()
    assert version["barrier"] == b["der0"]
    assert version["snapshots"] == {"dw.detail": 201, "dw.extra": None, "ods.orders": 102}
    with unchanged(db_url):
        late = client.post(f"{API}/commits", json=report("der", 0, b["der0"], "dw.extra", 301))
        body = assert_error(late, 409, "output_added_after_batch", field="table")
        assert "batch 1" in body["message"]  # where the table is recorded from
    assert consistent(client, DERIVED_SET, at_or_before=version["barrier"]).json() == version
    # From the job's next batch on the table is one of its outputs: the batch needs both.
    run_batch(client, "src", 2, {"ods.orders": 103})
    clock.advance(SLOT)
    d1 = barrier(client, "der", 1)["barrier"]
    assert not commit(client, "der", 1, d1, "dw.detail", 202)["batch_committed"]
    assert commit(client, "der", 1, d1, "dw.extra", 302)["batch_committed"]
    latest = consistent(client, DERIVED_SET).json()
    assert latest["barrier"] == d1
    assert latest["snapshots"] == {"dw.detail": 202, "dw.extra": 302, "ods.orders": 103}


def test_a_batch_open_when_an_output_is_added_completes_with_the_outputs_it_was_opened_with(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    put_job(client, "src", ["ods.a"])
    b0 = barrier(client, "src", 0)["barrier"]
    put_job(client, "src", ["ods.a", "ods.b"])  # while batch 0 is open
    with unchanged(db_url):
        early = client.post(f"{API}/commits", json=report("src", 0, b0, "ods.b", 2))
        assert_error(early, 409, "output_added_after_batch", field="table")
    assert commit(client, "src", 0, b0, "ods.a", 1)["batch_committed"]
    clock.advance(SLOT)
    b1 = barrier(client, "src", 1)["barrier"]
    assert not commit(client, "src", 1, b1, "ods.a", 3)["batch_committed"]
    assert commit(client, "src", 1, b1, "ods.b", 4)["batch_committed"]
    clock.advance(SLOT)
    at_b0 = consistent(client, "ods.a,ods.b", at_or_before=b0).json()
    assert at_b0 == {"barrier": b0, "snapshots": {"ods.a": 1, "ods.b": None}}
    assert consistent(client, "ods.a,ods.b").json()["snapshots"] == {"ods.a": 3, "ods.b": 4}
    assert open_batches(db_url, "src") == 0


@pytest.mark.postgres
def test_two_replicas_refuse_the_late_report_of_an_added_output(
    pg_url: str, clock: ManualClock
) -> None:
    """The edit on one replica, the late report on the other, the version read on the
    first: the decision is the database's, not a replica's cache."""
    upgrade(pg_url)
    with custom_client(pg_url, clock) as a, custom_client(pg_url, clock) as b:
        marks = source_and_derived(a, clock)
        put_job(b, "der", ["dw.detail", "dw.extra"], inputs=["ods.orders"])
        version = consistent(b, DERIVED_SET).json()
        assert version["snapshots"]["dw.extra"] is None
        with unchanged(pg_url):
            late = a.post(f"{API}/commits", json=report("der", 0, marks["der0"], "dw.extra", 301))
            assert_error(late, 409, "output_added_after_batch", field="table")
        assert consistent(b, DERIVED_SET, at_or_before=version["barrier"]).json() == version
        run_batch(a, "src", 2, {"ods.orders": 103})
        clock.advance(SLOT)
        d1 = barrier(a, "der", 1)["barrier"]
        assert not commit(a, "der", 1, d1, "dw.detail", 202)["batch_committed"]
        assert commit(b, "der", 1, d1, "dw.extra", 302)["batch_committed"]
        assert consistent(a, DERIVED_SET).json()["snapshots"]["dw.extra"] == 302


def test_reconcile_skips_the_stamp_of_an_output_added_after_its_batch(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    b = source_and_derived(client, clock)
    put_job(client, "der", ["dw.detail", "dw.extra"], inputs=["ods.orders"])
    version = consistent(client, DERIVED_SET).json()
    stamps = {"dw.extra": [Stamp(snapshot_id=301, barrier=b["der0"], job="der", batch_id=0)]}
    with unchanged(db_url):
        result = reconcile(db_url, clock, stamps)
    assert skipped(result) == [("dw.extra", "output_added_after_batch", 0)]
    assert result.ok and result.added == 0
    assert consistent(client, DERIVED_SET, at_or_before=version["barrier"]).json() == version


# -- an abandoned batch, on every path ----------------------------------------------------


def abandoned_source(client: TestClient, clock: ManualClock) -> tuple[int, int, dict[str, Any]]:
    """``src`` commits batch 0 (snapshot 1); its batch 1 is given a barrier, the driver
    dies, and an operator abandons it. Returns both barriers and the version after."""
    put_job(client, "src", ["ods.a"])
    put_job(client, "der", ["dw.d"], inputs=["ods.a"])
    b0 = run_batch(client, "src", 0, {"ods.a": 1})
    clock.advance(SLOT)
    b1 = barrier(client, "src", 1)["barrier"]
    clock.advance(3 * SLOT)
    abandon(client, "src", 1)
    version = consistent(client, "ods.a").json()
    assert version["barrier"] >= b1 and version["snapshots"] == {"ods.a": 1}
    return b0, b1, version


def test_reconcile_skips_an_abandoned_batchs_stamp_and_keeps_the_jobs_count(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    b0, b1, version = abandoned_source(client, clock)
    stamps = {
        "ods.a": [
            Stamp(snapshot_id=1, barrier=b0, job="src", batch_id=0),
            Stamp(snapshot_id=2, barrier=b1, job="src", batch_id=1),  # the dead driver's
        ]
    }
    with unchanged(db_url):
        result = reconcile(db_url, clock, stamps)
    assert skipped(result) == [("ods.a", "batch_abandoned", 1)]
    assert result.ok and result.added == 0
    assert consistent(client, "ods.a", at_or_before=version["barrier"]).json() == version
    # The idle source still follows the clock, and the next batch holds it as usual.
    clock.advance(5 * SLOT)
    assert consistent(client, "ods.a").json()["barrier"] == clock.now_ms() - SLOT
    b2 = barrier(client, "src", 2)["barrier"]
    clock.advance(3 * SLOT)
    assert consistent(client, "ods.a").json()["barrier"] == b2 - SLOT
    commit(client, "src", 2, b2, "ods.a", 3)
    assert open_batches(db_url, "src") == 0


def test_reconcile_never_closes_an_abandoned_batch_as_finished(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    """A later stamped batch proves the open batches before it finished; an abandoned one
    is not open (the abandon already took it off the job's count)."""
    b0, _, version = abandoned_source(client, clock)
    clock.advance(SLOT)
    b2 = run_batch(client, "src", 2, {"ods.a": 3})
    stamps = {
        "ods.a": [
            Stamp(snapshot_id=1, barrier=b0, job="src", batch_id=0),
            Stamp(snapshot_id=3, barrier=b2, job="src", batch_id=2),
        ]
    }
    with unchanged(db_url):
        result = reconcile(db_url, clock, stamps)
    assert result.ok and result.added == 0 and result.already_present == 2
    assert open_batches(db_url, "src") == 0
    assert consistent(client, "ods.a", at_or_before=version["barrier"]).json() == version


def test_an_offline_claim_of_an_abandoned_batch_replays_it_or_is_refused_at_its_old_barrier(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    """The restarted driver ran the abandoned batch offline: at a new barrier the claim
    replays it there (its commit is recorded, not lost); at the barrier it was abandoned
    at, readers have moved past it and the claim is refused."""
    put_job(client, "src", ["ods.a"])
    grant(client, "src", floor=0)
    b0 = barrier(client, "src", 0)["barrier"]
    clock.advance(3 * SLOT)
    abandon(client, "src", 0)
    grant(client, "src", floor=clock.now_ms())  # the restarted driver reports in
    clock.advance(SLOT)
    with unchanged(db_url):
        old = client.post(f"{API}/jobs/src/batches/0/barrier", json={"barrier": b0})
        assert_error(old, 409, "batch_abandoned", field="barrier")
        many = client.post(
            f"{API}/jobs/src/claims", json={"claims": [{"batch_id": 0, "barrier": b0}]}
        )
        assert_error(many, 409, "batch_abandoned", field="claims.0.barrier")
    claimed = clock.now_ms()  # on the grid: the service is unreachable, the job claims it
    r = client.post(
        f"{API}/jobs/src/claims", json={"claims": [{"batch_id": 0, "barrier": claimed}]}
    )
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["barrier"] == claimed
    assert open_batches(db_url, "src") == 1  # it holds the frontier again
    assert consistent(client, "ods.a").json()["barrier"] < claimed
    assert commit(client, "src", 0, claimed, "ods.a", 777)["batch_committed"]
    items = get_json(client, "/tables/ods.a/snapshots")["items"]
    assert [(i["batch_id"], i["barrier"], i["snapshot_id"]) for i in items] == [(0, claimed, 777)]
    assert open_batches(db_url, "src") == 0


def test_a_zombie_commit_and_its_redelivery_of_an_abandoned_batch_change_nothing(
    client: TestClient, clock: ManualClock, db_url: str
) -> None:
    _, b1, version = abandoned_source(client, clock)
    late = report("src", 1, b1, "ods.a", 2)
    with unchanged(db_url):
        for _ in range(2):  # the report, then the outbox delivering it again
            assert_error(client.post(f"{API}/commits", json=late), 409, "batch_abandoned")
        batch = client.post(f"{API}/commits/batch", json={"commits": [late]})
        assert_error(batch, 409, "batch_abandoned", field="commits.0.batch_id")
    assert consistent(client, "ods.a", at_or_before=version["barrier"]).json() == version
    assert open_batches(db_url, "src") == 0
