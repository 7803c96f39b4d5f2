"""The web console in headless Chromium against the real service over HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from metaservice.auth import service as auth_service
from metaservice.auth.schemas import Role
from metaservice.db import Database
from metaservice.settings import Settings
from tests.faults.processes import free_port
from tests.metaservice.helpers import put_job
from tests.ui.conftest import START_MS, Service
from tests.ui.topologies import warehouse, wide

pytestmark = pytest.mark.browser

JOBS = ["orders_src", "items_src", "detail", "revenue", "report"]
TABLES = ["ods.orders", "ods.items", "dwd.order_detail", "dws.item_revenue", "ads.daily_report"]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The warehouse topology on a service of its own (module-scoped: tests only read it)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('ui-small') / 'metaservice.db'}"
    with Service(url) as svc:
        warehouse(svc.http, svc.clock)
        yield svc


def open_console(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-loaded]", timeout=15_000)


def drawn(page: Any) -> set[str]:
    return set(page.evaluate("() => window.metaConsole.drawnNodes()"))


def jobs(nodes: Any) -> set[str]:
    return {n for n in nodes if n.startswith("job:")}


def click_node(page: Any, node_id: str) -> None:
    """Click where the graph draws the node (the graph is a canvas: no DOM element)."""
    pos = page.evaluate("id => window.metaConsole.nodePosition(id)", node_id)
    assert pos is not None, f"{node_id} is not drawn"
    page.mouse.click(pos["x"], pos["y"])


def check_screenshot(page: Any, path: Path, min_colours: int = 40) -> None:
    """The screenshot is a real PNG of the page's size with some variety in it."""
    page.screenshot(path=str(path))
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1280, 800), (image.format, image.size)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
    assert len(colours) >= min_colours, f"{path} has {len(colours)} colours: a blank page?"
    # Not one colour with a few specks: the most common one (the background) covers less
    # than 97 % of the picture.
    assert max(n for n, _ in colours) < 0.97 * 1280 * 800, f"{path} is almost blank"


def test_ui_redirects_to_the_console_and_ships_its_assets_with_licences(small: Service) -> None:
    r = small.http.get("/ui", follow_redirects=True)
    assert r.status_code == 200 and "MetaService console" in r.text
    assert "http://" not in r.text and "https://" not in r.text  # no CDN
    for asset in ("console.js", "console.css", "vendor/cytoscape.min.js"):
        assert small.http.get(f"/ui/{asset}").status_code == 200, asset
    for licence in ("cytoscape", "cytoscape-dagre", "dagre"):
        assert (
            "Permission is hereby granted" in small.http.get(f"/ui/vendor/{licence}.LICENSE").text
        )


