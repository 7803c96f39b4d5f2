"""A job's tables in a log store: rows visible within a second, before the barrier commit.

``register(..., log="embedded")`` starts a log service in this driver (one per driver
process, shared by its jobs, stopped with the last of them); ``log="external"`` with
``log_url=`` names a standalone one (``metaservice log start``), or several: a list of
addresses spreads each (partitioned) output's rows over them by partition
(:mod:`metaservice.logstore.routing`), and every service is reset, marked persisted
and asked for its spilled files. Either way the job
publishes the address for its outputs to the MetaService, where readers find it
(:class:`metaservice.logstore.LogReader`, :func:`read_log`), and resets each output's
log to the last batch the MetaService recorded, naming the job: what a crashed driver
appended past it is dropped, and its readers start again from the table's latest
snapshot (duplicates, never a gap). The job's name tells the log whose batch ids it
holds: a reader whose snapshot another job stamped (the table's previous writer, e.g.
before a revision swap) is not answered by that job's batch id.

Each batch's rows go to the log from the executors' write tasks, chunk by chunk, just
before each chunk's data file is written (:class:`LogTarget`); the driver marks the
batch persisted once its snapshot is committed.

An embedded log holds each table's rows within the table's
``spark-barrier.log.max-bytes`` (default 256 MiB) and keeps
``spark-barrier.log.keep-barriers`` persisted barriers (default 2). Rows past the bound
that no snapshot holds yet are spilled to Arrow files under ``<table location>/log/``,
up to ``spark-barrier.log.max-spill-bytes`` (default 4 GiB; past both, appends are
refused and the log falls behind: the batches commit, readers read the snapshots);
the driver lists a batch's spilled files in its snapshot's summary right before the
commit (:meth:`LogTarget.claim_spilled`), and expiring that snapshot deletes them.
With a token (``register(..., token=...)``) every call to the log services carries it,
and an embedded log checks its callers' tokens with the MetaService (on a cluster, where
it listens on every interface, it refuses to start without one). The log is best effort for writers: a
log service that is down costs one warning per task, and the batch commits anyway;
readers then fall back to the table's snapshots. What goes to the log is the rows the
batch writes (appends, and the new images of upserts and CDC changes); deletes and the
rows an upsert carries over are not logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from spark_barrier.errors import BarrierConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from metaservice.client import MetaServiceClient
    from metaservice.logstore.routing import Routing
    from metaservice.logstore.server import LogService

log = logging.getLogger(__name__)

LogMode = Literal["embedded", "external"]
LOG_MODES = ("embedded", "external")

# The log service's answer to an append of a batch it already holds as persisted (a
# replayed batch): its rows are in the table, so there is nothing to add.
_ALREADY_PERSISTED = "log_batch_persisted"

# Table properties an embedded log reads (an external one takes its own options).
MAX_BYTES_PROPERTY = "spark-barrier.log.max-bytes"
KEEP_BARRIERS_PROPERTY = "spark-barrier.log.keep-barriers"
MAX_SPILL_BYTES_PROPERTY = "spark-barrier.log.max-spill-bytes"
SPILL_FOLDER = "log"  # under the table's location


@dataclass(frozen=True)
class LogTarget:
    """Where one batch's rows of one table go; pickled into the executors' write tasks.
    ``urls``: the table's log services; with several, ``routing`` sends each row to its
    partition's (:mod:`metaservice.logstore.routing`)."""

    urls: tuple[str, ...]
    table: str
    barrier: int
    batch_id: int
    routing: Routing | None = None
    token: str | None = field(default=None, repr=False)  # the job's, for a log that checks

    @property
    def url(self) -> str:
        return " ".join(self.urls)

    def append(self, rows: pa.Table) -> None:
        """Append a chunk of the batch (in a write task: on an executor, or on the driver
        for a small batch). Never fails the write: the log is a copy, and the snapshot
        the batch commits is the truth readers fall back to."""
        from metaservice.logstore import LogApiError, LogError, LogFullError, LogWriter

        if self.routing is None or len(self.urls) == 1:
            parts = [(0, rows)]
        else:
            parts = self.routing.split(rows)
        for service, part in parts:
            url = self.urls[service]
            try:
                with LogWriter(url, token=self.token) as writer:
                    writer.append(
                        self.table, barrier=self.barrier, batch_id=self.batch_id, rows=part
                    )
            except LogFullError as exc:
                log.warning(
                    "log of %s at %s is full, batch %d goes to the table only (readers read "
                    "its snapshot): %s",
                    self.table, url, self.batch_id, exc.message,
                )  # fmt: skip
            except LogApiError as exc:
                if exc.code != _ALREADY_PERSISTED:
                    log.warning("log of %s refused batch %d: %s", self.table, self.batch_id, exc)
            except LogError as exc:
                log.warning(
                    "log of %s at %s unreachable, batch %d goes to the table only: %s",
                    self.table, url, self.batch_id, exc,
                )  # fmt: skip

    def claim_spilled(self) -> list[str]:
        """The files the log services spilled this batch's rows to, for the snapshot
        summary (on the driver, right before the commit). A service that cannot say
        claims nothing: it then deletes those files itself when it lets the batch go."""
        from metaservice.logstore import LogError, LogWriter

        files: list[str] = []
        for url in self.urls:
            try:
                with LogWriter(url, token=self.token) as writer:
                    files += writer.claim_spilled(self.table, batch_id=self.batch_id)
            except LogError as exc:
                log.warning(
                    "could not ask the log of %s at %s for batch %d's spilled files: %s",
                    self.table, url, self.batch_id, exc,
                )  # fmt: skip
        return files


