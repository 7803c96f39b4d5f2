"""Bearer tokens and roles: who may query, who may report progress, who may administer.

Every route of the app is classified in ``NEEDS`` (or listed in ``OPEN``), and
``test_every_route_is_classified`` fails for a route in neither, so a new
endpoint cannot ship without a decision about who may call it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from metaservice.app import create_app
from metaservice.auth import service as auth_service
from metaservice.auth.schemas import Role
from metaservice.cli import app as cli_app
from metaservice.clock import ManualClock
from metaservice.context import Context
from metaservice.db import Database
from metaservice.settings import Settings
from tests.metaservice.helpers import (
    API,
    T0,
    assert_error,
    db_state,
    report,
    run_batch,
    source_and_derived,
    unchanged,
)

# Open with auth on, on purpose: probes, scrapers (see METASERVICE_METRICS_PUBLIC) and the docs.
OPEN = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
}

# The Iceberg REST catalog: any token reads (every role), and its refusals have the REST
# spec's form, so test_iceberg_rest checks them rather than the loops here.
CATALOG = {
    ("GET", "/iceberg/v1/config"),
    ("GET", "/iceberg/v1/{prefix}/namespaces"),
    ("GET", "/iceberg/v1/{prefix}/namespaces/{namespace}"),
    ("HEAD", "/iceberg/v1/{prefix}/namespaces/{namespace}"),
    ("GET", "/iceberg/v1/{prefix}/namespaces/{namespace}/tables"),
    ("GET", "/iceberg/v1/{prefix}/namespaces/{namespace}/tables/{table}"),
    ("HEAD", "/iceberg/v1/{prefix}/namespaces/{namespace}/tables/{table}"),
    *((method, "/iceberg/v1/{path:path}") for method in ("GET", "POST", "PUT", "DELETE", "PATCH")),
}

# The least role each route needs.
NEEDS: dict[tuple[str, str], Role] = {
    ("GET", "/api/v1/jobs"): Role.READER,
    ("GET", "/api/v1/jobs/{job}"): Role.READER,
    ("PUT", "/api/v1/jobs/{job}"): Role.WRITER,
    ("DELETE", "/api/v1/jobs/{job}"): Role.ADMIN,
    ("POST", "/api/v1/jobs/{job}/events"): Role.WRITER,
    ("POST", "/api/v1/jobs/{job}/batches/{batch_id}/barrier"): Role.WRITER,
    ("GET", "/api/v1/jobs/{job}/next-barrier"): Role.WRITER,  # fixes the job's next target
    ("GET", "/api/v1/jobs/{job}/ranges"): Role.READER,
    ("POST", "/api/v1/jobs/{job}/batches/{batch_id}/abandon"): Role.ADMIN,
    ("POST", "/api/v1/jobs/{job}/claims"): Role.WRITER,
    ("PUT", "/api/v1/jobs/{job}/offline-grant"): Role.WRITER,
    ("DELETE", "/api/v1/jobs/{job}/offline-grant"): Role.WRITER,
    ("GET", "/api/v1/tables"): Role.READER,
    ("GET", "/api/v1/tables/{table}"): Role.READER,
    ("GET", "/api/v1/tables/{table}/snapshots"): Role.READER,
    ("GET", "/api/v1/tables/{table}/expirable"): Role.READER,
    ("GET", "/api/v1/tables/{table}/leases"): Role.READER,  # the console's (metaservice/ui)
    ("POST", "/api/v1/tables/{table}/expire"): Role.ADMIN,
    ("GET", "/api/v1/tables/{table}/retention"): Role.READER,
    ("PUT", "/api/v1/tables/{table}/retention"): Role.ADMIN,
    ("DELETE", "/api/v1/tables/{table}/retention"): Role.ADMIN,
    ("GET", "/api/v1/tables/{table}/log"): Role.READER,  # asks the table's log service
    ("PUT", "/api/v1/tables/{table}/log"): Role.WRITER,
    ("DELETE", "/api/v1/tables/{table}/log"): Role.WRITER,
    ("POST", "/api/v1/commits"): Role.WRITER,
    ("POST", "/api/v1/commits/batch"): Role.WRITER,
    ("GET", "/api/v1/versions/consistent"): Role.READER,
    ("POST", "/api/v1/leases"): Role.WRITER,
    ("DELETE", "/api/v1/leases/{lease_id}"): Role.WRITER,
    ("POST", "/api/v1/versions/tags"): Role.ADMIN,
    ("GET", "/api/v1/versions/tags"): Role.READER,
    ("GET", "/api/v1/versions/tags/{name}"): Role.READER,
    ("DELETE", "/api/v1/versions/tags/{name}"): Role.ADMIN,
    ("POST", "/api/v1/revisions"): Role.ADMIN,
    ("GET", "/api/v1/revisions"): Role.READER,
    ("GET", "/api/v1/revisions/{revision_id}"): Role.READER,
    ("DELETE", "/api/v1/revisions/{revision_id}"): Role.ADMIN,
    ("POST", "/api/v1/revisions/{revision_id}/swap"): Role.ADMIN,
    ("GET", "/api/v1/lineage"): Role.READER,
    ("POST", "/api/v1/lineage"): Role.WRITER,  # OpenLineage ingest
    ("GET", "/api/v1/lineage/snapshots/{table}/{snapshot_id}"): Role.READER,
    ("GET", "/api/v1/delay"): Role.READER,
    ("POST", "/api/v1/tokens"): Role.ADMIN,
    ("GET", "/api/v1/tokens"): Role.ADMIN,
    ("GET", "/api/v1/whoami"): Role.READER,
    ("DELETE", "/api/v1/tokens/{token_id}"): Role.ADMIN,
}

# Concrete values for path parameters, and what else each route is called with.
PATH_VALUES = {
    "job": "der",
    "batch_id": "1",
    "table": "dw.detail",
    "snapshot_id": "201",
    "lease_id": "no-such-lease",
    "token_id": "999999",
    "name": "no-such-tag",
    "revision_id": "999999",
}
QUERIES = {
    "/api/v1/versions/consistent": {"tables": "ods.orders,dw.detail"},
    "/api/v1/lineage": {"table": "dw.detail"},
    "/api/v1/delay": {"table": "dw.detail"},
}
BODIES = {
    ("PUT", "/api/v1/jobs/{job}"): {"inputs": ["ods.orders"], "outputs": ["dw.detail"]},
    ("POST", "/api/v1/jobs/{job}/events"): {"event": "progress", "batch_id": 1},
    ("POST", "/api/v1/commits"): report("der", 1, T0 + 2000, "dw.detail", 202),
    ("POST", "/api/v1/commits/batch"): {"commits": [report("der", 1, T0 + 2000, "dw.detail", 202)]},
    ("PUT", "/api/v1/jobs/{job}/offline-grant"): {"floor": 0},
    ("POST", "/api/v1/lineage"): {
        "eventType": "START",
        "eventTime": "2023-11-14T22:13:20Z",
        "producer": "https://example.org/producer",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": "0190b2a4-7c1e-7c3a-9d6e-2f4b5a6c7d8e"},
        "job": {"namespace": "airflow", "name": "etl.enrich"},
        "inputs": [],
        "outputs": [],
    },
    ("POST", "/api/v1/jobs/{job}/claims"): {"claims": [{"batch_id": 9, "barrier": 0}]},
    ("POST", "/api/v1/leases"): {"tables": ["ods.orders", "dw.detail"], "lease_seconds": 60},
    ("POST", "/api/v1/tokens"): {"role": "reader", "description": "made by the test"},
    ("PUT", "/api/v1/tables/{table}/retention"): {"keep_last": 5},
    ("PUT", "/api/v1/tables/{table}/log"): {"mode": "embedded", "address": "http://h:1"},
}
# GET /versions/consistent with a lease takes one: a writer's call, though it is a GET.
LEASE_QUERY = {"tables": "ods.orders,dw.detail", "lease_seconds": "60"}


def route_keys(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route of the app, through the routers it includes."""
    return {
        (method, route.path)
        for route in iter_route_contexts(app.routes)  # flattens include_router()
        for method in route.methods or ()
        if method != "HEAD"
    }


