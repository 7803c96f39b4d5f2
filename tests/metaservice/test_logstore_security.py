"""The log store's trust boundaries: log services that check tokens with the MetaService
(and refuse to listen beyond loopback without), bodies and tables bounded, hostile input
answered with a JSON 4xx, and a MetaService that calls only log services that prove who
they are, within one deadline, reading bounded answers and echoing none. Real log
services and a real MetaService over HTTP on loopback (no Spark here: the embedded log in
a Spark driver is in tests/spark_barrier/test_log_store.py).
"""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from typer.testing import CliRunner

pytest.importorskip("pyiceberg")

from metaservice.app import create_app
from metaservice.auth import service as auth_service
from metaservice.auth.schemas import Role
from metaservice.catalog_loading import open_catalog
from metaservice.cli import app as cli_app
from metaservice.client import MetaServiceClient
from metaservice.clock import ManualClock
from metaservice.context import Context
from metaservice.db import Database
from metaservice.logstore import LogApiError, LogClient, LogReader, LogWriter, ipc
from metaservice.logstore.server import LogService
from metaservice.logstore.store import LogStore
from metaservice.migrate import upgrade
from metaservice.settings import Settings
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.log import JobLog
from tests.metaservice.helpers import API, T0
from tests.metaservice.live_server import LiveServer

TABLE = "dw.events"
SCHEMA = pa.schema([pa.field("id", pa.int64())])


def rows(*ids: int) -> pa.Table:
    return pa.table({"id": list(ids)}, schema=SCHEMA)


def arrow(*ids: int) -> bytes:
    table = rows(*ids)
    return ipc.encode(table.to_batches(), table.schema)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Secured:
    """A MetaService requiring tokens, and one token of each role."""

    url: str
    tokens: dict[Role, str]

    def client(self, role: Role) -> MetaServiceClient:
        return MetaServiceClient(self.url, token=self.tokens[role])


def issue(db_url: str, role: Role) -> str:
    db = Database(db_url)
    try:
        ctx = Context(settings=Settings(db_url=db_url), clock=ManualClock(T0))
        return db.write(lambda s: auth_service.create_token(s, ctx, role, "test")).token
    finally:
        db.dispose()


@pytest.fixture
def db(sqlite_url: str) -> str:
    upgrade(sqlite_url)
    return sqlite_url


@pytest.fixture
def secured(db: str, clock: ManualClock) -> Iterator[Secured]:
    app = create_app(Settings(db_url=db, auth_required=True), clock)
    with LiveServer(app) as server:
        found = Secured(server.url, {role: issue(db, role) for role in Role})
        with found.client(Role.WRITER) as writer:
            writer.put_job("load", outputs=[TABLE])
        yield found


@pytest.fixture
def open_ms(db: str, clock: ManualClock) -> Iterator[MetaServiceClient]:
    """A MetaService without auth (the default)."""
    with (
        LiveServer(create_app(Settings(db_url=db), clock)) as server,
        MetaServiceClient(server.url) as ms,
    ):
        ms.put_job("load", outputs=[TABLE])
        yield ms


@pytest.fixture
def checked_log(secured: Secured) -> Iterator[LogService]:
    """A log service checking tokens with ``secured``, holding a writer token of its own."""
    from metaservice.logstore.auth import LogAuth

    auth = LogAuth(secured.url, token=secured.tokens[Role.WRITER])
    with LogService(auth=auth) as service:
        yield service


# -- 1. the log service authenticates --------------------------------------------------------


def log_calls(url: str) -> dict[str, tuple[str, str, dict[str, object]]]:
    """Every log route, as (method, path, request arguments)."""
    t = f"{url}/v1/tables/{TABLE}"
    return {
        "append": ("POST", f"{t}/entries", {"params": {"barrier": T0, "batch_id": 0}}),
        "persisted": ("POST", f"{t}/persisted", {}),
        "spilled": ("POST", f"{t}/spilled", {}),
        "reset": ("POST", f"{t}/reset", {}),
        "read": ("GET", f"{t}/entries", {"params": {"after_batch": -1}}),
        "status": ("GET", f"{url}/v1/status", {}),
    }


