"""An HTTP proxy between a Spark job and the MetaService that holds the job's commit
reports back and lets them land at the worst moment for "one end per batch": right
after the first barrier source of a trigger has asked for its end, before the others.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx

_REPORTS = ("/api/v1/commits", "/api/v1/commits/batch")
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


class ReportGate:
    """``with ReportGate(url) as proxy_url:``; register the job with ``proxy_url``.

    A commit report waits until the job's first barrier source (the one Spark asks
    first in a trigger) has had its ``next-barrier`` answer from the MetaService; it
    is then delivered before that answer goes back to Spark, so the job's other
    sources ask after it landed. ``raced`` counts the times that happened.
    """

    def __init__(self, target: str, timeout_s: float = 20.0) -> None:
        self.target = target.rstrip("/")
        self.timeout_s = timeout_s
        self.raced = 0
        self.first_source: str | None = None
        self._calls = 0
        self._held = 0
        self._delivered = 0
        self._round = 0
        self._open = False  # reports pass straight through
        self._cond = threading.Condition()
        self._http = httpx.Client(base_url=self.target, timeout=60)
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                gate._handle(self)

            def do_POST(self) -> None:
                gate._handle(self)

            def do_PUT(self) -> None:
                gate._handle(self)

            def do_DELETE(self) -> None:
                gate._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.open()
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    def open(self) -> None:
        """Hold nothing back any more."""
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> httpx.Response:
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_HEADERS}
        return self._http.request(handler.command, handler.path, headers=headers, content=body)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        parsed = urlparse(handler.path)
        if handler.command == "POST" and parsed.path in _REPORTS:
            self._hold_report()
            response = self._forward(handler, body)
            with self._cond:
                self._held -= 1
                self._delivered += 1
                self._cond.notify_all()
        elif parsed.path.endswith("/next-barrier"):
            response = self._forward(handler, body)
            self._after_next_barrier(parse_qs(parsed.query).get("source", [None])[0])
        else:
            response = self._forward(handler, body)
        handler.send_response(response.status_code)
        for key, value in response.headers.items():
            if key.lower() not in _HOP_HEADERS:
                handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(response.content)))
        handler.end_headers()
        handler.wfile.write(response.content)

    def _hold_report(self) -> None:
        with self._cond:
            self._held += 1
            round_ = self._round
            self._cond.wait_for(lambda: self._round > round_ or self._open, self.timeout_s)

    def _after_next_barrier(self, source: str | None) -> None:
        with self._cond:
            self._calls += 1
            if self._calls == 1:
                self.first_source = source
            # Sources that do not say who they are: Spark asks them in turn.
            first = source == self.first_source if source else self._calls % 2 == 1
            if not first or not self._held or self._open:
                return
            goal = self._delivered + self._held
            self._round += 1
            self._cond.notify_all()
            if self._cond.wait_for(lambda: self._delivered >= goal, self.timeout_s):
                self.raced += 1