def test_graph_shows_jobs_and_tables_and_a_click_opens_the_table_page(
    small: Service, page: Any, tmp_path: Path
) -> None:
    open_console(page, small.url + "/ui/")
    page.wait_for_function("() => window.metaConsole.drawnNodes().length >= 10")
    assert drawn(page) == {f"job:{j}" for j in JOBS} | {f"table:{t}" for t in TABLES}
    # Where engines attach to read every table at one consistent version.
    assert page.inner_text("#catalog-uri") == small.url + "/iceberg"
    assert "5 tables, 5 jobs" in page.inner_text("#focus-label")
    check_screenshot(page, tmp_path / "graph.png")

    click_node(page, "table:dwd.order_detail")
    page.wait_for_selector("[data-side-table='dwd.order_detail']")
    # The critical path of the selected table, from /delay: detail, held back by ods.items.
    page.wait_for_function("() => window.metaConsole.criticalNodes().includes('job:items_src')")
    assert {"table:dwd.order_detail", "job:detail", "table:ods.items"} <= set(
        page.evaluate("() => window.metaConsole.criticalNodes()")
    )
    assert "held back by ods.items" in page.inner_text("#side")
    check_screenshot(page, tmp_path / "selected.png")

    page.click("#open-table")
    page.wait_for_selector("[data-snapshots]")
    rows = page.locator("[data-snapshots] tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).get_attribute("data-snapshot") == "3001"  # newest first
    assert "Snapshots (2, newest first)" in page.inner_text("[data-card='snapshots']")
    assert "2023-11-14T22:13:21Z" in page.inner_text("[data-card='snapshots']")
    # The rest of the page: the lease the topology took, the expiry plan, a version.
    assert "in 10 min" in page.inner_text("[data-card='leases']")
    assert "current snapshot" in page.inner_text("[data-card='expiry']")
    assert "3001" in page.inner_text("[data-card='consistent']")
    rows.nth(0).click()
    page.wait_for_function(
        "() => document.querySelector(\"[data-card='lineage']\").innerText.includes('ods.orders')"
    )
    assert "batch 1 of detail" in page.inner_text("[data-card='lineage']")
    check_screenshot(page, tmp_path / "table.png")


def test_console_follows_new_commits_without_a_reload(small: Service, page: Any) -> None:
    open_console(page, small.url + "/ui/?poll_ms=300#/table/ods.orders")
    page.wait_for_selector("[data-snapshots]")
    count = page.locator("[data-snapshots] tbody tr").count()
    batch = small.http.get("/api/v1/jobs/orders_src").json()["last_batch_id"] + 1
    small.clock.advance(1000)
    r = small.http.post(f"/api/v1/jobs/orders_src/batches/{batch}/barrier")
    barrier = r.json()["barrier"]
    commit = {
        "job": "orders_src",
        "batch_id": batch,
        "barrier": barrier,
        "table": "ods.orders",
        "snapshot_id": 1999,
    }
    assert small.http.post("/api/v1/commits", json=commit).status_code == 200
    page.wait_for_selector("[data-snapshots] tr[data-snapshot='1999']", timeout=5000)
    assert page.locator("[data-snapshots] tbody tr").count() == count + 1


def test_revisions_page_lists_revisions(small: Service, page: Any) -> None:
    open_console(page, small.url + "/ui/#/revisions")
    page.wait_for_selector("#view-revisions h2")
    assert "no revisions" in page.inner_text("#view-revisions")


def test_a_thousand_tables_search_and_focus_on_a_neighbourhood(
    browser: Any, tmp_path: Path
) -> None:
    with Service(f"sqlite:///{tmp_path / 'metaservice.db'}") as svc:
        wide(svc.http, svc.clock)
        assert svc.http.get("/api/v1/tables", params={"limit": 1}).json()["total"] == 1000
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        try:
            started = time.monotonic()
            open_console(page, svc.url + "/ui/")
            first_paint = time.monotonic() - started
            # Too many to draw: nothing is drawn, the page says how to focus.
            assert drawn(page) == set()
            assert "1000 tables and 100 jobs" in page.inner_text("#graph-message")

            started = time.monotonic()
            page.fill("#search", "t030_1")
            page.wait_for_selector("#suggestions li[data-name='db2.t030_1']")
            page.press("#search", "Enter")
            # Drawn, with the critical path (from /delay) up to a source job.
            page.wait_for_function(
                "() => window.metaConsole.criticalNodes().some(n => /^job:job00/.test(n))"
            )
            focus_render = time.monotonic() - started
            nodes = drawn(page)
            assert "table:db2.t030_1" in nodes
            # Two jobs away: its writer job030 and that job's inputs' writers (job015,
            # job027), its reader job061 and that job's outputs' reader job064; and the
            # table's critical path, drawn up to a source job wherever it leads.
            critical = jobs(page.evaluate("() => window.metaConsole.criticalNodes()"))
            assert "job:job030" in critical and critical & {f"job:job{j:03d}" for j in range(10)}
            near = {f"job:job{j:03d}" for j in (30, 15, 27, 61, 64)}
            assert jobs(nodes) == near | critical
            assert len(nodes) < 100, len(nodes)
            check_screenshot(page, tmp_path / "focus.png")

            page.select_option("#hops", "1")
            page.wait_for_function(f"() => window.metaConsole.drawnNodes().length < {len(nodes)}")
            assert jobs(drawn(page)) == {"job:job030", "job:job061"} | critical
        finally:
            context.close()
    # For the record only: speed is bench_console's to measure (a clean-clone CI run beside
    # other workers once took 12 s for a focus that takes 0.6 s alone).
    print(f"1,000 tables: first paint {first_paint:.2f} s, focus {focus_render:.2f} s")


def test_a_table_page_shows_its_log_as_its_log_service_holds_it_or_that_it_is_unreachable(
    tmp_path: Path, page: Any
) -> None:
    """Real log services on loopback: one holding a committed and an uncommitted batch with
    a reader, one over its memory bound, and an address nothing listens on."""
    pa = pytest.importorskip("pyarrow")
    from metaservice.logstore import LogClient, LogFullError, LogWriter
    from metaservice.logstore.server import LogService
    from metaservice.logstore.store import LogStore

    sixty_four = pa.table({"id": list(range(64))})  # 512 bytes in memory
    down = f"http://127.0.0.1:{free_port()}"
    with (
        Service(f"sqlite:///{tmp_path / 'metaservice.db'}") as svc,
        LogService() as logs,
        LogService(LogStore(max_bytes=256)) as small_logs,
    ):
        put_job(svc.http, "events", ["dw.orders", "dw.big", "dw.down", "dw.plain"])
        for table, mode, address in [
            ("dw.orders", "embedded", logs.url),
            ("dw.big", "external", small_logs.url),
            ("dw.down", "external", down),
        ]:
            r = svc.http.put(f"/api/v1/tables/{table}/log", json={"mode": mode, "address": address})
            assert r.status_code == 200, r.text
        writer = LogWriter(logs.url)
        writer.reset("dw.orders", after_batch_id=-1)
        writer.append("dw.orders", barrier=START_MS, batch_id=0, rows=sixty_four)
        writer.persisted("dw.orders", barrier=START_MS, batch_id=0, snapshot_id=500)
        for _ in range(2):  # two executors' parts of batch 1, not committed yet
            writer.append("dw.orders", barrier=START_MS + 1000, batch_id=1, rows=sixty_four)
        with LogClient(logs.url) as reader:
            reader.read("dw.orders", after_batch=-1, reader="dashboard")
        with pytest.raises(LogFullError):  # past the bound: refused, the log falls behind
            LogWriter(small_logs.url).append(
                "dw.big", barrier=START_MS, batch_id=0, rows=sixty_four
            )

        open_console(page, svc.url + "/ui/#/table/dw.orders")
        page.wait_for_selector("[data-card='log'] [data-log-status]")
        shown = page.inner_text("[data-card='log']")
        assert "embedded" in shown and logs.url in shown
        assert page.get_attribute("[data-log-entries]", "data-log-entries") == "3"
        assert "1.5 KiB" in shown  # three entries of 512 bytes
        assert "batch 0, seq 1 (barrier 2023-11-14T22:13:20Z)" in shown  # first offset
        assert "batch 1, seq 3 (barrier 2023-11-14T22:13:21Z)" in shown  # last offset
        assert "batch 0, snapshot 500" in shown  # persisted through
        assert "dashboard" in shown
        assert "nothing (no spill folder)" in shown
        assert page.locator("[data-log-over-bound]").count() == 0
        check_screenshot(page, tmp_path / "table-log.png")

        page.goto(svc.url + "/ui/#/table/dw.big")
        page.wait_for_selector("[data-card='log'] [data-log-over-bound]")
        assert "over its memory bound" in page.inner_text("[data-card='log']")

        page.goto(svc.url + "/ui/#/table/dw.down")
        page.wait_for_selector("[data-card='log'] [data-log-unreachable]")
        unreachable = page.inner_text("[data-card='log']")
        assert "unreachable" in unreachable and down in unreachable
        assert page.locator("[data-card='log'] [data-log-status]").count() == 0

        page.goto(svc.url + "/ui/#/table/dw.plain")
        page.wait_for_selector("[data-table-title='dw.plain']")
        page.wait_for_selector("[data-card='snapshots']")
        assert page.locator("[data-card='log']").count() == 0  # no log, no section

        page.goto(svc.url + "/ui/#/tables")
        page.wait_for_selector("#view-tables table.grid")
        badges = page.locator("#view-tables [data-log]")
        marked = {
            badges.nth(i).evaluate("b => b.closest('td').querySelector('a').textContent")
            for i in range(badges.count())
        }
        assert marked == {"dw.orders", "dw.big", "dw.down"}
        assert "null" not in page.inner_text("#view-tables")  # an absent part is no text


def test_a_table_page_shows_each_service_of_a_log_spread_over_several(
    tmp_path: Path, page: Any
) -> None:
    pa = pytest.importorskip("pyarrow")
    from metaservice.logstore import LogWriter
    from metaservice.logstore.server import LogService

    down = f"http://127.0.0.1:{free_port()}"
    with Service(f"sqlite:///{tmp_path / 'metaservice.db'}") as svc, LogService() as logs:
        put_job(svc.http, "events", ["dw.clicks"])
        addresses = [logs.url, down]
        r = svc.http.put(
            "/api/v1/tables/dw.clicks/log", json={"mode": "external", "addresses": addresses}
        )
        assert r.status_code == 200, r.text
        writer = LogWriter(logs.url)
        writer.reset("dw.clicks", after_batch_id=-1)
        writer.append("dw.clicks", barrier=START_MS, batch_id=0, rows=pa.table({"id": [1, 2]}))

        open_console(page, svc.url + "/ui/#/table/dw.clicks")
        page.wait_for_selector("[data-card='log'] [data-log-services='2']")
        shown = page.inner_text("[data-card='log']")
        assert "2 (rows spread by partition)" in shown
        held = page.locator(f"[data-log-service='{logs.url}']")
        assert held.locator("[data-log-entries]").get_attribute("data-log-entries") == "1"
        gone = page.inner_text(f"[data-log-service='{down}']")
        assert "unreachable" in gone


def test_with_auth_on_the_console_asks_for_a_token_once(tmp_path: Path, page: Any) -> None:
    url = f"sqlite:///{tmp_path / 'metaservice.db'}"
    with Service(url, auth_required=True) as svc:
        db = Database(url)
        try:
            token = db.write(
                lambda session: auth_service.create_token(session, svc_ctx(url), Role.READER, "")
            ).token
        finally:
            db.dispose()
        page.goto(svc.url + "/ui/")
        page.wait_for_selector("#token-bar:not([hidden])")
        page.fill("#token-input", token)
        page.click("#token-form button[type=submit]")
        page.wait_for_selector("body[data-loaded]")
        assert page.evaluate("() => sessionStorage.getItem('metaservice.token')") == token
        assert page.is_hidden("#token-bar")
        page.reload()  # kept for the tab: no question again
        page.wait_for_selector("body[data-loaded]")
        assert page.is_hidden("#token-bar")
        assert httpx.get(svc.url + "/api/v1/jobs").status_code == 401


def svc_ctx(url: str) -> Any:
    from metaservice.clock import ManualClock
    from metaservice.context import Context

    return Context(settings=Settings(db_url=url), clock=ManualClock(0))