BODIES: dict[str, object] = {
    "persisted": {"barrier": T0, "batch_id": 0, "snapshot_id": 1},
    "spilled": {"batch_id": 0},
    "reset": {"after_batch_id": -1},
}
WRITES = ("append", "persisted", "spilled", "reset")


def call(name: str, url: str, headers: dict[str, str]) -> httpx.Response:
    method, path, kwargs = log_calls(url)[name]
    body: dict[str, object] = (
        {"content": arrow(1, 2)} if name == "append" else {"json": BODIES.get(name)}
    )
    return httpx.request(method, path, headers=headers, timeout=10, **kwargs, **body)  # type: ignore[arg-type]


def test_with_auth_every_log_route_needs_a_token_the_metaservice_accepts(
    secured: Secured, checked_log: LogService
) -> None:
    url = checked_log.url
    for name in log_calls(url):
        for headers in ({}, bearer("mst_not-one-we-issued"), {"Authorization": "Basic eDp5"}):
            r = call(name, url, headers)
            assert r.status_code == 401 and r.json()["code"] == "unauthenticated", (name, r.text)
    assert checked_log.store.names() == [], "nothing anonymous reached the log"
    # Writers write (and may read); readers read and see the status, and write nothing.
    for name in ("reset", "append", "persisted", "spilled", "read", "status"):
        r = call(name, url, bearer(secured.tokens[Role.WRITER]))
        assert r.status_code == 200, (name, r.text)
    for name in WRITES:
        r = call(name, url, bearer(secured.tokens[Role.READER]))
        assert r.status_code == 403 and r.json()["code"] == "forbidden", (name, r.text)
    for name in ("read", "status"):
        r = call(name, url, bearer(secured.tokens[Role.READER]))
        assert r.status_code == 200, (name, r.text)
    assert httpx.get(url + "/healthz").status_code == 200  # probes stay open


def test_a_log_service_beyond_loopback_refuses_to_start_without_auth(
    secured: Secured, open_ms: MetaServiceClient
) -> None:
    from metaservice.logstore.auth import LogAuth, LogAuthError

    with pytest.raises(LogAuthError, match="METASERVICE_AUTH_REQUIRED=true"):
        LogService(host="0.0.0.0")
    # Checking tokens with a MetaService that requires none would check nothing.
    with pytest.raises(LogAuthError, match="does not require them"):
        LogService(host="0.0.0.0", auth=LogAuth(open_ms.url))
    auth = LogAuth(secured.url, token=secured.tokens[Role.WRITER])
    with LogService(host="0.0.0.0", advertised_host="127.0.0.1", auth=auth) as service:
        assert service.url == f"http://127.0.0.1:{service.port}"
        assert httpx.get(service.url + "/v1/status").status_code == 401
    refused = CliRunner().invoke(cli_app, ["log", "start", "--host", "0.0.0.0", "--port", "1"])
    assert refused.exit_code != 0 and "--metaservice-url" in refused.output


def test_writers_and_readers_pass_their_tokens_without_new_wiring(
    secured: Secured, checked_log: LogService, tmp_path: Path
) -> None:
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path / "wh"))
    try:
        table = ensure_table(catalog, TABLE, SCHEMA)
        with secured.client(Role.WRITER) as ms:
            job_log = JobLog("external", checked_log.url, token=secured.tokens[Role.WRITER])
            job_log.open(ms, "load", {TABLE: table}, None, {})  # resets, publishes
            job_log.target(TABLE, T0, 0).append(rows(1, 2, 3))  # an executor's write task
            job_log.close()
        with secured.client(Role.READER) as ms:
            reader = LogReader.from_metaservice(TABLE, ms, catalog=catalog, start="earliest")
            got = reader.poll()
            reader.close()
    finally:
        catalog.engine.dispose()  # type: ignore[attr-defined]
    assert reader.source == "log" and got is not None
    assert got.column("id").to_pylist() == [1, 2, 3]


# -- 2. the log store is bounded -------------------------------------------------------------