class Call:
    """One request to one route, as :func:`calls` builds them."""

    def __init__(self, method: str, path: str, needs: Role, params: dict[str, str]) -> None:
        self.method, self.template, self.needs, self.params = method, path, needs, params
        self.url = re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES[m[1]], path)
        self.body = BODIES.get((method, path))

    def __call__(self, client: TestClient, headers: dict[str, str] | None = None) -> httpx.Response:
        return client.request(
            self.method, self.url, params=self.params, json=self.body, headers=headers or {}
        )

    def __repr__(self) -> str:
        return f"{self.method} {self.url} {self.params or ''}"


def calls() -> list[Call]:
    made = [Call(m, p, role, QUERIES.get(p, {})) for (m, p), role in sorted(NEEDS.items())]
    made.append(Call("GET", "/api/v1/versions/consistent", Role.WRITER, LEASE_QUERY))
    return made


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def issue(db_url: str, role: Role, description: str = "") -> str:
    """A token made straight in the database, as `metaservice token create` does."""
    db = Database(db_url)
    try:
        ctx = Context(settings=Settings(db_url=db_url), clock=ManualClock(T0))
        created = db.write(
            lambda session: auth_service.create_token(session, ctx, role, description)
        )
    finally:
        db.dispose()
    return created.token


@pytest.fixture
def secured(db_url: str, clock: ManualClock) -> Iterator[TestClient]:
    """The service with auth required, on the test's database."""
    # The tests publish log addresses nothing listens on: allowed, not proven.
    settings = Settings(
        db_url=db_url, auth_required=True, log_address_allowlist=["h:1", "127.0.0.1:1"]
    )
    app = create_app(settings, clock)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def tokens(db_url: str) -> dict[Role, str]:
    return {role: issue(db_url, role, f"the {role.value}") for role in Role}


