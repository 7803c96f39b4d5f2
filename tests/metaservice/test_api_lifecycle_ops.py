"""API tests for the expiry plan (GET /tables/{t}/expirable, G5) and the operational endpoints."""

from __future__ import annotations

import random
import re

import pytest
from fastapi.testclient import TestClient

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.lifecycle import service as lifecycle
from metaservice.migrate import head_revision, upgrade
from metaservice.settings import Settings
from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    commit,
    consistent,
    custom_client,
    get_json,
    put_job,
    run_batch,
    source_and_derived,
    unchanged,
)


def _snapshots(client, clock, job, table, ids):
    """One source batch per slot, committing each of ``ids`` in turn; the clock moves on."""
    start = get_json(client, f"/tables/{table}/snapshots")["total"]
    for i, snapshot in enumerate(ids):
        run_batch(client, job, start + i, {table: snapshot})
        clock.advance(SLOT)


def _plan(client, table):
    plan = get_json(client, f"/tables/{table}/expirable")
    expirable = [s["snapshot_id"] for s in plan["expirable"]]
    kept = {s["snapshot_id"]: s["reasons"] for s in plan["kept"]}
    return plan, expirable, kept


# -- GET /tables/{table}/expirable --------------------------------------------------------


def test_expiry_plan_of_a_table_without_snapshots_is_empty(client):
    put_job(client, "src", ["ods.orders"])
    assert get_json(client, "/tables/ods.orders/expirable") == {
        "table": "ods.orders",
        "oldest_in_use": None,
        "expiry_horizon": None,
        "expirable": [],
        "kept": [],
    }


def test_expiry_plan_keeps_only_the_current_snapshot_when_nothing_else_uses_one(client, clock):
    put_job(client, "src", ["ods.orders"])
    _snapshots(client, clock, "src", "ods.orders", [1, 2, 3])
    plan = get_json(client, "/tables/ods.orders/expirable")
    assert plan["oldest_in_use"] == 3
    assert plan["expirable"] == [
        {"snapshot_id": 1, "barrier": T0, "batch_id": 0, "reasons": []},
        {"snapshot_id": 2, "barrier": T0 + SLOT, "batch_id": 1, "reasons": []},
    ]
    assert plan["kept"] == [
        {
            "snapshot_id": 3,
            "barrier": T0 + 2 * SLOT,
            "batch_id": 2,
            "reasons": ["current snapshot", "retention: one of the newest 1"],
        }
    ]


def test_expiry_plan_ignores_empty_batches(client, clock):
    put_job(client, "src", ["ods.orders"])
    _snapshots(client, clock, "src", "ods.orders", [1, 2, None])
    _, expirable, kept = _plan(client, "ods.orders")
    assert (expirable, list(kept)) == ([1], [2])
    assert "current snapshot" in kept[2]


def test_expiry_plan_keeps_the_newest_n_snapshots_by_retention(db_url, clock):
    with custom_client(db_url, clock, retention_keep_last=3) as c:
        put_job(c, "src", ["ods.orders"])
        _snapshots(c, clock, "src", "ods.orders", [1, 2, 3, 4, 5])
        plan, expirable, kept = _plan(c, "ods.orders")
    assert expirable == [1, 2]
    assert plan["oldest_in_use"] == 3
    assert kept == {
        3: ["retention: one of the newest 3"],
        4: ["retention: one of the newest 3"],
        5: ["current snapshot", "retention: one of the newest 3"],
    }


def test_expiry_plan_keeps_snapshots_younger_than_the_retention_age(db_url, clock):
    with custom_client(db_url, clock, retention_keep_for_seconds=2) as c:
        put_job(c, "src", ["ods.orders"])
        _snapshots(c, clock, "src", "ods.orders", [1, 2, 3, 4])  # reported at T0 .. T0+3s
        _, expirable, kept = _plan(c, "ods.orders")  # now T0+4s: T0+2s and later are young
        assert expirable == [1, 2]
        assert kept[3] == ["retention: younger than 2 s"]
        assert "retention: younger than 2 s" in kept[4]
        clock.advance(10 * SLOT)
        _, expirable, kept = _plan(c, "ods.orders")
    assert (expirable, list(kept)) == ([1, 2, 3], [4])


