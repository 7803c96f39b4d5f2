"""``/docs`` and ``/redoc`` work with no internet: every script, style and icon they load
is served by the MetaService itself; the OpenAPI operation ids are the endpoints' names."""

from __future__ import annotations

import gc
import re
import weakref
from collections.abc import Iterator
from urllib.parse import urljoin

import httpx
import pytest
from fastapi.testclient import TestClient

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.settings import Settings
from tests.metaservice.live_server import LiveServer

# src="...", href="...", url(...), and bare URLs in the pages' inline scripts
REFERENCE = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\(\s*["']?([^"')]+)""")
EXTERNAL = re.compile(r"""https?://[^\s"'()<>]+""")


@pytest.fixture
def server(sqlite_url: str, clock: ManualClock) -> Iterator[LiveServer]:
    with LiveServer(create_app(Settings(db_url=sqlite_url), clock)) as live:
        yield live


def _references(page: str) -> list[str]:
    return [a or b for a, b in REFERENCE.findall(page)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_page_loads_only_assets_the_service_serves(server: LiveServer, page: str) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        html = http.get(page)
        assert html.status_code == 200
        assert "text/html" in html.headers["content-type"]
        assert EXTERNAL.findall(html.text) == []  # no CDN, no fonts, no validator
        assets = _references(html.text)
        assert any(a.endswith(".js") for a in assets), html.text
        for asset in assets:
            assert not asset.startswith("//"), asset
            answer = http.get(urljoin(server.url + page, asset))
            assert answer.status_code == 200, asset
            assert len(answer.content) > 1000 or asset.endswith(".png"), asset
            if asset.endswith(".css"):  # fonts or images a stylesheet pulls in
                assert [u for u in EXTERNAL.findall(answer.text) if "cdn" in u] == []
        # the page's own OpenAPI document, from the same service
        assert "'/openapi.json'" in html.text or '"/openapi.json"' in html.text
        assert http.get("/openapi.json").status_code == 200


def test_swagger_ui_has_no_online_validator(server: LiveServer) -> None:
    html = httpx.get(server.url + "/docs", timeout=10).text
    assert '"validatorUrl": null' in html


def test_the_oauth2_redirect_page_is_served(server: LiveServer) -> None:
    answer = httpx.get(server.url + "/docs/oauth2-redirect", timeout=10)
    assert answer.status_code == 200 and "oauth2" in answer.text.lower()


def test_operation_ids_are_the_endpoint_names_and_unique(server: LiveServer) -> None:
    spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
    ids = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    by_route = {
        (method.upper(), path): op["operationId"]
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
    }
    assert by_route[("PUT", "/api/v1/jobs/{job}")] == "put_job"
    assert by_route[("GET", "/api/v1/versions/consistent")] == "consistent_version"
    assert by_route[("POST", "/api/v1/commits")] == "report_commit"
    assert by_route[("GET", "/metrics")] == "metrics"
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", i) for i in ids), ids


def test_an_app_that_served_its_docs_pages_is_freed_after_its_lifespan(sqlite_url: str) -> None:
    """FastAPI keeps the callables of every route it built in module-level caches (4,096
    entries each): a page closing over its app kept the apps a process built alive, with
    their databases (80 after test_tags' 82 tests, in one process)."""
    app = create_app(Settings(db_url=sqlite_url), ManualClock())
    with TestClient(app) as client:
        for page in ("/docs", "/docs/oauth2-redirect", "/redoc"):
            assert client.get(page).status_code == 200
    gone = weakref.ref(app)
    del app, client
    gc.collect()
    assert gone() is None