@pytest.fixture
def seeded(secured: TestClient, tokens: dict[Role, str], clock: ManualClock) -> TestClient:
    """``src`` -> ods.orders -> ``der`` -> dw.detail with a few batches, made as admin."""
    secured.headers.update(bearer(tokens[Role.ADMIN]))
    source_and_derived(secured, clock)
    del secured.headers["Authorization"]
    return secured


# -- the route inventory --------------------------------------------------------------------


def test_every_route_is_classified(settings: Settings) -> None:
    routes = route_keys(create_app(settings))
    assert routes - OPEN - CATALOG - set(NEEDS) == set(), "routes with no role: add them to NEEDS"
    assert {r for r in CATALOG if r[0] != "HEAD"} <= routes
    assert set(NEEDS) - routes == set(), "NEEDS lists routes that no longer exist"
    assert routes >= OPEN


# -- refusals -------------------------------------------------------------------------------


def test_every_endpoint_refuses_a_missing_or_wrong_token_and_changes_nothing(
    db_url: str, seeded: TestClient
) -> None:
    bad_headers: list[dict[str, str]] = [
        {},
        bearer("mst_not-a-token-we-issued"),
        bearer("x" * 5000),
        {"Authorization": "Bearer"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "mst_token-without-a-scheme"},
    ]
    with unchanged(db_url):
        for call in calls():
            for headers in bad_headers:
                r = call(seeded, headers)
                body = assert_error(r, 401, "unauthenticated")
                assert r.headers["www-authenticate"] == "Bearer", (call, headers)
                assert "token" in body["message"], (call, body)


def test_a_revoked_token_is_refused(
    db_url: str, seeded: TestClient, tokens: dict[Role, str]
) -> None:
    admin = bearer(tokens[Role.ADMIN])
    listed = seeded.get(f"{API}/tokens", headers=admin).json()["items"]
    reader_id = next(t["id"] for t in listed if t["role"] == "reader")
    assert seeded.get(f"{API}/jobs", headers=bearer(tokens[Role.READER])).status_code == 200
    assert seeded.delete(f"{API}/tokens/{reader_id}", headers=admin).status_code == 204
    with unchanged(db_url):
        r = seeded.get(f"{API}/jobs", headers=bearer(tokens[Role.READER]))
    assert_error(r, 401, "unauthenticated")
    assert_error(seeded.delete(f"{API}/tokens/{reader_id}", headers=admin), 404, "not_found")


def test_each_role_can_call_exactly_the_endpoints_of_its_rank(
    db_url: str, seeded: TestClient, tokens: dict[Role, str]
) -> None:
    with unchanged(db_url):
        for call in calls():
            for role in Role:
                if role.includes(call.needs):
                    continue
                r = call(seeded, bearer(tokens[role]))
                body = assert_error(r, 403, "forbidden")
                assert f"needs the {call.needs.value} role" in body["message"], (call, body)
                assert role.value in body["message"], (call, body)
    for call in calls():
        for role in Role:
            if role.includes(call.needs):
                r = call(seeded, bearer(tokens[role]))
                assert r.status_code not in (401, 403) and r.status_code < 500, (
                    call,
                    role,
                    r.status_code,
                    r.text,
                )


def test_reader_can_query_but_not_change_anything(
    db_url: str, seeded: TestClient, tokens: dict[Role, str]
) -> None:
    reader = bearer(tokens[Role.READER])
    assert [j["name"] for j in seeded.get(f"{API}/jobs", headers=reader).json()["items"]] == [
        "der",
        "src",
    ]
    version = seeded.get(
        f"{API}/versions/consistent", params={"tables": "dw.detail"}, headers=reader
    )
    assert version.status_code == 200, version.text
    with unchanged(db_url):
        r = seeded.put(f"{API}/jobs/new", json={"outputs": ["t.new"]}, headers=reader)
        assert "needs the writer role" in assert_error(r, 403, "forbidden")["message"]
        r = seeded.post(f"{API}/jobs/src/batches/9/barrier", headers=reader)
        assert_error(r, 403, "forbidden")
        r = seeded.get(f"{API}/versions/consistent", params=LEASE_QUERY, headers=reader)
        assert "lease" in assert_error(r, 403, "forbidden")["message"]


