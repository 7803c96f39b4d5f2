"""Delivery of commit reports: through the durable outbox (default) or directly.

Reports are idempotent at the MetaService, so at-least-once delivery is enough.
The outbox also carries a source job's offline claims and grant releases
(``spark_barrier/offline.py``), delivered in the same order as the commits.
"""

from __future__ import annotations

import logging
import time
from itertools import groupby
from pathlib import Path
from typing import Any, Protocol

from metaservice.client import ApiError, ConflictError, MetaServiceClient, Unavailable
from spark_barrier.offline import CLAIM, RELEASE
from spark_barrier.outbox import Deliverer, Outbox

log = logging.getLogger("spark_barrier.report")


class Reporter(Protocol):
    def report(self, report: dict[str, Any]) -> None: ...

    def flush(self, timeout: float | None = None) -> bool: ...

    def close(self) -> None: ...


class OutboxReporter:
    """Appends each report to a local write-ahead log (fsync) and delivers it in the
    background, in order, retrying while the MetaService is unreachable."""

    def __init__(
        self, client: MetaServiceClient, directory: str | Path, **outbox_options: Any
    ) -> None:
        self.client = client
        self.outbox = Outbox(directory, **outbox_options)
        self.deliverer = Deliverer(self.outbox, self._send, name=f"outbox:{Path(directory).name}")
        self.deliverer.start()

    def _send(self, batch: list[dict[str, Any]]) -> None:
        """Deliver records in order: runs of commit reports in one request each."""
        for kind, run in groupby(batch, key=lambda record: record.get("kind", "commit")):
            records = list(run)
            if kind == "commit":
                self._send_commits(records)
            else:
                for record in records:
                    self._send_control(record)

    def _send_control(self, record: dict[str, Any]) -> None:
        try:
            if record["kind"] == CLAIM:
                self.client.batch_barrier(
                    record["job"], record["batch_id"], claim=record["barrier"]
                )
            elif record["kind"] == RELEASE:
                self.client.release_offline_grant(record["job"])
            else:
                log.error("unknown outbox record %s; skipped", record)
        except ApiError as exc:
            if exc.status >= 500:
                raise
            # Refused for good; its commit report will be refused too, and
            # `metaservice reconcile` can rebuild the mapping from the table.
            log.error("MetaService refused %s: %s", record, exc.message)

    def _send_commits(self, batch: list[dict[str, Any]]) -> None:
        try:
            self.client.report_commits(batch)
        except ConflictError as exc:
            # Refused for good: retrying would block every later report. The batch is
            # refused as a whole, so deliver the others one by one and log the bad one.
            if len(batch) == 1:
                log.error("MetaService refused report %s: %s", batch[0], exc.message)
                return
            for report in batch:
                self._send_commits([report])
        except ApiError as exc:
            if exc.status < 500:
                log.error("MetaService refused reports %s: %s", batch, exc.message)
                return
            raise

    def report(self, report: dict[str, Any]) -> None:
        self.outbox.append(report)

    def flush(self, timeout: float | None = None) -> bool:
        return self.deliverer.flush(timeout)

    def close(self) -> None:
        self.deliverer.close()
        self.outbox.close()


class DirectReporter:
    """Reports synchronously, retrying with backoff while the MetaService is unreachable."""

    def __init__(self, client: MetaServiceClient, give_up_after_s: float = 300.0) -> None:
        self.client = client
        self.give_up_after_s = give_up_after_s

    def report(self, report: dict[str, Any]) -> None:
        retry(lambda: self.client.report_commits([report]), self.give_up_after_s, "report a commit")

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


def retry(call: Any, give_up_after_s: float, what: str) -> Any:
    """Run ``call`` until the MetaService answers, with exponential backoff."""
    deadline = time.monotonic() + give_up_after_s
    delay = 0.2
    warned = False
    while True:
        try:
            result = call()
            if warned:
                log.info("MetaService reachable again; %s succeeded", what)
            return result
        except Unavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            if not warned:
                log.warning("cannot %s, retrying until it answers: %s", what, exc)
                warned = True
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