class JobLog:
    """The log of a job's outputs, on the driver: publish, reset, persisted marks.

    ``url``: one log service, or several (a sequence): each table's rows are then spread
    over them by partition (:mod:`metaservice.logstore.routing`), and every service is
    reset, marked and asked for spilled files alike."""

    def __init__(
        self,
        mode: LogMode,
        url: str | Sequence[str],
        *,
        embedded: LogService | None = None,
        token: str | None = None,
    ) -> None:
        from metaservice.logstore import LogWriter

        self.mode = mode
        self.urls = log_urls(url)
        if not self.urls:
            raise ValueError("a log needs at least one log service")
        self._embedded = embedded
        self._token = token  # the job's writer token: log services that check tokens take it
        self._writers = [LogWriter(u, token=token) for u in self.urls]
        self._routing: dict[str, Routing] = {}

    @property
    def url(self) -> str:
        """The address as published (several: separated by spaces)."""
        return " ".join(self.urls)

    def target(self, table: str, barrier: int, batch_id: int) -> LogTarget:
        return LogTarget(
            self.urls, table, barrier, batch_id, self._routing.get(table), token=self._token
        )

    def open(
        self,
        client: MetaServiceClient,
        job: str,
        tables: Mapping[str, Table],
        last_batch: int | None,
        io_properties: Mapping[str, str],
    ) -> None:
        """Publish the log for ``tables`` and reset each to the job's last committed batch
        (the MetaService's ``last_batch``, or a later one whose report is still on its way),
        as ``job``'s, on every log service; an embedded log also takes each table's bound
        and spill folder (in this process: the catalog's properties never go over the
        wire). With several services, an unpartitioned table is refused
        (:class:`~metaservice.logstore.routing.NotRoutable`) before anything is reset."""
        from metaservice.logstore.routing import NotRoutable, routing_of

        if len(self.urls) > 1:
            try:
                self._routing = {
                    name: routing_of(name, table, len(self.urls)) for name, table in tables.items()
                }
            except NotRoutable as exc:
                raise BarrierConfigError(f"job '{job}': {exc}") from exc
        for name, table in tables.items():
            if self._embedded is not None:
                _configure(self._embedded, name, table, io_properties)
            after = _last_committed(table, job, -1 if last_batch is None else last_batch)
            for writer in self._writers:
                writer.reset(name, after_batch_id=after, job=job)
            if len(self.urls) == 1:
                client.put_table_log(name, mode=self.mode, address=self.urls[0])
            else:
                client.put_table_log(name, mode=self.mode, addresses=list(self.urls))
        log.info("job '%s' logs %s to %s (%s)", job, sorted(tables), self.url, self.mode)

    def persisted(self, table: str, barrier: int, batch_id: int, snapshot_id: int) -> None:
        """The batch is committed as ``snapshot_id``: the logs may let its rows go. Every
        service gets the mark, also one that got none of the batch's rows: a reader's
        position in it moves past the batch only so."""
        from metaservice.logstore import LogError

        for writer in self._writers:
            try:
                writer.persisted(table, barrier=barrier, batch_id=batch_id, snapshot_id=snapshot_id)
            except LogError as exc:
                # Readers still get the rows (from the log, or from the snapshot); the log
                # only keeps them longer than it needs to.
                log.warning(
                    "could not mark batch %d of %s persisted at %s: %s",
                    batch_id, table, writer.url, exc,
                )  # fmt: skip

    def close(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._embedded is not None:
            _release_embedded(self._embedded)
            self._embedded = None


def _last_committed(table: Table, job: str, reported: int) -> int:
    """The job's last batch committed to ``table``: the one the MetaService recorded, or
    a later one the table holds whose report still waits in the outbox (a log reset to
    the recorded batch would claim to hold the batches after it, which the previous
    driver committed and nobody appends again)."""
    from spark_barrier.iceberg.stamps import list_stamped_snapshots

    stamped = [s.batch for s in list_stamped_snapshots(table) if s.job == job]
    return max([reported, *stamped])


def _configure(
    service: LogService, name: str, table: Table, io_properties: Mapping[str, str]
) -> None:
    def number(key: str) -> int | None:
        raw = table.properties.get(key)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < 0:
            raise BarrierConfigError(
                f"table {name}: property {key}={raw!r} is not a whole number >= 0; fix it "
                "with ALTER TABLE ... SET TBLPROPERTIES or pyiceberg's set_properties"
            )
        return value

    service.store.configure(
        name,
        max_bytes=number(MAX_BYTES_PROPERTY),
        keep_barriers=number(KEEP_BARRIERS_PROPERTY),
        max_spill_bytes=number(MAX_SPILL_BYTES_PROPERTY),
        spill_folder=f"{table.location().rstrip('/')}/{SPILL_FOLDER}",
        spill_properties=dict(io_properties),
    )


LogUrl = str | Sequence[str]


def log_urls(url: LogUrl) -> tuple[str, ...]:
    """``log_url`` as a tuple of addresses (one, or several a table's rows are spread
    over by partition)."""
    urls = (url,) if isinstance(url, str) else tuple(url)
    return tuple(u.rstrip("/") for u in urls)


def check_log_options(mode: str | None, url: LogUrl | None, *, job: str) -> None:
    """Refuse what ``register(log=..., log_url=...)`` cannot use, before anything is made."""

    if mode is None:
        raise BarrierConfigError(
            f"job '{job}': log_url is given without log=; pass log=\"external\" to "
            "write to that log service"
        )
    if mode not in LOG_MODES:
        raise BarrierConfigError(
            f"job '{job}': log={mode!r} is not a log mode; use \"embedded\" (a log service "
            'in this driver) or "external" with log_url= (one started by '
            "`metaservice log start`)"
        )
    if mode == "external":
        if not url:
            raise BarrierConfigError(
                f"job '{job}': log=\"external\" needs log_url=, the address of a log "
                "service started by `metaservice log start --port P`"
            )
        urls = log_urls(url)
        if len(set(urls)) != len(urls) or not all(isinstance(u, str) and u for u in urls):
            raise BarrierConfigError(
                f"job '{job}': log_url={url!r}: give one address, or a list of different "
                "addresses of log services"
            )
        for one in urls:
            _check_log_reachable(job, one)
    elif url is not None:
        raise BarrierConfigError(
            f"job '{job}': log=\"embedded\" runs its own log service in this driver; "
            'drop log_url=, or use log="external" for the service at that address'
        )


def open_job_log(
    spark: SparkSession,
    mode: str | None,
    url: LogUrl | None,
    metaservice: MetaServiceClient | None = None,
) -> JobLog | None:
    """The job's log as ``register`` asks (after :func:`check_log_options`; None: no log).
    The job's token (``metaservice``'s) goes with every call to the log services, and an
    embedded log checks its callers' tokens with that MetaService when the job has one."""
    from metaservice.logstore.client import token_of

    if mode is None:
        return None
    token = token_of(metaservice) if metaservice is not None else None
    if mode == "external":
        assert url is not None  # checked
        return JobLog("external", log_urls(url), token=token)
    service = _acquire_embedded(spark, metaservice.url if metaservice else None, token)
    return JobLog("embedded", service.url, embedded=service, token=token)


def _check_log_reachable(job: str, url: str) -> None:
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/healthz", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        raise BarrierConfigError(
            f"job '{job}': the log service at {url} does not answer ({exc}); start it with "
            "`metaservice log start --port P` or fix log_url"
        ) from exc