def test_writer_can_register_and_commit_but_not_administer(
    db_url: str, seeded: TestClient, tokens: dict[Role, str], clock: ManualClock
) -> None:
    seeded.headers.update(bearer(tokens[Role.WRITER]))
    r = seeded.put(f"{API}/jobs/agg", json={"inputs": ["dw.detail"], "outputs": ["dws.agg"]})
    assert r.status_code == 201, r.text
    clock.advance(1000)
    run_batch(seeded, "src", 2, {"ods.orders": 103})
    r = seeded.post(f"{API}/leases", json={"tables": ["ods.orders"], "lease_seconds": 60})
    assert r.status_code == 201, r.text
    r = seeded.get(
        f"{API}/versions/consistent", params={"tables": "ods.orders", "lease_seconds": 5}
    )
    assert r.status_code == 200 and r.json()["lease_id"], r.text
    with unchanged(db_url):
        r = seeded.delete(f"{API}/jobs/agg")
        assert "needs the admin role" in assert_error(r, 403, "forbidden")["message"]
        assert_error(seeded.post(f"{API}/tokens", json={"role": "admin"}), 403, "forbidden")
        assert_error(seeded.get(f"{API}/tokens"), 403, "forbidden")


def test_admin_manages_tokens_and_never_sees_one_again(
    db_url: str, seeded: TestClient, tokens: dict[Role, str]
) -> None:
    admin = bearer(tokens[Role.ADMIN])
    r = seeded.post(
        f"{API}/tokens", json={"role": "writer", "description": "spark jobs"}, headers=admin
    )
    assert r.status_code == 201, r.text
    created = r.json()
    assert set(created) == {"id", "role", "token", "jobs"} and created["role"] == "writer"
    assert created["jobs"] is None  # unscoped: every job
    new = bearer(created["token"])
    assert seeded.put(f"{API}/jobs/x", json={"outputs": ["t.x"]}, headers=new).status_code == 201
    assert_error(seeded.get(f"{API}/tokens", headers=new), 403, "forbidden")

    listed = seeded.get(f"{API}/tokens", headers=admin)
    assert listed.status_code == 200, listed.text
    items = listed.json()["items"]
    assert [(t["role"], t["description"]) for t in items] == [
        ("reader", "the reader"),
        ("writer", "the writer"),
        ("admin", "the admin"),
        ("writer", "spark jobs"),
    ]
    assert all(set(t) == {"id", "role", "description", "created_ms", "jobs"} for t in items)
    assert created["token"] not in listed.text
    assert all(token not in listed.text for token in tokens.values())

    assert seeded.delete(f"{API}/tokens/{created['id']}", headers=admin).status_code == 204
    assert_error(seeded.get(f"{API}/jobs", headers=new), 401, "unauthenticated")
    r = seeded.post(f"{API}/tokens", json={"role": "root"}, headers=admin)
    assert_error(r, 422, "invalid_request", field="role")


def test_admin_deletes_jobs(seeded: TestClient, tokens: dict[Role, str]) -> None:
    admin = bearer(tokens[Role.ADMIN])
    assert_error(seeded.delete(f"{API}/jobs/src", headers=admin), 409, "has_readers")
    assert seeded.delete(f"{API}/jobs/der", headers=admin).status_code == 204
    assert seeded.delete(f"{API}/jobs/src", headers=admin).status_code == 204
    assert seeded.get(f"{API}/jobs", headers=admin).json()["items"] == []


def test_tokens_are_stored_hashed(db_url: str, seeded: TestClient, tokens: dict[Role, str]) -> None:
    r = seeded.post(f"{API}/tokens", json={"role": "reader"}, headers=bearer(tokens[Role.ADMIN]))
    raw = [*tokens.values(), r.json()["token"]]
    stored = repr(db_state(db_url))
    for token in raw:
        assert token not in stored
        assert token.removeprefix(auth_service.TOKEN_PREFIX) not in stored
        assert hashlib.sha256(token.encode()).hexdigest() in stored
    assert len({t[1] for t in db_state(db_url)["api_tokens"]}) == 4


# -- what stays open --------------------------------------------------------------------------