def zstd_body(n_rows: int) -> bytes:
    batch = pa.RecordBatch.from_pydict({"x": pa.array([0] * n_rows, pa.int64())})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def test_a_compressed_body_is_bounded_by_what_it_decodes_to() -> None:
    bomb = zstd_body(12_500_000)  # a few KB standing for 100 MB of rows
    assert len(bomb) < 10_000
    with LogService() as service:
        r = httpx.post(
            f"{service.url}/v1/tables/{TABLE}/entries",
            params={"barrier": T0, "batch_id": 0},
            content=bomb,
            timeout=30,
        )
        assert r.status_code == 413 and r.json()["code"] == "too_large", r.text
        assert "once decoded" in r.json()["message"]
        assert service.store.names() == [], "nothing held"
        small = zstd_body(1000)  # compressed honestly: taken
        ok = httpx.post(
            f"{service.url}/v1/tables/{TABLE}/entries",
            params={"barrier": T0, "batch_id": 0},
            content=small,
        )
        assert ok.status_code == 200 and ok.json()["rows"] == 1000


def test_a_body_past_the_limit_is_refused_while_it_streams() -> None:
    with LogService() as service:
        request = f"POST /v1/tables/{TABLE}/entries?barrier={T0}&batch_id=0 HTTP/1.1\r\n"
        # A declared 600 MiB: refused before any of it is read.
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as conn:
            conn.sendall(
                f"{request}Host: 127.0.0.1\r\nContent-Length: {600 * 1024 * 1024}\r\n\r\n".encode()
            )
            declared = conn.recv(4096)
        assert declared.startswith(b"HTTP/1.1 413") and b'"too_large"' in declared, declared
        # A chunked body with no length: the answer comes once it is past the limit,
        # while the rest of it is never sent.
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as conn:
            conn.sendall(f"{request}Host: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            chunk = b"\0" * (1024 * 1024)
            for _ in range(65):  # 65 MiB, past the 64 MiB default; never terminated
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"too_large"' in answer
        assert service.store.names() == []


def test_an_append_past_the_tables_bound_is_refused_with_a_code_the_writer_handles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    one = rows(*range(100)).nbytes
    with LogService(LogStore(max_bytes=2 * one)) as service:
        writer = LogWriter(service.url)
        writer.reset(TABLE, after_batch_id=-1, job="load")
        writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(*range(100)))
        writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(*range(100)))
        r = httpx.post(
            f"{service.url}/v1/tables/{TABLE}/entries",
            params={"barrier": T0, "batch_id": 0},
            content=arrow(*range(100)),
        )
        assert r.status_code == 409 and r.json()["code"] == "log_full", r.text
        status = service.store.table(TABLE).status()
        assert status.bytes <= 2 * one and status.over_bound
        # The Spark side's write task: a warning, never a failed write.
        job_log = JobLog("external", service.url)
        with caplog.at_level("WARNING", logger="spark_barrier.log"):
            job_log.target(TABLE, T0, 0).append(rows(*range(100)))
        job_log.close()
        assert any("is full" in r.getMessage() for r in caplog.records)
        writer.close()


HOSTILE = {
    "invalid UTF-8": b'{"barrier":"\xff"}',
    "nested 20000 deep": b"[" * 20_000 + b"]" * 20_000,
    "a lone surrogate": b'{"after_batch_id": "\\ud800"}',
}


def test_invalid_utf8_or_deep_json_on_any_log_route_is_a_json_4xx() -> None:
    with LogService() as service:
        for route in ("persisted", "spilled", "reset"):
            for what, body in HOSTILE.items():
                r = httpx.post(f"{service.url}/v1/tables/{TABLE}/{route}", content=body)
                assert 400 <= r.status_code < 500, (route, what, r.status_code, r.text)
                assert r.headers["content-type"] == "application/json", (route, what)
                assert r.json()["code"] == "invalid_request", (route, what, r.text)
        assert service.store.names() == []


# -- 4. the MetaService calls out only where it should ---------------------------------------