# One embedded log service per driver process, shared by its jobs.
_embedded_lock = threading.Lock()
_embedded: LogService | None = None
_embedded_users = 0


def _acquire_embedded(
    spark: SparkSession, metaservice_url: str | None, token: str | None
) -> LogService:
    """The driver's log service: on loopback for a local master, else on every interface
    (executors on other hosts reach it), which it refuses without a token to check
    callers with. With a token it checks every caller's with the MetaService."""
    global _embedded, _embedded_users
    from metaservice.logstore.auth import LogAuth, LogAuthError
    from metaservice.logstore.server import LogService

    with _embedded_lock:
        if _embedded is None:
            local = (spark.sparkContext.master or "local").startswith("local")
            # Executors on other hosts reach the driver by the name Spark gives it.
            host = "127.0.0.1" if local else spark.conf.get("spark.driver.host", "127.0.0.1")
            auth = LogAuth(metaservice_url, token=token) if metaservice_url and token else None
            try:
                _embedded = LogService(
                    host="127.0.0.1" if local else "0.0.0.0", advertised_host=host, auth=auth
                ).start()
            except LogAuthError as exc:
                raise BarrierConfigError(f'log="embedded": {exc}') from exc
        _embedded_users += 1
        return _embedded


def _release_embedded(service: LogService) -> None:
    global _embedded, _embedded_users
    with _embedded_lock:
        _embedded_users -= 1
        if _embedded_users > 0 or _embedded is not service:
            return
        _embedded = None
    service.stop()