def test_probes_docs_and_metrics_stay_open(secured: TestClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json"):
        assert secured.get(path).status_code == 200, path
    schema = secured.get("/openapi.json").json()
    scheme = schema["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    put = schema["paths"]["/api/v1/jobs/{job}"]["put"]
    assert put["security"] == [{"bearer": []}]
    assert {"401", "403"} <= set(put["responses"])
    assert "security" not in schema["paths"]["/healthz"]["get"]


def test_metrics_can_require_a_token(db_url: str, clock: ManualClock) -> None:
    settings = Settings(db_url=db_url, auth_required=True, metrics_public=False)
    reader = issue(db_url, Role.READER)
    with TestClient(create_app(settings, clock), raise_server_exceptions=False) as c:
        assert_error(c.get("/metrics"), 401, "unauthenticated")
        assert_error(c.get("/metrics", headers=bearer("mst_wrong")), 401, "unauthenticated")
        assert c.get("/metrics", headers=bearer(reader)).status_code == 200
        assert c.get("/healthz").status_code == 200


# -- auth off ---------------------------------------------------------------------------------


def test_without_auth_every_request_acts_as_admin(client: TestClient) -> None:
    r = client.put(f"{API}/jobs/src", json={"outputs": ["ods.orders"]})
    assert r.status_code == 201, r.text
    assert client.get(f"{API}/jobs", headers=bearer("mst_ignored")).status_code == 200
    r = client.post(f"{API}/tokens", json={"role": "reader"})
    assert r.status_code == 201, r.text
    assert client.get(f"{API}/tokens").json()["total"] == 1
    assert client.delete(f"{API}/jobs/src").status_code == 204


# -- the CLI ----------------------------------------------------------------------------------


def test_cli_token_create_prints_a_working_token_on_its_last_line(
    db_url: str, secured: TestClient
) -> None:
    runner = CliRunner()
    made = runner.invoke(
        cli_app, ["token", "create", "--role", "writer", "--description", "etl", "--db", db_url]
    )
    assert made.exit_code == 0, made.output
    lines = made.output.rstrip("\n").split("\n")
    assert len(lines) >= 2, made.output
    token = lines[-1]
    assert re.fullmatch(r"mst_[A-Za-z0-9_-]{43}", token), made.output
    r = secured.put(f"{API}/jobs/src", json={"outputs": ["ods.orders"]}, headers=bearer(token))
    assert r.status_code == 201, r.text
    assert_error(secured.get(f"{API}/tokens", headers=bearer(token)), 403, "forbidden")

    listed = runner.invoke(cli_app, ["token", "list", "--db", db_url])
    assert listed.exit_code == 0, listed.output
    assert "writer" in listed.output and "etl" in listed.output
    assert token not in listed.output

    token_id = re.match(r"token (\d+) with role writer", lines[0])[1]  # type: ignore[index]
    revoked = runner.invoke(cli_app, ["token", "revoke", token_id, "--db", db_url])
    assert revoked.exit_code == 0, revoked.output
    assert_error(secured.get(f"{API}/jobs", headers=bearer(token)), 401, "unauthenticated")
    again = runner.invoke(cli_app, ["token", "revoke", token_id, "--db", db_url])
    assert again.exit_code == 1 and "no token" in again.output


def test_cli_token_create_refuses_an_unknown_role(db_url: str) -> None:
    with unchanged(db_url):
        result = CliRunner().invoke(cli_app, ["token", "create", "--role", "root", "--db", db_url])
    assert result.exit_code == 2, result.output


def test_start_accepts_auth_and_tls_flags(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[dict[str, object]] = []
    monkeypatch.setattr(uvicorn, "run", lambda target, **kw: served.append(kw))
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)
    # start exports its settings for the workers: let monkeypatch restore them
    for name in ("DB_URL", "BARRIER_INTERVAL_MS", "AUTH_REQUIRED"):
        monkeypatch.setenv(f"METASERVICE_{name}", "")
        monkeypatch.delenv(f"METASERVICE_{name}")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    args = ["start", "--db", sqlite_url, "--auth-required"]
    tls = ["--ssl-keyfile", str(key), "--ssl-certfile", str(cert)]

    result = CliRunner().invoke(cli_app, [*args, *tls])
    assert result.exit_code == 0, result.output
    assert "https://" in result.output and "auth required" in result.output
    assert "no token exists yet" in result.output
    assert served[-1]["ssl_keyfile"] == str(key) and served[-1]["ssl_certfile"] == str(cert)
    assert os.environ["METASERVICE_AUTH_REQUIRED"] == "true"

    half = CliRunner().invoke(cli_app, [*args, "--ssl-keyfile", str(key)])
    assert half.exit_code == 1 and "go together" in half.output
    assert len(served) == 1