def test_expiry_plan_keeps_a_leased_snapshot_until_the_lease_ends(client, clock):
    put_job(client, "src", ["ods.orders"])
    _snapshots(client, clock, "src", "ods.orders", [1, 2, 3, 4])
    lease = consistent(client, "ods.orders", at_or_before=T0 + SLOT, lease_seconds=10).json()
    assert lease["snapshots"] == {"ods.orders": 2}
    other = consistent(client, "ods.orders", at_or_before=T0, lease_seconds=3600).json()
    assert other["snapshots"] == {"ods.orders": 1}
    plan, expirable, kept = _plan(client, "ods.orders")
    assert (expirable, plan["oldest_in_use"]) == ([], 1)
    assert kept[1] == [f"lease {other['lease_id']} until {other['lease_expires_ms']}"]
    assert kept[2] == [f"lease {lease['lease_id']} until {lease['lease_expires_ms']}"]
    assert kept[3] == ["newer than the oldest snapshot in use"]
    assert client.delete(f"{API}/leases/{other['lease_id']}").status_code == 204
    _, expirable, kept = _plan(client, "ods.orders")
    assert expirable == [1]
    assert kept[2][0].startswith("lease ")
    clock.advance(10_000)  # the lease on snapshot 2 expires
    _, expirable, _ = _plan(client, "ods.orders")
    assert expirable == [1, 2, 3]


def test_expiry_plan_keeps_the_start_position_of_a_derived_reader(client, clock):
    source_and_derived(client, clock)  # der committed up to T0+1s: snapshot 102 of ods.orders
    _snapshots(client, clock, "src", "ods.orders", [103, 104])
    plan, expirable, kept = _plan(client, "ods.orders")
    assert expirable == [101]
    assert plan["oldest_in_use"] == 102
    assert kept[102] == [f"start position of job 'der' (committed up to barrier {T0 + SLOT})"]
    assert kept[103] == ["newer than the oldest snapshot in use"]
    # after der moves on, its old start position may go
    assert run_batch(client, "der", 1, {"dw.detail": 202}) == T0 + 2 * SLOT
    assert run_batch(client, "der", 2, {"dw.detail": 203}) == T0 + 3 * SLOT
    _, expirable, kept = _plan(client, "ods.orders")
    assert expirable == [101, 102, 103]
    assert any(r.startswith("start position of job 'der'") for r in kept[104])


def test_expiry_plan_keeps_everything_a_reader_has_not_started_on(client, clock):
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    _snapshots(client, clock, "src", "ods.orders", [1, 2, 3])
    _, expirable, kept = _plan(client, "ods.orders")
    assert expirable == []
    assert kept[1] == ["start position of job 'der' (committed up to barrier 0)"]


