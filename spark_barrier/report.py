"""Delivery of commit reports: through the durable outbox (default) or directly.

Reports are idempotent at the MetaService, so at-least-once delivery is enough.
The outbox also carries a source job's offline claims and grant releases
(``spark_barrier/offline.py``), delivered in the same order as the commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from metaservice.client import ApiError, MetaServiceClient, Unavailable
from spark_barrier.offline import CLAIM, RELEASE
from spark_barrier.outbox import Deliverer, Entry, Outbox

log = logging.getLogger("spark_barrier.report")


COMMIT = "commit"  # a record without a kind is a commit report


def worth_retrying(exc: ApiError) -> bool:
    """Whether a refusal may go away: the service's own failure, or a token or rate
    limit an operator can fix. Anything else is final, and the outbox drops the record
    (logged) rather than hold every later one back behind it."""
    return exc.status >= 500 or exc.status in (401, 403, 429)


# A report for a table its batch was not opened with (the table became the job's output
# later): refused for good, and nothing else is wrong. The table is recorded from the
# job's next batch on, so a driver goes on rather than fail the batch, which its replay
# would report, and be refused, again.
OUTPUT_ADDED_AFTER_BATCH = "output_added_after_batch"


class Reporter(Protocol):
    def report(self, report: dict[str, Any]) -> None: ...

    def flush(self, timeout: float | None = None) -> bool: ...

    def close(self) -> None: ...


class OutboxReporter:
    """Appends each report to a local write-ahead log (fsync) and delivers it in the
    background, in order, retrying while the MetaService is unreachable.

    With ``carry_s`` (a source job: see ``spark_barrier/carry.py``), a report waits up
    to that long for the job's next barrier request to carry it; one that request does
    not deliver is sent from here, as any other.
    """

    def __init__(
        self,
        client: MetaServiceClient,
        directory: str | Path,
        *,
        carry_s: float = 0.0,
        **outbox_options: Any,
    ) -> None:
        self.client = client
        self.carry_s = carry_s
        self.outbox = Outbox(directory, **outbox_options)
        self.deliverer = Deliverer(self.outbox, self._send, name=f"outbox:{Path(directory).name}")
        self.deliverer.start()

    # -- the barrier request's path (spark_barrier/carry.py) -----------------------

    def take_reports(self, job: str, limit: int = 100) -> list[Entry]:
        """The oldest undelivered records, if they are ``job``'s commit reports (a claim
        or a release goes first, from here), for a barrier request to carry."""
        if self.carry_s <= 0:
            return []
        return self.deliverer.take(
            limit, lambda r: r.get("kind", COMMIT) == COMMIT and r.get("job") == job
        )

    def settle(self, taken: list[Entry], acknowledged: bool) -> None:
        """What became of the records :meth:`take_reports` gave: acknowledged by the
        MetaService (delivered), or not (sent from here now)."""
        if taken:
            self.deliverer.settle(taken[-1].seq, acknowledged)

    def _send(self, batch: list[dict[str, Any]]) -> None:
        """Deliver records in order, in as few requests as that order allows.

        Between two releases, each job's claims go first, in one request per job, then
        the commit reports in one request: every commit report still arrives after its
        own batch's claim, and a source job may have several batches open at once.
        A release goes only after everything before it.
        """
        stretch: list[dict[str, Any]] = []
        for record in batch:
            if record.get("kind") == RELEASE:
                self._send_stretch(stretch)
                stretch = []
                self._send_release(record)
            else:
                stretch.append(record)
        self._send_stretch(stretch)

    def _send_stretch(self, records: list[dict[str, Any]]) -> None:
        claims = [r for r in records if r.get("kind") == CLAIM]
        for job in dict.fromkeys(r["job"] for r in claims):
            self._send_or_split([r for r in claims if r["job"] == job], self._send_claims)
        commits = [r for r in records if r.get("kind", COMMIT) == COMMIT]
        if commits:
            self._send_or_split(commits, self.client.report_commits)
        for record in records:
            if record.get("kind", COMMIT) not in (CLAIM, COMMIT):
                log.error("unknown outbox record %s; skipped", record)

    def _send_claims(self, claims: list[dict[str, Any]]) -> None:
        items = [(r["batch_id"], r["barrier"], r.get("query_id")) for r in claims]
        self.client.claim_barriers(claims[0]["job"], items)

    def _send_release(self, record: dict[str, Any]) -> None:
        self._send_or_split([record], lambda _: self.client.release_offline_grant(record["job"]))

    def _send_or_split(
        self, records: list[dict[str, Any]], send: Callable[[list[dict[str, Any]]], object]
    ) -> None:
        """Send ``records`` in one request. A refusal for good refuses the request as a
        whole: deliver the others one by one and log the bad one (retrying it would block
        every later record). A refused claim's commit report is refused too, and
        `metaservice reconcile` can rebuild its mapping from the table."""
        try:
            send(records)
        except ApiError as exc:
            if worth_retrying(exc):
                raise
            if len(records) == 1:
                log.error("MetaService refused %s: %s", records[0], exc.message)
                return
            for record in records:
                self._send_or_split([record], send)

    def report(self, report: dict[str, Any]) -> None:
        if self.carry_s > 0:
            # Held before it is appended: the deliverer wakes at the append.
            self.deliverer.hold(self.outbox.last_seq + 1, self.carry_s)
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
        try:
            retry(
                lambda: self.client.report_commits([report]),
                self.give_up_after_s,
                "report a commit",
            )
        except ApiError as exc:
            if exc.code != OUTPUT_ADDED_AFTER_BATCH:
                raise
            log.warning("MetaService refused %s for good: %s", report, exc.message)

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
