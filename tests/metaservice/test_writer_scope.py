"""Writer tokens scoped to jobs: a scoped writer acts only for its jobs and their tables.

``test_auth.NEEDS`` lists every route with the least role it needs; every writer route
with a ``{job}`` or ``{table}`` in its path, and the commit reports (job in the body), is
called here for a job outside the scope and must be refused (403 ``out_of_scope``,
nothing changed), and for a job inside it must not be.
"""

from __future__ import annotations

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from metaservice.auth import service as auth_service
from metaservice.auth.schemas import Role
from metaservice.cli import app as cli_app
from metaservice.clock import ManualClock
from metaservice.context import Context
from metaservice.db import Database
from metaservice.settings import Settings
from tests.metaservice.helpers import API, T0, assert_error, report, unchanged
from tests.metaservice.test_auth import NEEDS, Call, bearer

pytest_plugins = ["tests.metaservice.test_auth"]  # its secured/seeded/tokens fixtures


def issue_scoped(db_url: str, jobs: list[str]) -> str:
    db = Database(db_url)
    try:
        ctx = Context(settings=Settings(db_url=db_url), clock=ManualClock(T0))
        created = db.write(
            lambda session: auth_service.create_token(
                session, ctx, Role.WRITER, "scoped by the test", jobs
            )
        )
    finally:
        db.dispose()
    return created.token


def writer_calls_for(job: str, table: str) -> list[Call]:
    """Every writer route naming a job or a table, aimed at ``job`` / ``table``."""
    made = []
    for (method, path), needs in sorted(NEEDS.items()):
        if needs is not Role.WRITER or ("{job}" not in path and "{table}" not in path):
            continue
        call = Call(method, path, needs, {})
        call.url = path.replace("{job}", job).replace("{table}", table).replace("{batch_id}", "7")
        made.append(call)
    return made


def test_a_scoped_writer_is_refused_every_route_of_another_job_and_changes_nothing(
    db_url: str, seeded: TestClient
) -> None:
    # seeded: src -> ods.orders -> der -> dw.detail. The token may act for src only.
    token = issue_scoped(db_url, ["sr?"])
    calls = writer_calls_for("der", "dw.detail")
    assert {c.template for c in calls} >= {
        "/api/v1/jobs/{job}",
        "/api/v1/jobs/{job}/batches/{batch_id}/barrier",
        "/api/v1/jobs/{job}/next-barrier",
        "/api/v1/tables/{table}/log",
    }
    with unchanged(db_url):
        for call in calls:
            body = assert_error(call(seeded, bearer(token)), 403, "out_of_scope")
            assert "sr?" in body["message"], (call, body)
        r = seeded.post(
            f"{API}/commits",
            json=report("der", 1, T0 + 2000, "dw.detail", 202),
            headers=bearer(token),
        )
        assert_error(r, 403, "out_of_scope", "job")
        batch = {
            "commits": [
                report("src", 9, T0, "ods.orders", 109),
                report("der", 1, T0 + 2000, "dw.detail", 202),
            ]
        }
        r = seeded.post(f"{API}/commits/batch", json=batch, headers=bearer(token))
        assert_error(r, 403, "out_of_scope", "commits.1.job")


def test_a_scoped_writer_acts_for_its_own_jobs_and_reads_everything(
    db_url: str, seeded: TestClient, clock: ManualClock
) -> None:
    token = issue_scoped(db_url, ["ingest_*", "src"])
    seeded.headers.update(bearer(token))
    clock.advance(1000)
    r = seeded.post(f"{API}/jobs/src/batches/2/barrier")
    assert r.status_code == 200, r.text
    r = seeded.post(f"{API}/commits", json=report("src", 2, r.json()["barrier"], "ods.orders", 103))
    assert r.status_code == 200, r.text
    r = seeded.put(f"{API}/jobs/ingest_items", json={"outputs": ["ods.items"]})
    assert r.status_code == 201, r.text
    r = seeded.put(
        f"{API}/tables/ods.orders/log", json={"mode": "embedded", "address": "http://127.0.0.1:1"}
    )
    assert r.status_code == 200, r.text
    # Reading is a reader's right, whatever the scope.
    assert seeded.get(f"{API}/jobs/der").status_code == 200
    assert (
        seeded.get(f"{API}/versions/consistent", params={"tables": "dw.detail"}).status_code == 200
    )
    # Another job's table, and a table no job writes yet, stay out of reach.
    with unchanged(db_url):
        r = seeded.delete(f"{API}/tables/dw.detail/log")
        assert "written by job 'der'" in assert_error(r, 403, "out_of_scope", "table")["message"]
        r = seeded.put(f"{API}/jobs/der", json={"inputs": ["ods.orders"], "outputs": ["dw.other"]})
        assert_error(r, 403, "out_of_scope", "job")


def test_unscoped_writers_keep_acting_for_every_job(
    seeded: TestClient, tokens: dict[Role, str]
) -> None:
    writer = bearer(tokens[Role.WRITER])
    for job in ("src", "der"):
        r = seeded.get(f"{API}/jobs/{job}/next-barrier", headers=writer)
        assert r.status_code != 403, r.text
    r = seeded.post(f"{API}/jobs/src/batches/5/barrier", headers=writer)
    assert r.status_code == 200, r.text


def test_only_writer_tokens_can_be_scoped(seeded: TestClient, tokens: dict[Role, str]) -> None:
    admin = bearer(tokens[Role.ADMIN])
    r = seeded.post(f"{API}/tokens", json={"role": "reader", "jobs": ["src"]}, headers=admin)
    assert r.status_code == 422, r.text
    r = seeded.post(f"{API}/tokens", json={"role": "writer", "jobs": ["a,b"]}, headers=admin)
    assert r.status_code == 422, r.text
    r = seeded.post(f"{API}/tokens", json={"role": "writer", "jobs": ["ingest_*"]}, headers=admin)
    assert r.status_code == 201 and r.json()["jobs"] == ["ingest_*"], r.text
    listed = seeded.get(f"{API}/tokens", headers=admin).json()["items"]
    assert [t["jobs"] for t in listed if t["id"] == r.json()["id"]] == [["ingest_*"]]


def test_cli_creates_a_scoped_writer_token(db_url: str, seeded: TestClient) -> None:
    runner = CliRunner()
    made = runner.invoke(
        cli_app,
        ["token", "create", "--role", "writer", "--jobs", "ingest_*, src", "--db", db_url],
    )
    assert made.exit_code == 0, made.output
    assert "scoped to the jobs ingest_*, src" in made.output
    token = made.output.strip().splitlines()[-1]
    r = seeded.post(f"{API}/jobs/der/batches/5/barrier", headers=bearer(token))
    assert_error(r, 403, "out_of_scope")
    refused = runner.invoke(
        cli_app, ["token", "create", "--role", "admin", "--jobs", "src", "--db", db_url]
    )
    assert refused.exit_code == 1 and "cannot be scoped" in refused.output
    listed = runner.invoke(cli_app, ["token", "list", "--db", db_url, "--output", "json"])
    assert '"ingest_*"' in listed.output, listed.output
