"""The console in headless Chromium: one browser for the session, the service on real HTTP.

The browser is Debian's ``chromium`` (``make install`` installs it), driven by playwright;
playwright's own browser downloads are never used. Without chromium the tests are skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.migrate import upgrade
from metaservice.settings import Settings
from tests.metaservice.live_server import LiveServer

CHROMIUM = os.environ.get("METASERVICE_TEST_CHROMIUM", "/usr/bin/chromium")
START_MS = 1_700_000_000_000


def chromium_path() -> str | None:
    if Path(CHROMIUM).exists():
        return CHROMIUM
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    path = chromium_path()
    if path is None:
        pytest.skip("Debian's chromium is not installed (make install installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=path, headless=True)
        try:
            yield launched
        finally:
            launched.close()


class Service:
    """The MetaService on a real socket, on a manual clock, with an httpx client to it."""

    def __init__(self, db_url: str, **settings: Any) -> None:
        upgrade(db_url)
        self.clock = ManualClock(START_MS)
        self.server = LiveServer(create_app(Settings(db_url=db_url, **settings), self.clock))

    def __enter__(self) -> Service:
        self.server.__enter__()
        self.url = self.server.url
        self.http = httpx.Client(base_url=self.url, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()
        self.server.__exit__(None, None, None)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"the console raised: {errors}"
