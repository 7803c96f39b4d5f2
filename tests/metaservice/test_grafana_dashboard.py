"""docs/grafana/metaservice.json: an importable dashboard whose every query names metrics
(and labels) that a running service really exposes on ``/metrics``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.migrate import upgrade
from metaservice.settings import Settings
from tests.metaservice.helpers import API, SLOT, consistent, source_and_derived
from tests.metaservice.live_server import LiveServer

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "metaservice.json"
METRIC = re.compile(r"\b(metaservice_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(metaservice_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its own


def _queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [
        target["expr"]
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    variables = [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs + variables


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


@pytest.fixture
def exposed(sqlite_url: str, clock: ManualClock) -> dict[str, set[str]]:
    """Sample name -> its label names, scraped over HTTP from the service with a topology
    that has committed, a batch left open and consistent-version requests answered."""
    upgrade(sqlite_url)
    with (
        LiveServer(create_app(Settings(db_url=sqlite_url), clock)) as live,
        httpx.Client(base_url=live.url, timeout=10) as http,
    ):
        source_and_derived(http, clock)  # type: ignore[arg-type]
        assert http.post(f"{API}/jobs/src/batches/2/barrier").status_code == 200  # left open
        clock.advance(SLOT)
        assert consistent(http, "ods.orders,dw.detail").status_code == 200  # type: ignore[arg-type]
        answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def test_every_metric_the_dashboard_queries_is_exposed_with_the_labels_it_uses(
    dashboard: dict[str, Any], exposed: dict[str, set[str]]
) -> None:
    queries = _queries(dashboard)
    used = {name for query in queries for name in METRIC.findall(query)}
    assert used, "the dashboard queries no metaservice_ metric"
    assert sorted(used - set(exposed)) == [], f"not on /metrics: {sorted(used - set(exposed))}"
    for query in queries:
        assert METRIC.search(query), f"a query of no MetaService metric: {query}"
        for name, matchers in SELECTOR.findall(query):
            for label in MATCHER.findall(matchers):
                assert label in exposed[name], f"{name} has no label {label!r}: {query}"
        grouped = {label.strip() for group in GROUPING.findall(query) for label in group.split(",")}
        labels = set().union(*(exposed[name] for name in METRIC.findall(query)))
        assert grouped - {"le"} <= labels, f"grouped by labels it lacks: {query}"


def test_the_dashboard_is_importable_json_with_unique_panel_ids(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "metaservice" and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    (source,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert source["name"] == "datasource" and source["query"] == "prometheus"
    # every panel the issue asks for
    exprs = "\n".join(_queries(dashboard))
    for needed in (
        "metaservice_table_frontier_timestamp_seconds",
        "metaservice_table_delay_seconds",
        "metaservice_table_consistent_version_age_seconds",
        "deriv(metaservice_job_last_batch_id",
        "metaservice_job_last_report_timestamp_seconds",
        "metaservice_job_open_batches",
        "metaservice_http_request_duration_seconds_bucket",
    ):
        assert needed in exprs, needed