def test_expiry_plan_never_lists_a_snapshot_in_use(client, clock):
    """G5 over a mixed run: source commits, derived batches, leases taken and ended."""
    rng = random.Random(5)
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    leases: dict[str, tuple[int, int | None]] = {}  # id -> (expiry, snapshot)
    src_batch, der_batch, next_snapshot = 0, 0, 1
    for _ in range(14):
        step = rng.choice(["src", "src", "der", "lease", "unlease", "tick"])
        if step == "src":
            run_batch(client, "src", src_batch, {"ods.orders": next_snapshot})
            src_batch, next_snapshot = src_batch + 1, next_snapshot + 1
        elif step == "der" and get_json(client, "/jobs/der/next-barrier")["ready"]:
            run_batch(client, "der", der_batch, {"dw.detail": 1000 + der_batch})
            der_batch += 1
        elif step == "lease":
            r = consistent(client, "ods.orders", lease_seconds=rng.randint(1, 4))
            if r.status_code == 200:
                body = r.json()
                leases[body["lease_id"]] = (
                    body["lease_expires_ms"],
                    body["snapshots"]["ods.orders"],
                )
        elif step == "unlease" and leases:
            lease_id = sorted(leases)[0]
            assert client.delete(f"{API}/leases/{lease_id}").status_code == 204
            del leases[lease_id]
        clock.advance(rng.choice([0, 400, SLOT, 2500]))

        listing = get_json(client, "/tables/ods.orders/snapshots", limit=1000)["items"]
        real = [s for s in listing if s["snapshot_id"] is not None]
        plan = get_json(client, "/tables/ods.orders/expirable")
        planned = plan["expirable"] + plan["kept"]
        assert [p["snapshot_id"] for p in planned] == [s["snapshot_id"] for s in real]
        if not real:
            continue
        in_use = {real[-1]["snapshot_id"]}
        now = clock.now_ms()
        in_use |= {snap for expiry, snap in leases.values() if expiry > now and snap is not None}
        der_frontier = get_json(client, "/jobs/der")["frontier"]
        at_start = [s["snapshot_id"] for s in real if s["barrier"] <= der_frontier]
        in_use.add(at_start[-1] if at_start else real[0]["snapshot_id"])
        expirable = {p["snapshot_id"] for p in plan["expirable"]}
        assert not expirable & in_use, (expirable, in_use)
        assert all(p["reasons"] == [] for p in plan["expirable"])
        assert all(p["reasons"] for p in plan["kept"])


def test_expiry_plan_keeps_a_leased_snapshot_of_a_deleted_writer_in_the_tables_history(
    client, clock
):
    """s5_lease.py: the leased snapshot's writer was deleted and the table got a new one
    (the plan answered 500). The table keeps its history across writers, so the leased
    snapshot is still among its snapshots and the lease keeps it as any lease does."""
    put_job(client, "s", ["ods.s"])
    run_batch(client, "s", 0, {"ods.s": 11})
    clock.advance(2 * SLOT)
    lease = consistent(client, "ods.s", lease_seconds=3600).json()
    assert lease["snapshots"] == {"ods.s": 11}
    assert client.delete(f"{API}/jobs/s").status_code == 204
    put_job(client, "s2", ["ods.s"])
    _snapshots(client, clock, "s2", "ods.s", [12, 13])
    plan, expirable, kept = _plan(client, "ods.s")
    assert (expirable, plan["oldest_in_use"]) == ([], 11)
    assert any(f"lease {lease['lease_id']}" in reason for reason in kept[11]), kept
    s = client.app.state.services
    reserved = s.db.write(lambda session: lifecycle.reserve_expiry(session, s.ctx, "ods.s"))
    assert reserved.expirable == []
    assert client.delete(f"{API}/leases/{lease['lease_id']}").status_code == 204
    assert _plan(client, "ods.s")[1] == [11, 12]


def test_expiry_plan_of_unknown_or_invalid_table_gives_4xx(client, db_url):
    with unchanged(db_url):
        assert_error(
            client.get(f"{API}/tables/ods.nope/expirable"), 404, "not_found", field="table"
        )
        assert_error(client.get(f"{API}/tables/nope/expirable"), 422, "invalid", field="table")


# -- operations ---------------------------------------------------------------------------


def test_healthz_answers_ok(client):
    r = client.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


def test_readyz_is_ready_on_a_migrated_database(client):
    r = client.get("/readyz")
    assert (r.status_code, r.json()) == (200, {"status": "ready", "migration": head_revision()})


def test_readyz_is_503_on_a_database_that_is_not_migrated(tmp_path):
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'empty.db'}"), ManualClock(T0))
    with TestClient(app) as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    assert (r.json()["status"], r.json()["code"]) == ("unavailable", "database_behind")
    assert "metaservice db upgrade" in r.json()["message"]


