"""``/metrics`` over real HTTP: per-table freshness and per-job progress read from the
database, consistent-version requests by outcome, process metrics summed over
``--workers 2``; and ``--log-format json`` with a request id per request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.settings import Settings
from tests.faults.processes import ServiceProcess
from tests.metaservice.helpers import API, SLOT, put_job, source_and_derived, wait_for
from tests.metaservice.live_server import LiveServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def http(db_url: str, clock: ManualClock) -> Iterator[httpx.Client]:
    with (
        LiveServer(create_app(Settings(db_url=db_url), clock)) as live,
        httpx.Client(base_url=live.url, timeout=10) as client,
    ):
        yield client


def scrape(http: httpx.Client) -> Samples:
    answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def per(samples: Samples, name: str) -> dict[str, float]:
    """The samples of one per-table or per-job gauge, by their one label's value."""
    found = {}
    for (sample, labels), value in samples.items():
        if sample == name:
            ((_, label),) = labels  # one label only: bounded cardinality
            found[label] = value
    return found


def test_per_table_and_per_job_gauges_follow_the_database(
    http: httpx.Client, clock: ManualClock
) -> None:
    b = source_and_derived(http, clock)  # type: ignore[arg-type]
    put_job(http, "late", ["dws.never"], inputs=["dw.detail"])  # type: ignore[arg-type]
    assert http.post(f"{API}/jobs/src/batches/2/barrier").status_code == 200  # left open
    clock.advance(5 * SLOT)
    now = clock.now_ms()
    m = scrape(http)

    frontier = per(m, "metaservice_table_frontier_timestamp_seconds")
    delay = per(m, "metaservice_table_delay_seconds")
    age = per(m, "metaservice_table_consistent_version_age_seconds")
    # ods.orders waits for src's open batch 2 at now-5s: its frontier is the slot below
    assert frontier == {"ods.orders": (now - 6 * SLOT) / 1000, "dw.detail": b["der0"] / 1000}
    assert delay == {"ods.orders": 6.0, "dw.detail": (now - b["der0"]) / 1000}
    assert age == {"ods.orders": 6.0, "dw.detail": (now - b["der0"]) / 1000}
    assert "dws.never" not in delay  # never committed: no sample, not 56 years

    assert per(m, "metaservice_job_last_batch_id") == {"src": 1, "der": 0}  # committed
    assert per(m, "metaservice_job_open_batches") == {"src": 1, "der": 0, "late": 0}
    assert per(m, "metaservice_job_last_barrier_timestamp_seconds") == {
        "src": b["src1"] / 1000,
        "der": b["der0"] / 1000,
    }
    assert set(per(m, "metaservice_job_last_report_timestamp_seconds")) == {"src", "der"}

    # the source commits batch 2: the table catches up at the next scrape
    commit = {"job": "src", "batch_id": 2, "barrier": now - 5 * SLOT, "table": "ods.orders"}
    assert http.post(f"{API}/commits", json={**commit, "snapshot_id": 103}).status_code == 200
    m = scrape(http)
    assert per(m, "metaservice_table_delay_seconds")["ods.orders"] == 1.0  # the last closed slot
    assert per(m, "metaservice_job_open_batches")["src"] == 0
    assert per(m, "metaservice_job_last_batch_id")["src"] == 2


def test_consistent_version_requests_are_counted_by_outcome_with_latency(
    http: httpx.Client, clock: ManualClock
) -> None:
    def counts() -> dict[str, float]:
        m = scrape(http)
        name = "metaservice_consistent_version_request_duration_seconds_count"
        return {dict(labels)["outcome"]: v for (n, labels), v in m.items() if n == name}

    source_and_derived(http, clock)  # type: ignore[arg-type]
    put_job(http, "late", ["dws.never"], inputs=["dw.detail"])  # type: ignore[arg-type]
    before = counts()
    version = f"{API}/versions/consistent"
    for _ in range(3):
        assert http.get(version, params={"tables": "dw.detail"}).status_code == 200
    assert http.get(version, params={"tables": "dws.never"}).status_code == 409
    assert http.get(version, params={"tables": "no.such"}).status_code == 404
    lease = {"tables": ["dw.detail"], "lease_seconds": 60}
    assert http.post(f"{API}/leases", json=lease).status_code == 201
    after = counts()
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert grew == {"ok": 4, "none_yet": 1, "refused": 1}


def _started_workers(service: ServiceProcess) -> set[str]:
    """The worker processes that logged their start."""
    return {
        line.split("Started server process")[1]
        for line in service.log().splitlines()
        if "Started server process" in line
    }


@pytest.mark.slow  # a real `metaservice start --workers 2`: about 8 s
def test_workers_share_their_counts_and_log_json_lines_with_a_request_id(
    tmp_path: Path,
) -> None:
    db_url = f"sqlite:///{tmp_path / 'ms.db'}"
    log = tmp_path / "service.log"
    args = ["--workers", "2", "--log-format", "json"]
    with (
        ServiceProcess(db_url, log, extra_args=args) as service,
        httpx.Client(base_url=service.url, timeout=10) as http,
    ):
        # The service answers once one worker is up; the counts are shared only if both are
        # (a loaded machine starts the second one seconds after the first).
        assert wait_for(lambda: len(_started_workers(service)) >= 2, timeout=60), service.log()
        assert http.put(f"{API}/jobs/src", json={"outputs": ["ods.orders"]}).status_code == 201
        ids = []
        for _ in range(20):
            answer = http.get(f"{API}/jobs", headers={"Connection": "close"})
            assert answer.status_code == 200
            ids.append(answer.headers["X-Request-ID"])
        mine = http.get(f"{API}/tables", headers={"X-Request-ID": "trace-42"})
        assert mine.headers["X-Request-ID"] == "trace-42"
        assert len(set(ids)) == 20
        route = (("method", "GET"), ("route", "/api/v1/jobs"), ("status", "200"))
        name = "metaservice_http_request_duration_seconds_count"
        for _ in range(4):  # whichever worker answers the scrape, it counts all 20
            assert scrape(http)[(name, route)] == 20

    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    access = [x for x in lines if x["logger"] == "uvicorn.access"]
    assert {x["request_id"] for x in access if x["path"] == "/api/v1/jobs"} == set(ids)
    (traced,) = [x for x in access if x.get("request_id") == "trace-42"]
    assert (traced["method"], traced["path"], traced["status"]) == ("GET", "/api/v1/tables", 200)
    assert {x["level"] for x in lines} <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
    assert any(x["logger"] == "metaservice" for x in lines)  # the service's own lines too
