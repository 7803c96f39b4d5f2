"""Delivers the queued OpenLineage events (``openlineage_outbox``) to the backend.

As the Spark side's report outbox does: at-least-once, oldest first; an event leaves
the queue only once the backend answered 2xx. Each event is retried a few times right
away (tenacity, exponential backoff) when the backend is unreachable or answers 5xx,
408 or 429; then the round ends and the queue waits ``openlineage_retry_seconds`` (an
unreachable backend loses nothing, and events keep their order: a waiting event holds
back every later one). An event the backend refuses (another 4xx) is set aside with
its error (``due_ms`` = ``REFUSED_DUE_MS``): kept for an operator, never blocking the
others.

Several processes may send from one database (``--workers N``, replicas): a round
takes its events under ``FOR UPDATE`` and holds them for ``HOLD_MS``, so two senders
never send the same event, nor out of order (unless one dies mid-round: then the other
sends its events after the hold, at-least-once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from urllib.parse import urljoin

import httpx
from sqlalchemy.orm import Session
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from metaservice.db import Database
from metaservice.openlineage import repository as repo
from metaservice.settings import Settings

log = logging.getLogger(__name__)

HOLD_MS = 60_000
ROUND_SIZE = 100
ATTEMPTS = 3


def _now_ms() -> int:
    return int(time.time() * 1000)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return status >= 500 or status in (408, 429)
    return False


class Sender:
    """Sends the queue on a daemon thread: after each commit that queued an event
    (:meth:`wake`) and every ``openlineage_retry_seconds``."""

    def __init__(self, db: Database, settings: Settings) -> None:
        if not settings.openlineage_url:
            raise ValueError("no OpenLineage URL to send to")
        self.db = db
        self.url = urljoin(
            settings.openlineage_url.rstrip("/") + "/", settings.openlineage_endpoint
        )
        self.retry_ms = int(settings.openlineage_retry_seconds * 1000)
        headers = {"Content-Type": "application/json"}
        if settings.openlineage_api_key:
            headers["Authorization"] = f"Bearer {settings.openlineage_api_key}"
        self.http = httpx.Client(headers=headers, timeout=10)
        self.delivered = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="metaservice-openlineage", daemon=True
        )
        self._retrying = Retrying(
            stop=stop_after_attempt(ATTEMPTS),
            wait=wait_exponential(multiplier=0.05, max=1),
            retry=retry_if_exception(_transient),
            reraise=True,
        )

    def start(self) -> Sender:
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 30) -> None:
        """Stop after the event under way (the rest stays queued for the next start)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        self.http.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.send_round()
            except Exception:  # the database unreachable: the next round tries again
                log.exception("OpenLineage round failed; retrying in %d ms", self.retry_ms)
            self._wake.wait(self.retry_ms / 1000)
            self._wake.clear()

    def send_round(self) -> int:
        """Send the events that are due, oldest first; how many the backend took."""
        sent = 0
        while not self._stop.is_set():
            batch = self.db.write(self._claim)
            if not batch:
                return sent
            for index, (event_id, payload) in enumerate(batch):
                if self._stop.is_set():
                    self._release([i for i, _ in batch[index:]], _now_ms())
                    return sent
                try:
                    self._retrying(self._post, payload)
                except Exception as exc:
                    error = _describe(exc)
                    later = _now_ms() + self.retry_ms
                    if _transient(exc) or not isinstance(exc, httpx.HTTPStatusError):
                        self._failed(event_id, error, later)
                        log.warning(
                            "OpenLineage backend unreachable (%s); events stay queued", error
                        )
                        self._release([i for i, _ in batch[index + 1 :]], later)
                        return sent
                    log.error("OpenLineage backend refused event %d: %s", event_id, error)
                    self._failed(event_id, error, repo.REFUSED_DUE_MS)
                    continue
                self._delivered(event_id)
                sent += 1
                self.delivered += 1
        return sent

    def _claim(self, session: Session) -> list[tuple[int, str]]:
        now = _now_ms()
        due = []
        # In order: an event not due yet (waiting after a failure, or held by another
        # sender) holds back every later one.
        for row in repo.oldest_events(session, ROUND_SIZE):
            if row.due_ms > now:
                break
            due.append(row)
        repo.hold(session, [r.id for r in due], now + HOLD_MS)
        return [(r.id, r.payload) for r in due]

    def _failed(self, event_id: int, error: str, due_ms: int) -> None:
        self.db.write(lambda s: repo.failed(s, [event_id], error, due_ms))

    def _delivered(self, event_id: int) -> None:
        self.db.write(lambda s: repo.delivered(s, event_id))

    def _release(self, ids: Sequence[int], due_ms: int) -> None:
        if ids:
            self.db.write(lambda s: repo.hold(s, ids, due_ms))

    def _post(self, payload: str) -> None:
        self.http.post(self.url, content=payload.encode("utf-8")).raise_for_status()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}: {exc.response.text[:500]}"
    return f"{type(exc).__name__}: {exc}"