def _metric(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_count_barriers_commits_and_requests(client):
    before = client.get("/metrics").text
    put_job(client, "src", ["ods.orders"])
    b = barrier(client, "src", 0)["barrier"]
    commit(client, "src", 0, b, "ods.orders", 1)
    commit(client, "src", 0, b, "ods.orders", 1)
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    after = r.text
    name = "metaservice_batch_barriers_total"
    assert _metric(after, name) - _metric(before, name) == 1
    name = "metaservice_commit_reports_total"
    assert _metric(after, name, result="recorded") - _metric(before, name, result="recorded") == 1
    assert _metric(after, name, result="duplicate") - _metric(before, name, result="duplicate") == 1
    name = "metaservice_http_request_duration_seconds_count"
    put = {"method": "PUT", "status": "201"}
    assert _metric(after, name, **put) - _metric(before, name, **put) == 1


def test_metrics_label_requests_with_the_full_route_path(client):
    put_job(client, "labelled", ["ods.labelled"])
    text = client.get("/metrics").text
    name = "metaservice_http_request_duration_seconds_count"
    assert _metric(text, name, method="PUT", route="/api/v1/jobs/{job}", status="201") >= 1


def test_docs_and_openapi_describe_every_endpoint(client):
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "text/html" in docs.headers["content-type"]
    assert re.search("swagger", docs.text, re.IGNORECASE)
    spec = client.get("/openapi.json").json()
    expected = {
        "/api/v1/jobs/{job}": {"put", "get"},
        "/api/v1/jobs": {"get"},
        "/api/v1/jobs/{job}/events": {"post"},
        "/api/v1/tables": {"get"},
        "/api/v1/tables/{table}": {"get"},
        "/api/v1/tables/{table}/snapshots": {"get"},
        "/api/v1/jobs/{job}/batches/{batch_id}/barrier": {"post"},
        "/api/v1/jobs/{job}/next-barrier": {"get"},
        "/api/v1/commits": {"post"},
        "/api/v1/commits/batch": {"post"},
        "/api/v1/lineage": {"get"},
        "/api/v1/lineage/snapshots/{table}/{snapshot_id}": {"get"},
        "/api/v1/versions/consistent": {"get"},
        "/api/v1/leases": {"post"},
        "/api/v1/leases/{lease_id}": {"delete"},
        "/api/v1/delay": {"get"},
        "/api/v1/tables/{table}/expirable": {"get"},
        "/healthz": {"get"},
        "/readyz": {"get"},
        "/metrics": {"get"},
    }
    for path, methods in expected.items():
        assert path in spec["paths"], path
        assert methods <= set(spec["paths"][path]), (path, spec["paths"][path].keys())


def test_unknown_path_and_wrong_method_give_json_404_and_405(client):
    assert_error(client.get(f"{API}/nothing-here"), 404, "not_found")
    assert_error(client.delete(f"{API}/jobs"), 405, "method_not_allowed")


@pytest.mark.parametrize("db", ["sqlite_url", pytest.param("pg_url", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("migration", [None, "0009"])
def test_requests_on_a_database_behind_this_version_say_to_migrate_it(request, db, migration):
    """A service started on an unmigrated database (or one a migration behind: 0010 added
    columns to `tables`) answers 503 `database_behind` naming what is missing, not
    "cannot reach its database" or 500, and changes nothing."""
    url = request.getfixturevalue(db)
    if migration is not None:
        upgrade(url, migration)
    with TestClient(create_app(Settings(db_url=url), ManualClock(T0))) as c:
        for r in (c.get(f"{API}/tables"), c.put(f"{API}/jobs/j", json={"outputs": ["ns.t"]})):
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["code"] == "database_behind"
            assert "metaservice db upgrade" in body["message"]
            missing = (
                "log_mode" if migration else ("tables" if r.request.method == "GET" else "jobs")
            )
            assert missing in body["message"]  # the driver's words name what is missing
            assert "Retry-After" not in r.headers  # not transient: waiting will not help
    upgrade(url)  # nothing was applied: the migrated database has no job
    with TestClient(create_app(Settings(db_url=url), ManualClock(T0))) as c:
        assert c.get(f"{API}/jobs").json()["items"] == []
