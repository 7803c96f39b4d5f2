"""The MetaService in this process, on a real socket: uvicorn in a thread.

For tests of clients of the HTTP API (the CLI, /docs, /metrics) that want real HTTP and a
manual clock, and no second of process start-up::

    with LiveServer(create_app(settings, clock)) as server:
        httpx.get(server.url + "/healthz")
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, Self

import uvicorn

from tests.faults.processes import free_port


class LiveServer:
    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, access_log=False, lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="live-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the MetaService did not start")
            time.sleep(0.01)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
