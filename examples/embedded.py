"""A MetaService inside the current process (uvicorn in a thread), for demos and tests."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from metaservice.app import create_app
from metaservice.migrate import upgrade
from metaservice.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedMetaService:
    """``with EmbeddedMetaService(settings) as url:`` serves the API on a loopback port."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        upgrade(settings.db_url)
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=settings.port or free_port(),
            log_level="warning",
        )
        self.server = uvicorn.Server(config)
        self.url = f"http://127.0.0.1:{config.port}"
        self._thread = threading.Thread(target=self.server.run, name="metaservice", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the embedded MetaService did not start")
            time.sleep(0.05)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
