"""OpenLineage emit: events for barrier jobs, from a durable queue, to a real receiver.

The receiver is a small HTTP server on loopback started by each test (a thread); the
MetaService runs on a real socket with ``openlineage_url`` pointing at it, on SQLite
and PostgreSQL. START, RUNNING (per committed batch: snapshot, barrier, frontier) and
COMPLETE/FAIL come from the listener's job events and the commit reports.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.settings import Settings
from tests.faults.processes import free_port
from tests.metaservice.helpers import API, SLOT, T0, db_state, put_job, report, run_batch
from tests.metaservice.live_server import LiveServer


class Receiver:
    """An OpenLineage backend stand-in: keeps every POSTed event; ``refuse`` answers the
    next that many requests with 503."""

    def __init__(self, port: int, refuse: int = 0, reject: str | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.requests = 0
        self.refuse = refuse
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests += 1
                if receiver.refuse > 0:
                    receiver.refuse -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                assert self.path == "/api/v1/lineage", self.path
                if reject is not None and json.loads(body)["eventType"] == reject:
                    self.send_response(400)  # a backend that cannot read this event
                    self.end_headers()
                    return
                receiver.headers.append(dict(self.headers))
                receiver.events.append(json.loads(body))
                self.send_response(201)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(check: Callable[[], Any], what: str, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def service(db_url: str, clock: ManualClock, port: int) -> Iterator[httpx.Client]:
    settings = Settings(
        db_url=db_url,
        openlineage_url=f"http://127.0.0.1:{port}",
        openlineage_api_key="ol-secret",
        openlineage_namespace="prod",
        openlineage_retry_seconds=0.2,
    )
    with (
        LiveServer(create_app(settings, clock)) as server,
        httpx.Client(base_url=server.url, timeout=10) as http,
    ):
        yield http


def queued(db_url: str) -> list[tuple[Any, ...]]:
    return db_state(db_url)["openlineage_outbox"]


def job_event(http: httpx.Client, job: str, event: str, run_id: str, **extra: Any) -> None:
    r = http.post(f"{API}/jobs/{job}/events", json={"event": event, "run_id": run_id, **extra})
    assert r.status_code == 200, r.text


def test_events_wait_for_a_receiver_that_is_down_and_arrive_once_it_is_up(
    service, db_url, clock, port
):
    http = service
    put_job(http, "src", ["ods.orders"])
    put_job(http, "der", ["dw.detail"], inputs=["ods.orders"])
    run = str(uuid.uuid4())
    job_event(http, "der", "started", run)
    run_batch(http, "src", 0, {"ods.orders": 101})
    clock.advance(SLOT)
    run_batch(http, "src", 1, {"ods.orders": 102})
    clock.advance(SLOT)
    job_event(http, "der", "progress", run, batch_id=0)
    barrier = run_batch(http, "der", 0, {"dw.detail": 201})
    job_event(http, "der", "terminated", run)
    # Nobody listens on the port: every event is kept, and the sender has tried.
    wait_for(lambda: any(row[6] > 0 for row in queued(db_url)), "a failed delivery")
    rows = queued(db_url)
    assert len(rows) == 5  # der START, src RUNNING x2, der RUNNING, der COMPLETE
    assert all(row[7] for row in rows if row[6] > 0), "a failed try records its error"

    with Receiver(port) as receiver:
        wait_for(lambda: len(receiver.events) >= 5, "the events")
        wait_for(lambda: not queued(db_url), "an empty queue")
    assert receiver.headers[0]["Authorization"] == "Bearer ol-secret"
    der = [e for e in receiver.events if e["job"]["name"] == "der"]
    assert [e["eventType"] for e in der] == ["START", "RUNNING", "COMPLETE"]
    assert {e["run"]["runId"] for e in der} == {run}  # the listener's run
    assert all(e["job"]["namespace"] == "prod" for e in receiver.events)
    running = der[1]
    assert [(d["namespace"], d["name"]) for d in running["inputs"]] == [("prod", "ods.orders")]
    assert [(d["namespace"], d["name"]) for d in running["outputs"]] == [("prod", "dw.detail")]
    facet = running["run"]["facets"]["metaservice_batch"]
    assert {k: v for k, v in facet.items() if not k.startswith("_")} == {
        "batchId": 0,
        "barrier": barrier,
        "frontier": barrier,
        "snapshots": [{"table": "dw.detail", "snapshotId": 201}],
    }
    assert facet["_producer"] and facet["_schemaURL"]
    src = [e for e in receiver.events if e["job"]["name"] == "src"]
    assert [e["run"]["facets"]["metaservice_batch"]["snapshots"] for e in src] == [
        [{"table": "ods.orders", "snapshotId": 101}],
        [{"table": "ods.orders", "snapshotId": 102}],
    ]
    assert [e["run"]["facets"]["metaservice_batch"]["barrier"] for e in src] == [T0, T0 + SLOT]
    # Every event is a valid OpenLineage RunEvent: the MetaService's own ingest takes it.
    for event in receiver.events:
        r = http.post(f"{API}/lineage", json=event)
        assert r.status_code == 201, r.text


def test_a_failed_query_is_a_fail_event_with_its_error_and_5xx_is_retried(service, db_url, port):
    http = service
    with Receiver(port, refuse=2) as receiver:
        put_job(http, "src", ["ods.orders"])
        run = str(uuid.uuid4())
        job_event(http, "src", "started", run)
        job_event(http, "src", "failed", run, message="java.lang.OutOfMemoryError")
        wait_for(lambda: len(receiver.events) == 2, "two events")
        wait_for(lambda: not queued(db_url), "an empty queue")
    assert receiver.requests == 4  # two 503s, retried
    start, fail = receiver.events
    assert (start["eventType"], fail["eventType"]) == ("START", "FAIL")
    assert fail["run"]["facets"]["errorMessage"]["message"] == "java.lang.OutOfMemoryError"


def test_an_event_the_backend_refuses_is_set_aside_and_the_others_go_on(service, db_url, port):
    http = service
    put_job(http, "src", ["ods.orders"])
    with Receiver(port, reject="START") as receiver:
        job_event(http, "src", "started", str(uuid.uuid4()))
        run_batch(http, "src", 0, {"ods.orders": 101})
        wait_for(lambda: len(receiver.events) == 1, "the RUNNING event")
    assert receiver.events[0]["eventType"] == "RUNNING"
    ((_, job, event_type, _payload, _, due_ms, attempts, error),) = queued(db_url)
    assert (job, event_type, attempts) == ("src", "START", 1)
    assert error.startswith("HTTP 400") and due_ms > 2**61


def test_a_refused_request_queues_nothing(service, db_url, clock):
    http = service
    put_job(http, "src", ["ods.orders"])
    b = run_batch(http, "src", 0, {"ods.orders": 101})
    wait_for(lambda: queued(db_url), "the RUNNING event")
    before = queued(db_url)
    # A conflicting report (409) and a replayed one (duplicate) make no event.
    r = http.post(f"{API}/commits", json=report("src", 0, b, "ods.orders", 999))
    assert r.status_code == 409, r.text
    r = http.post(f"{API}/commits", json=report("src", 0, b, "ods.orders", 101))
    assert r.status_code == 200 and r.json()["status"] == "duplicate", r.text
    assert len(queued(db_url)) == len(before)


def test_without_an_openlineage_url_nothing_is_queued(db_url, clock):
    with (
        LiveServer(create_app(Settings(db_url=db_url), clock)) as server,
        # generous: this checks what is queued, and on a loaded machine one registration
        # once took over httpx's default 5 s (a clean-clone CI run, 2 AMD EPYC vCPUs)
        httpx.Client(base_url=server.url, timeout=30) as http,
    ):
        put_job(http, "src", ["ods.orders"])
        job_event(http, "src", "started", str(uuid.uuid4()))
        run_batch(http, "src", 0, {"ods.orders": 101})
    assert queued(db_url) == []