class Recorder(http.server.BaseHTTPRequestHandler):
    """Whatever answers at an address a writer published: records each request; ``/err``
    answers 500 with a secret, ``/slow`` drips its answer, ``/big`` streams megabytes."""

    protocol_version = "HTTP/1.1"
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "err":
            self._send(500, b"internal-only: db_password=hunter2")
        elif mode == "slow":
            self.send_response(200)
            self.send_header("Content-Length", "14")
            self.end_headers()
            for byte in b'{"tables": []}':
                time.sleep(1.0)
                try:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                except OSError:
                    return
        elif mode == "big":
            self.send_response(200)
            self.send_header("Content-Length", str(50 * 1024 * 1024))
            self.end_headers()
            try:
                for _ in range(50):
                    self.wfile.write(b" " * (1024 * 1024))
            except OSError:
                return
        else:
            self._send(200, b'{"secret": "internal-only"}')

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Threading(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


@pytest.fixture
def foreign() -> Iterator[tuple[str, list[str], Threading]]:
    seen: list[str] = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    server = Threading(("127.0.0.1", 0), handler)
    server.mode = "plain"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen, server
    server.shutdown()
    thread.join(timeout=10)


def test_only_a_log_service_that_proves_it_holds_a_token_gets_its_address_accepted(
    secured: Secured,
    checked_log: LogService,
    foreign: tuple[str, list[str], Threading],
) -> None:
    address, seen, _ = foreign
    writer = httpx.Client(base_url=secured.url + API, headers=bearer(secured.tokens[Role.WRITER]))
    log_path = f"/tables/{TABLE}/log"
    forged = writer.put(log_path, json={"mode": "external", "address": f"{address}/admin?drop=1"})
    assert forged.status_code == 422 and forged.json()["code"] == "log_address_unverified"
    assert seen == [], "an address with a path is never called"
    refused = writer.put(log_path, json={"mode": "external", "address": address})
    assert refused.status_code == 422 and refused.json()["code"] == "log_address_unverified"
    assert "proved" in refused.json()["message"] and "internal-only" not in refused.text
    assert [p.split("?")[0] for p in seen] == ["/v1/identity"], "one fixed path, nothing else"
    for port in (5432, 1):  # an open port that is no log service, and a closed one
        other = writer.put(
            log_path, json={"mode": "external", "address": f"http://127.0.0.1:{port}"}
        )
        assert other.json()["message"] == refused.json()["message"].replace(
            address, f"http://127.0.0.1:{port}"
        )
    # A log service holding a writer token proves it, and its status is shown.
    accepted = writer.put(log_path, json={"mode": "external", "address": checked_log.url})
    assert accepted.status_code == 200, accepted.text
    LogWriter(checked_log.url, token=secured.tokens[Role.WRITER]).reset(TABLE, after_batch_id=-1)
    reader = httpx.Client(base_url=secured.url + API, headers=bearer(secured.tokens[Role.READER]))
    shown = reader.get(log_path).json()
    assert shown["reachable"] is True and shown["status"]["epoch"] > 0, shown
    writer.close()
    reader.close()


def test_the_status_probe_has_one_deadline_a_bounded_answer_and_echoes_no_foreign_body(
    open_ms: MetaServiceClient, foreign: tuple[str, list[str], Threading]
) -> None:
    address, _, server = foreign
    open_ms.put_table_log(TABLE, mode="external", address=address)
    server.mode = "err"  # type: ignore[attr-defined]
    err = open_ms.get_table_log(TABLE)
    assert err.status is None and "hunter2" not in json.dumps(err.model_dump())
    server.mode = "big"  # type: ignore[attr-defined]
    started = time.monotonic()
    big = open_ms.get_table_log(TABLE)
    assert big.status is None and time.monotonic() - started < 5
    server.mode = "slow"  # type: ignore[attr-defined]
    started = time.monotonic()
    slow = open_ms.get_table_log(TABLE)
    waited = time.monotonic() - started
    assert slow.status is None and slow.error == f"no log service answered at {address}"
    assert waited < 5, waited  # one 2 s deadline for the probe, not 2 s per read


def test_slow_log_services_hold_no_request_thread(
    open_ms: MetaServiceClient, foreign: tuple[str, list[str], Threading]
) -> None:
    address, _, server = foreign
    server.mode = "slow"  # type: ignore[attr-defined]
    open_ms.put_table_log(TABLE, mode="external", address=address)
    url = open_ms.url + API
    with ThreadPoolExecutor(50) as pool:
        hogs = [pool.submit(httpx.get, f"{url}/tables/{TABLE}/log", timeout=60) for _ in range(45)]
        time.sleep(0.5)
        started = time.monotonic()
        jobs = httpx.get(f"{url}/jobs", timeout=60)
        waited = time.monotonic() - started
        assert all(h.result().status_code == 200 for h in hogs)
    assert jobs.status_code == 200 and waited < 5, waited  # 45 threads held: 20 s


def test_with_an_allowlist_only_its_addresses_are_accepted(
    db: str, clock: ManualClock, foreign: tuple[str, list[str], Threading]
) -> None:
    address, seen, _ = foreign
    settings = Settings(db_url=db, log_address_allowlist=["logs.internal:7070"])
    with LiveServer(create_app(settings, clock)) as server, MetaServiceClient(server.url) as ms:
        ms.put_job("load", outputs=[TABLE])
        refused = httpx.put(
            f"{server.url}{API}/tables/{TABLE}/log", json={"mode": "external", "address": address}
        )
        assert refused.status_code == 422 and "allowlist" in refused.json()["message"]
        assert seen == []
        ok = httpx.put(
            f"{server.url}{API}/tables/{TABLE}/log",
            json={"mode": "external", "address": "http://logs.internal:7070"},
        )
        assert ok.status_code == 200, ok.text


def test_a_revision_swap_resets_a_log_service_that_checks_tokens(
    db: str, secured: Secured, checked_log: LogService, caplog: pytest.LogCaptureFixture
) -> None:
    from metaservice.auth.log_services import log_service_check
    from metaservice.revisions.replaced_logs import drop_replaced
    from metaservice.revisions.swap_records import ReplacedLog

    writer = LogWriter(checked_log.url, token=secured.tokens[Role.WRITER])
    writer.reset(TABLE, after_batch_id=-1, job="load")
    writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(1, 2))
    before = checked_log.store.table(TABLE).status()
    replaced = [ReplacedLog(TABLE, checked_log.url)]
    with caplog.at_level("WARNING", logger="metaservice.revisions.replaced_logs"):
        drop_replaced(1, replaced)  # no credential: the log service refuses it
    assert "could not drop" in caplog.text and "401" in caplog.text
    assert checked_log.store.table(TABLE).status().entries == 1
    database = Database(db)
    try:
        ctx = Context(settings=Settings(db_url=db, auth_required=True), clock=ManualClock(T0))
        drop_replaced(1, replaced, log_service_check(database, ctx))
    finally:
        database.dispose()
    after = checked_log.store.table(TABLE).status()
    assert after.entries == 0 and after.epoch > before.epoch and after.job is None
    writer.close()


def test_a_scoped_writer_writes_only_the_logs_of_its_jobs_tables(
    db: str, secured: Secured, checked_log: LogService
) -> None:
    with secured.client(Role.WRITER) as ms:
        ms.put_job("other", outputs=["dw.other"])
    database = Database(db)
    try:
        ctx = Context(settings=Settings(db_url=db), clock=ManualClock(T0))
        scoped = database.write(
            lambda s: auth_service.create_token(s, ctx, Role.WRITER, "scoped", ["load"])
        ).token
    finally:
        database.dispose()
    with LogWriter(checked_log.url, token=scoped) as writer:
        writer.reset(TABLE, after_batch_id=-1, job="load")  # its job's table
        assert writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(1))
        with pytest.raises(LogApiError) as refused:
            writer.reset("dw.other", after_batch_id=-1, job="other")
    assert refused.value.status == 403 and refused.value.code == "out_of_scope"
    assert checked_log.store.names() == [TABLE]
    with LogClient(checked_log.url, token=scoped) as reading:  # reading stays open to it
        assert reading.status(TABLE)[0]["entries"] == 1
