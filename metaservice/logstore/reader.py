"""Following a table with second-level latency: :class:`LogReader`.

The reader holds one position: the newest committed snapshot it has delivered in full,
with its batch and the job whose batch that is (the snapshot's stamp), plus, while it
follows the log, each log service's ``(epoch, seq)``. Each :meth:`LogReader.poll` returns the rows
that are new since the last one:

- **From the log** while it is close behind: the entries after its seq.
- **From the table's snapshots** when the log no longer holds its position (410), when
  the log was reset by a restarting writer (the epoch changed), or when the log service
  is down (one warning until it is back): the rows the snapshots after its committed
  snapshot added. Then it asks the log again from the batch of the newest snapshot it
  read, and follows the log from there once the log holds everything after it.

A batch id is a position only among the batches of the job that stamped it: after a
revision swap, or any change of the table's writer, the newest snapshot may be stamped
by a job that no longer writes the table, whose batch 7 says nothing of the new
writer's batches 0-2. So the reader asks by batch *of a job*. The log of another job
(its writer names its job at its reset) answers from its start if it holds every batch
that job wrote, else 410, and the reader goes on with the snapshots until one is
stamped by the log's job.

**Several log services.** A table's writer may spread its rows over several log
services by partition (:mod:`metaservice.logstore.routing`); the reader merges them.
Each poll asks every service from its own ``(epoch, seq)``, and the committed snapshot
moves to the oldest batch every service has marked persisted and delivered in full
(the writer marks every service, also one that got none of the batch's rows). When any
one service is down, was reset or no longer holds the reader's position, the poll's
answers of all of them are dropped and the reader reads the snapshots after its
committed snapshot (the range it cannot prove it has from every service), then asks
every service by batch again: duplicates of the other services' rows, never a gap.

Every row of the table is delivered at least once: a switch re-reads from the last
snapshot it had in full, so rows it got from the log after that come again (duplicates,
never a gap). Rows carry ``_log_barrier`` and ``_log_batch``; ``_log_seq`` is null for
rows read from snapshots.

A reader made by :meth:`LogReader.from_metaservice` follows the log the table's writer
published: it asks the MetaService where that is while the log is down, after a reset,
and every ``check_log_seconds`` while it follows it. A new address (a restarted
writer's) is followed from the reader's committed snapshot; no log at all (a revision
swapped another table in under the name, and nothing logs it until its writer registers
again) leaves the log service it followed, so it never reads the replaced table's rows
there, and it reads the table's snapshots until a log is published again.

    >>> reader = LogReader("dw.orders", catalog=catalog, log_url=url)   # doctest: +SKIP
    >>> for rows in reader.follow():                                     # doctest: +SKIP
    ...     show(rows)
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from metaservice.contract import parse_stamp
from metaservice.logstore import wire
from metaservice.logstore.client import (
    LogApiError,
    LogClient,
    LogGoneError,
    LogRead,
    LogResetError,
    LogUnavailable,
    token_of,
)
from metaservice.logstore.snapshots import rows_after

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from metaservice.client import MetaServiceClient

__all__ = ["LogNotEnabled", "LogReader", "log_address"]

log = logging.getLogger(__name__)

Source = Literal["log", "snapshots"]


class LogNotEnabled(LookupError):
    """The table has no log registered with the MetaService."""


def log_address(metaservice: MetaServiceClient, table: str) -> str:
    """The address of the table's log service, as its writer registered it (a log spread
    over several services: their addresses separated by spaces; a :class:`LogReader`
    takes either)."""
    view = metaservice.get_table(table)
    if view.log is None:
        raise LogNotEnabled(
            f"table {table} has no log. Enable it in the job that writes it: "
            'register(..., log="embedded") runs one in its driver; or run '
            '`metaservice log start --port P` and register(..., log="external", '
            'log_url="http://host:P")'
        )
    return view.log.address


class LogReader:
    """Follows one table: from its log when close behind, else from its snapshots.

    ``start="latest"`` delivers what is committed after the table's current snapshot (and
    what the log holds past it); ``"earliest"`` delivers the table's current state first.
    ``load_table`` (default: ``catalog.load_table``) gives the pyiceberg table.
    ``resolve`` (given by :meth:`from_metaservice`) answers where the table's log is now
    (:class:`LogNotEnabled`: nowhere); it is asked every ``check_log_seconds`` while the
    reader follows the log, and every ``retry_log_seconds`` while the log is down or
    there is none. ``token``: a reader's, for log services that check tokens
    (:meth:`from_metaservice` takes the MetaService client's).
    """

    def __init__(
        self,
        table: str,
        *,
        log_url: str | Sequence[str] | None,
        catalog: Catalog | None = None,
        load_table: Callable[[str], Table] | None = None,
        start: Literal["earliest", "latest"] = "latest",
        reader_id: str | None = None,
        max_bytes: int = 64 * 1024 * 1024,
        retry_log_seconds: float = 2.0,
        timeout: float = 10.0,
        resolve: Callable[[], str] | None = None,
        check_log_seconds: float = 10.0,
        token: str | None = None,
    ) -> None:
        if load_table is None:
            if catalog is None:
                raise ValueError("give the table's catalog (or load_table)")
            load_table = catalog.load_table
        self.table = table
        self.reader_id = reader_id or f"reader-{uuid.uuid4().hex[:8]}"
        self._load_table = load_table
        # The table's log services: one, or several its writer spreads its rows over by
        # partition, merged here.
        self._token = token  # a reader's, for log services that check tokens
        self._logs = [LogClient(url, timeout=timeout, token=token) for url in _addresses(log_url)]
        # Where the log is now: a restarted writer's embedded log has a new address.
        self._resolve = resolve
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._retry_log_seconds = retry_log_seconds
        self._check_log_seconds = check_log_seconds
        self._check_at = time.monotonic() + check_log_seconds  # when to ask resolve next
        # The position: the newest snapshot delivered in full, and its batch: a batch of
        # committed_job's, meaningless in another job's log (None: not known)...
        self.committed_snapshot: int | None = None
        self.committed_batch: int | None = None
        self.committed_job: str | None = None
        # ...and, while following the log, where in each service's: (epoch, seq) by address.
        self.positions: dict[str, tuple[int, int]] = {}
        self.source: Source = "snapshots"
        self._log_down_since: float | None = None
        self._retry_log_at = 0.0
        if start == "latest":
            self._start_at_current_snapshot()

    @classmethod
    def from_metaservice(
        cls, table: str, metaservice: MetaServiceClient, **kwargs: object
    ) -> LogReader:
        """A reader of the log the table's writer registered (:class:`LogNotEnabled` when
        it has none). It asks ``metaservice`` (keep it open) where the log is while the log
        is down, after a reset and every ``check_log_seconds``, so it follows a restarted
        writer's new log service, and leaves a log that is no longer published (a
        revision swap) for the table's snapshots."""
        kwargs.setdefault("token", token_of(metaservice))
        return cls(
            table,
            log_url=log_address(metaservice, table),
            resolve=lambda: log_address(metaservice, table),
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def addresses(self) -> list[str]:
        """The log services the reader follows (none: it reads the snapshots only)."""
        return [client.url for client in self._logs]

    def close(self) -> None:
        for client in self._logs:
            client.close()

    # -- following ------------------------------------------------------------------
    def poll(self) -> pa.Table | None:
        """The rows that are new since the last poll (None when nothing is)."""
        now = time.monotonic()
        if self._resolve is not None and now >= self._check_at:
            self._check_address(now)
        if self._logs and now >= self._retry_log_at:
            rows = self._read_log()
            if self.source == "log":
                return rows
        return self._read_snapshots()

    def follow(
        self, interval: float = 0.2, stop: Callable[[], bool] = lambda: False
    ) -> Iterator[pa.Table]:
        """Yield new rows as they come, polling every ``interval`` seconds while idle."""
        while not stop():
            rows = self.poll()
            if rows is not None:
                yield rows
            else:
                time.sleep(interval)

    # -- the log --------------------------------------------------------------------
    def _read_log(self) -> pa.Table | None:
        """Rows from the log, every service's (each from its own position, or by batch
        from the committed one); leaves :attr:`source` at "snapshots" when they must be
        read. All or nothing: when one service cannot answer (down, reset, gone), the
        others' answers are dropped too and the reader goes back to its committed
        snapshot, the one position every service's rows are known to be in full."""
        answers: list[tuple[str, LogRead]] = []
        for client in self._logs:
            answer = self._read_one(client)
            if answer is None:
                return None
            answers.append((client.url, answer))
        self._log_up()
        return self._take(answers)

    def _read_one(self, client: LogClient) -> LogRead | None:
        """One service's answer; None when the snapshots must be read."""
        position = self.positions.get(client.url) if self.source == "log" else None
        try:
            if position is None:
                after_batch, job = self._batch_position()
                return client.read(
                    self.table,
                    after_batch=after_batch,
                    job=job,
                    reader=self.reader_id,
                    max_bytes=self._max_bytes,
                )
            epoch, seq = position
            return client.read(
                self.table,
                after_seq=seq,
                epoch=epoch,
                reader=self.reader_id,
                max_bytes=self._max_bytes,
            )
        except LogApiError as exc:
            if (
                not isinstance(exc, LogGoneError | LogResetError)
                and exc.code != wire.TABLE_UNKNOWN_CODE
            ):
                raise
            # Gone, reset, or nothing of the table here yet: the snapshots have the rows.
            if self.source == "log":
                log.info(
                    "log reader of %s: %s (%s); reading its snapshots",
                    self.table, exc.message, client.url,
                )  # fmt: skip
            if isinstance(exc, LogResetError):
                # A reset: a restarted writer, or a swap that un-published the log.
                self._check_at = min(self._check_at, time.monotonic() + self._retry_log_seconds)
            self._log_up()
            self._leave_log()
            return None
        except LogUnavailable as exc:
            self._log_down(exc)
            return None

    def _batch_position(self) -> tuple[int, str | None]:
        """Where to ask the log from by batch: ``(batch, job)``. (-1, None): from the log's
        start, which it answers only if it holds every batch (an empty table, a position
        without a stamp)."""
        if self.committed_batch is None or self.committed_batch < 0:
            return -1, None
        if self.committed_job is None and self.committed_snapshot is not None:
            # A position kept before the job was (an older read_log offset): its stamp.
            self.committed_job = self._job_of(self.committed_snapshot)
        if self.committed_job is None:
            return -1, None  # whose batch it is is not known: nothing may be skipped
        return self.committed_batch, self.committed_job

    def _take(self, answers: list[tuple[str, LogRead]]) -> pa.Table | None:
        if self.source != "log":
            log.info("log reader of %s follows the log again", self.table)
        self.source = "log"
        self.positions = {url: (a.epoch, a.next_seq) for url, a in answers}
        committed = _committed_in_all([a for _, a in answers])
        if committed is not None:
            batch, snapshot, job = committed
            # The logs answered from a position in them, so their writer's mark is the
            # reader's: newer than a position of another job's (an older writer's snapshot).
            newer = (
                self.committed_batch is None
                or (job is not None and job != self.committed_job)
                or batch > self.committed_batch
            )
            if newer:
                self.committed_batch, self.committed_snapshot = batch, snapshot
                self.committed_job = job  # None: its stamp says, when asked
        parts = [a.rows for _, a in answers if a.rows is not None and a.rows.num_rows]
        if not parts:
            return None
        return (
            parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")
        )

    def _leave_log(self) -> None:
        self.positions = {}
        self.source = "snapshots"

    def _log_down(self, exc: Exception) -> None:
        if self._log_down_since is None:
            log.warning(
                "log service of %s is unreachable; reading the table's snapshots until it is "
                "back (%s)",
                self.table,
                exc,
            )  # one warning while it stays down: a log of several services counts as one
            self._log_down_since = time.monotonic()
        self._retry_log_at = time.monotonic() + self._retry_log_seconds
        self._check_at = min(self._check_at, self._retry_log_at)
        self._leave_log()

    def _check_address(self, now: float) -> None:
        """Follow the log the table's writer published now: a new address, or none."""
        assert self._resolve is not None
        try:
            address: str | None = self._resolve()
        except LogNotEnabled:
            address = None
        except Exception as exc:  # the MetaService down too: keep the address we have
            log.debug("log reader of %s could not look up its log: %s", self.table, exc)
            self._check_at = now + self._retry_log_seconds
            return
        following = address is not None and self._log_down_since is None
        self._check_at = now + (self._check_log_seconds if following else self._retry_log_seconds)
        current = self.addresses
        wanted = _addresses(address)
        if wanted == current:
            return
        for client in self._logs:
            client.close()
        self._logs = []
        # Back to the committed snapshot: a position in one log means nothing in another.
        self._leave_log()
        if not wanted:
            if current:
                log.info(
                    "table %s has no log published any more; reading its snapshots until "
                    "its writer publishes one",
                    self.table,
                )
            return
        log.info("log of %s is at %s", self.table, " ".join(wanted))
        self._logs = [LogClient(url, timeout=self._timeout, token=self._token) for url in wanted]
        self._retry_log_at = now

    def _log_up(self) -> None:
        if self._log_down_since is not None:
            log.info("log service of %s is reachable again", self.table)
            self._log_down_since = None

    # -- the snapshots --------------------------------------------------------------
    def _read_snapshots(self) -> pa.Table | None:
        """The rows of the snapshots after the committed one; the position moves to the
        newest, and the next poll asks the log from its batch."""
        table = self._existing_table()
        parts = []
        newer = rows_after(table, self.committed_snapshot) if table is not None else ()
        for part in newer:
            if part.rows.num_rows:
                barrier, batch = (
                    (part.stamp.barrier, part.stamp.batch) if part.stamp else (None, None)
                )
                parts.append(_with_stamp(part.rows, barrier, batch))
            self.committed_snapshot = part.snapshot_id
            if part.stamp is not None:
                self.committed_batch, self.committed_job = part.stamp.batch, part.stamp.job
        self.source = "snapshots"
        if not parts:
            return None
        return pa.concat_tables(parts, promote_options="permissive")

    def _start_at_current_snapshot(self) -> None:
        table = self._existing_table()
        current = table.current_snapshot() if table is not None else None
        if current is None:
            self.committed_batch = -1  # nothing committed: the log from its first batch
            return
        stamp = parse_stamp(current.summary)
        self.committed_snapshot = current.snapshot_id
        if stamp is not None:
            self.committed_batch, self.committed_job = stamp.batch, stamp.job

    def _job_of(self, snapshot_id: int) -> str | None:
        """The job that stamped the snapshot (None: gone, or not stamped)."""
        table = self._existing_table()
        snapshot = table.snapshot_by_id(snapshot_id) if table is not None else None
        stamp = parse_stamp(snapshot.summary) if snapshot is not None else None
        return stamp.job if stamp is not None else None

    def _existing_table(self) -> Table | None:
        """The table; None while its writer has not created it yet (nothing to read)."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self._load_table(self.table)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None


def _addresses(address: str | Sequence[str] | None) -> list[str]:
    """The log services' addresses: one, several (a sequence), or as published (separated
    by spaces)."""
    if address is None:
        return []
    found = address.split() if isinstance(address, str) else list(address)
    return [a.rstrip("/") for a in found]


def _committed_in_all(answers: list[LogRead]) -> tuple[int, int, str | None] | None:
    """The newest committed batch the reader has in full from every service: the oldest of
    their marks (each service is marked for every batch, rows or not). None when one
    service has no mark, or the services name different jobs (a writer's reset reached
    some of them only)."""
    if any(a.committed_batch is None or a.committed_snapshot is None for a in answers):
        return None
    if len({a.job for a in answers}) != 1:
        return None
    oldest = min(answers, key=lambda a: a.committed_batch or 0)
    assert oldest.committed_batch is not None and oldest.committed_snapshot is not None
    return oldest.committed_batch, oldest.committed_snapshot, oldest.job


def _with_stamp(rows: pa.Table, barrier: int | None, batch: int | None) -> pa.Table:
    n = rows.num_rows
    for name, value in (
        (wire.BARRIER_COLUMN, barrier),
        (wire.BATCH_COLUMN, batch),
        (wire.SEQ_COLUMN, None),
    ):
        rows = rows.append_column(name, pa.array([value] * n, pa.int64()))
    return rows
