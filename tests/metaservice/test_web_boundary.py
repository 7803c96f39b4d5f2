"""The service's edge: browsers of other sites, unexpected Host names, non-JSON bodies,
hostile characters and names, 405s, and what /readyz, the log and the CLI give away.

The requests below are those a web page can make a browser on the operator's machine
send without asking (form posts, ``fetch`` with ``text/plain`` or no body, ``<img>``),
and those the page could read the answers of by pointing a name of its own at the
service (DNS rebinding).
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from metaservice import names
from metaservice.app import create_app
from metaservice.cli import app as cli_app
from metaservice.clock import ManualClock
from metaservice.errors import Invalid
from metaservice.settings import Settings
from tests.metaservice.helpers import (
    API,
    assert_error,
    custom_client,
    put_job,
    source_and_derived,
    unchanged,
)
from tests.metaservice.live_server import LiveServer

EVIL = "http://evil.example"
TEXT = {"Content-Type": "text/plain"}
RUN_ID = "01890000-0000-7000-8000-0000000000ee"


def ol_event(**change: Any) -> dict[str, Any]:
    return {
        "eventTime": "2026-01-01T00:00:00Z",
        "producer": "https://example.com/producer",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "eventType": "COMPLETE",
        "run": {"runId": RUN_ID},
        "job": {"namespace": "evil", "name": "csrf"},
        "outputs": [{"namespace": "n", "name": "ods.orders"}],
        **change,
    }


# -- browsers of other sites ------------------------------------------------------------------

# (method, path, keyword arguments): what cors_csrf.py showed a page could do.
CROSS_SITE = [
    ("POST", f"{API}/jobs/src/batches/7/barrier", {"headers": TEXT}),
    ("POST", f"{API}/jobs/src/batches/1/abandon", {"headers": TEXT}),
    ("POST", f"{API}/tables/ods.orders/expire", {"headers": TEXT}),
    ("POST", f"{API}/lineage", {"content": json.dumps(ol_event()), "headers": TEXT}),
    ("PUT", f"{API}/jobs/src", {"json": {"outputs": ["ods.orders"], "description": "csrf"}}),
    ("DELETE", f"{API}/jobs/der", {}),
    (
        "GET",
        f"{API}/versions/consistent",
        {"params": {"tables": "ods.orders", "lease_seconds": 604800}},
    ),
]


@pytest.mark.parametrize(("method", "path", "kwargs"), CROSS_SITE)
def test_a_page_of_another_origin_is_refused_and_changes_nothing(
    client: TestClient, clock: ManualClock, db_url: str, method: str, path: str, kwargs: Any
) -> None:
    source_and_derived(client, clock)
    headers = kwargs.pop("headers", {})
    with unchanged(db_url):
        for browser in (
            {"Origin": EVIL},  # a form post or fetch() names the page's origin
            {"Origin": "null"},  # a sandboxed frame, a file: page
            {"Origin": "http://localhost:3000"},  # another port is another origin
            {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},  # <img>, no Origin
            {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"},
        ):
            r = client.request(method, path, headers={**headers, **browser}, **kwargs)
            body = assert_error(r, 403, "cross_origin", field="Origin")
            assert "cors_origins" in body["message"], body
            assert "access-control-allow-origin" not in r.headers


def test_the_service_own_pages_programs_and_links_from_elsewhere_are_served(
    client: TestClient, clock: ManualClock
) -> None:
    source_and_derived(client, clock)
    own = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    r = client.put(
        f"{API}/jobs/src", json={"outputs": ["ods.orders"], "description": "d"}, headers=own
    )
    assert r.status_code == 200, r.text
    assert client.post(f"{API}/jobs/src/batches/2/barrier", headers=own).status_code == 200
    # no Origin, no Sec-Fetch-*: the CLI, Spark, curl
    assert client.post(f"{API}/jobs/src/batches/2/barrier").status_code == 200
    # the operator follows a link to the console from another site's page
    navigate = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    assert client.get("/ui/", headers=navigate).status_code == 200
    # typed into the address bar
    assert client.get("/ui/", headers={"Sec-Fetch-Site": "none"}).status_code == 200


def test_cors_is_off_unless_configured_and_then_answers_for_those_origins(
    db_url: str, clock: ManualClock, client: TestClient
) -> None:
    preflight = {"Origin": EVIL, "Access-Control-Request-Method": "DELETE"}
    r = client.options(f"{API}/jobs/src", headers=preflight)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers, r.headers
    app_origin = "https://app.example.com"
    with custom_client(db_url, clock, cors_origins=[app_origin]) as c:
        r = c.options(
            f"{API}/jobs/src",
            headers={"Origin": app_origin, "Access-Control-Request-Method": "PUT"},
        )
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == app_origin
        r = c.put(f"{API}/jobs/src", json={"outputs": ["ods.a"]}, headers={"Origin": app_origin})
        assert r.status_code == 201, r.text
        assert r.headers["access-control-allow-origin"] == app_origin
        assert_error(c.options(f"{API}/jobs/src", headers=preflight), 403, "cross_origin")


# -- Host names -------------------------------------------------------------------------------


@pytest.fixture
def server(db_url: str, clock: ManualClock) -> Iterator[LiveServer]:
    with LiveServer(create_app(Settings(db_url=db_url), clock)) as live:
        yield live


def test_a_foreign_host_name_is_refused_over_real_http(server: LiveServer, db_url: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.put(f"{API}/jobs/src", json={"outputs": ["ods.a"]}).status_code == 201
        with unchanged(db_url):
            for host in ("attacker.example", f"attacker.example:{server.port}", "localhost.evil"):
                r = http.get(f"{API}/jobs/src", headers={"Host": host})
                body = assert_error(r, 400, "host_not_allowed", field="Host")
                assert "allowed_hosts" in body["message"], body
                r = http.post(f"{API}/jobs/src/batches/0/barrier", headers={"Host": host})
                assert_error(r, 400, "host_not_allowed")
        # the names a client on the machine or the cluster uses: loopback, and addresses
        for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "[::1]", "10.0.0.7"):
            assert http.get(f"{API}/jobs/src", headers={"Host": host}).status_code == 200, host
    # an HTTP/1.0 probe names no Host at all (no browser does): served
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as probe:
        probe.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert probe.recv(64).startswith(b"HTTP/1.1 200")


def test_configured_host_names_are_served(db_url: str, clock: ManualClock) -> None:
    settings = Settings(db_url=db_url, allowed_hosts=["ms.example.com", "*.corp.example"])
    with (
        LiveServer(create_app(settings, clock)) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        for host in ("ms.example.com", "MS.example.com.:443", "a.corp.example", "localhost"):
            assert http.get("/healthz", headers={"Host": host}).status_code == 200, host
        for host in ("example.com", "corp.example", "ms.example.com.evil"):
            assert_error(http.get("/healthz", headers={"Host": host}), 400, "host_not_allowed")


# -- JSON only ------------------------------------------------------------------------------


def test_json_endpoints_take_json_only(client: TestClient, clock: ManualClock, db_url: str) -> None:
    source_and_derived(client, clock)
    job = json.dumps({"outputs": ["ods.orders"], "description": "csrf"})
    with unchanged(db_url):
        for content_type in (
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            None,
        ):
            headers = {"Content-Type": content_type} if content_type else {}
            for path, body in (
                (f"{API}/jobs/src", job),
                (f"{API}/lineage", json.dumps(ol_event())),
            ):
                method = "PUT" if path.endswith("src") else "POST"
                r = client.request(method, path, content=body, headers=headers)
                assert_error(r, 415, "unsupported_media_type", field="Content-Type")
    r = client.put(
        f"{API}/jobs/src", content=job, headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert r.status_code == 200, r.text
    # as openlineage-python's HTTP transport sends an event: JSON, gzip or not
    plain = {"Content-Type": "application/json"}
    r = client.post(f"{API}/lineage", content=json.dumps(ol_event()), headers=plain)
    assert r.status_code == 201, r.text
    packed = gzip.compress(json.dumps(ol_event(run={"runId": RUN_ID[:-2] + "ff"})).encode())
    r = client.post(f"{API}/lineage", content=packed, headers={**plain, "Content-Encoding": "gzip"})
    assert r.status_code == 201, r.text


# -- hostile input ----------------------------------------------------------------------------


def test_hostile_openlineage_events_are_400_and_change_nothing(
    client: TestClient, db_url: str
) -> None:
    plain = {"Content-Type": "application/json"}
    nested = "[" * 1000 + "]" * 1000
    deep = json.dumps(ol_event())[:-1] + ', "x": ' + nested + "}"
    surrogate = json.dumps(ol_event(job={"namespace": "n", "name": "a\ud800"}))
    nul_facet = json.dumps(ol_event(x={"note": "a\u0000b"}))
    with unchanged(db_url):
        assert_error(client.post(f"{API}/lineage", content=deep, headers=plain), 400, "too_deep")
        body = assert_error(
            client.post(f"{API}/lineage", content=surrogate, headers=plain), 400, "invalid_event"
        )
        assert body["path"] == "$.job.name", body
        r = client.post(
            f"{API}/lineage",
            content=gzip.compress(nul_facet.encode()),
            headers={**plain, "Content-Encoding": "gzip"},
        )
        assert assert_error(r, 400, "invalid_event")["path"] == "$.x.note"


# (method, path, keyword arguments) from nul_pg.py: each reached PostgreSQL with a NUL.
NUL_INPUTS = [
    ("POST", f"{API}/tokens", {"json": {"role": "reader", "description": "a\x00b"}}, "description"),
    ("POST", f"{API}/jobs/src/batches/50/barrier", {"json": {"query_id": "q\x00"}}, "query_id"),
    (
        "POST",
        f"{API}/jobs/src/claims",
        {"json": {"claims": [{"batch_id": 51, "barrier": 0, "query_id": "q\x00"}]}},
        "claims.0.query_id",
    ),
    (
        "POST",
        f"{API}/jobs/src/events",
        {"json": {"event": "progress", "run_id": "r\x00"}},
        "run_id",
    ),
    ("GET", f"{API}/jobs/der/next-barrier", {"params": {"source": "ods.orders\x00"}}, "source"),
    ("GET", f"{API}/versions/tags", {"params": {"table": "ods.orders\x00"}}, "table"),
    ("DELETE", f"{API}/leases/a%00", {}, "path"),
    ("GET", f"{API}/jobs/src%00", {}, "path"),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "field"), NUL_INPUTS)
def test_a_nul_character_anywhere_is_422_and_changes_nothing(
    client: TestClient,
    clock: ManualClock,
    db_url: str,
    method: str,
    path: str,
    kwargs: Any,
    field: str,
) -> None:
    source_and_derived(client, clock)
    with unchanged(db_url):
        r = client.request(method, path, **kwargs)
        assert_error(r, 422, "invalid_character", field=field)


def test_an_unpaired_surrogate_is_422_and_a_pair_is_text(client: TestClient, db_url: str) -> None:
    json_ = {"Content-Type": "application/json"}
    with unchanged(db_url):
        for escaped in ("\\ud800", "\\udfff", "\\ud800x", "\\ud800\\u0041"):
            body = '{"outputs": ["ods.a"], "description": "' + escaped + '"}'
            r = client.put(f"{API}/jobs/j", content=body, headers=json_)
            assert_error(r, 422, "invalid_character", field="description")
    body = '{"outputs": ["ods.a"], "description": "\\ud83d\\ude00 \\\\u0000"}'
    r = client.put(f"{API}/jobs/j", content=body, headers=json_)
    assert r.status_code == 201, r.text
    assert r.json()["description"] == "\U0001f600 \\u0000"


def test_a_name_with_a_trailing_newline_is_no_name(client: TestClient, db_url: str) -> None:
    from metaservice.versions.tags.service import check_tag_name

    for bad, check in (
        ("ods.orders\n", names.check_table_name),
        ("src\n", names.check_job_name),
        ("daily\n", check_tag_name),
    ):
        with pytest.raises(Invalid):
            check(bad)
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/nl", json={"outputs": ["ods.orders\n"]})
        assert_error(r, 422, "invalid", field="outputs.0")
        r = client.put(f"{API}/jobs/nl", json={"inputs": ["ods.orders\n"], "outputs": ["dw.x"]})
        assert_error(r, 422, "invalid", field="inputs.0")
        assert client.get(f"{API}/delay", params={"table": "ods.orders\n"}).status_code == 422
    listed = [t["name"] for t in client.get(f"{API}/tables").json()["items"]]
    assert listed == ["ods.orders"]


def test_a_405_names_the_methods_the_path_takes(client: TestClient) -> None:
    r = client.patch(f"{API}/jobs/src", json={})
    assert_error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "GET, PUT, DELETE"
    r = client.delete("/healthz")
    assert (r.status_code, r.headers["allow"]) == (405, "GET")
    r = client.get(f"{API}/commits")
    assert (r.status_code, r.headers["allow"]) == (405, "POST")


# -- nothing leaks ----------------------------------------------------------------------------

UNREACHABLE = "postgresql+psycopg://svc_user:S3cretPw@127.0.0.1:1/proddb"


def test_readyz_tells_an_anonymous_caller_a_status_and_a_code_only() -> None:
    app = create_app(Settings(db_url=UNREACHABLE, auth_required=True))
    with TestClient(app, raise_server_exceptions=False) as c:
        for headers in ({}, {"Authorization": "Bearer mst_not_known"}):
            r = c.get("/readyz", headers=headers)
            assert r.status_code == 503
            body = r.json()
            assert (body["status"], body["code"]) == ("unavailable", "database_unreachable")
            for secret in ("S3cretPw", "svc_user", "127.0.0.1", "proddb", "5432", "port 1"):
                assert secret not in r.text, (secret, r.text)


def test_readyz_gives_an_admin_the_detail(db_url: str, clock: ManualClock) -> None:
    with custom_client(db_url, clock) as c:  # auth off: every caller is admin
        admin = c.post(f"{API}/tokens", json={"role": "admin"}).json()["token"]
        reader = c.post(f"{API}/tokens", json={"role": "reader"}).json()["token"]
        migration = c.get("/readyz").json()["migration"]
    assert migration
    with custom_client(db_url, clock, auth_required=True) as c:
        assert c.get("/readyz").json() == {"status": "ready", "migration": None}
        r = c.get("/readyz", headers={"Authorization": f"Bearer {reader}"})
        assert r.json()["migration"] is None
        r = c.get("/readyz", headers={"Authorization": f"Bearer {admin}"})
        assert r.json() == {"status": "ready", "migration": migration}
    app = create_app(Settings(db_url=UNREACHABLE))  # auth off: the detail, for the operator
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and "127.0.0.1" in r.json()["message"], r.text


def test_the_openlineage_url_is_logged_without_its_credentials(
    db_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    url = "http://marquez_user:0lPassw0rd@127.0.0.1:9/"
    with caplog.at_level(logging.INFO), custom_client(db_url, clock, openlineage_url=url):
        pass
    assert "emitting OpenLineage events to http://marquez_user:***@127.0.0.1:9/" in caplog.text
    assert "0lPassw0rd" not in caplog.text


def test_the_cli_escapes_control_characters_a_job_description_holds(
    server: LiveServer, db_url: str
) -> None:
    hostile = "ok\x1b[2J\x1b]0;pwned\x07\x9b31m\u202eevil"
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.put(f"{API}/jobs/src", json={"outputs": ["ods.a"], "description": hostile})
        assert r.status_code == 201, r.text
    done = CliRunner().invoke(cli_app, ["job", "show", "src", "--url", server.url])
    assert done.exit_code == 0, done.output
    for control in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert control not in done.output, repr(done.output)
    assert "ok\\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\\u202eevil" in done.output
    done = CliRunner().invoke(cli_app, ["job", "show", "src", "-o", "json", "--url", server.url])
    assert json.loads(done.output)["description"] == hostile  # JSON escapes them itself
    assert "\x1b" not in done.output
