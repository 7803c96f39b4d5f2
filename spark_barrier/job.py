"""``register``: one call that makes a Spark streaming query a barrier-aligned job.

job = spark_barrier.register(
    spark, "http://127.0.0.1:8765", job="build_order_detail",
    inputs=["ods.orders", "ods.items"], outputs={"dwd.order_detail": DETAIL_SCHEMA},
)
orders = job.source("ods.orders")                       # offsets are barriers
sink = job.sink("dwd.order_detail", transform=enrich)   # foreachBatch function
query = job.start(orders, sink)

The job itself lives here (:class:`BarrierJob`: its barrier sources, its sink, reads at
its barriers and closing); the batch context is in
:mod:`spark_barrier.batch_context`, the sink in :mod:`spark_barrier.sink`, stopping
between batches in :mod:`spark_barrier.stopping`, registration with its checks in
:mod:`spark_barrier.registration`, and the session's shared listener in
:mod:`spark_barrier.listener`. The names that moved are still importable from here.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from metaservice.client import ApiError, ConflictError, MetaServiceClient, Unavailable
from metaservice.versions.schemas import ConsistentVersion
from spark_barrier.batch_context import BatchContext as BatchContext
from spark_barrier.batch_context import Transform as Transform
from spark_barrier.carry import BatchRequests
from spark_barrier.errors import BarrierBatchError, BarrierConfigError, swapped_message
from spark_barrier.iceberg.cdc import declare_keys
from spark_barrier.iceberg.commit import Mode, check_mode
from spark_barrier.iceberg.read import read_snapshot
from spark_barrier.iceberg.stamps import snapshot_at
from spark_barrier.inputs import StreamedInput, check_changelog_keys
from spark_barrier.listener import release_listener
from spark_barrier.log import JobLog
from spark_barrier.offline import OfflineBarriers
from spark_barrier.reads import read_at_barrier
from spark_barrier.report import Reporter
from spark_barrier.sink import BarrierSink as BarrierSink
from spark_barrier.sink import _barrier_of as _barrier_of
from spark_barrier.sink import _Plan as _Plan
from spark_barrier.sink import _refused as _refused
from spark_barrier.source import SOURCE_NAME
from spark_barrier.steps import step
from spark_barrier.stopping import STOP_GRACE_S as STOP_GRACE_S
from spark_barrier.stopping import _batches_lock as _batches_lock
from spark_barrier.stopping import _batches_running as _batches_running
from spark_barrier.stopping import _in_batch as _in_batch
from spark_barrier.stopping import _sink_busy as _sink_busy
from spark_barrier.stopping import _stop_requested as _stop_requested
from spark_barrier.stopping import _stopping as _stopping
from spark_barrier.stopping import stop_between_batches as stop_between_batches

if TYPE_CHECKING:
    from spark_barrier.registration import _catalog_properties as _catalog_properties
    from spark_barrier.registration import _check_catalog as _check_catalog
    from spark_barrier.registration import _check_inputs as _check_inputs
    from spark_barrier.registration import _check_lookups as _check_lookups
    from spark_barrier.registration import _check_outputs as _check_outputs
    from spark_barrier.registration import _check_reachable as _check_reachable
    from spark_barrier.registration import _in_revision as _in_revision
    from spark_barrier.registration import register as register

log = logging.getLogger("spark_barrier")


# A source job's trigger: one batch per barrier slot (the service's interval, learnt
# from its offline grant; this when the job holds none).
SOURCE_TRIGGER_S = 1.0
# How long a derived job's barrier source waits in one next-barrier call for its batch
# to become ready (a long poll; the MetaService answers as soon as it is).
NEXT_BARRIER_WAIT_MS = 2000


# How long a batch waits for a table to become exact before it logs a warning.
WAIT_WARNING_S = 30.0


class BarrierJob:
    """A registered job: its barrier sources, its sink, and reads at its barriers."""

    def __init__(
        self,
        spark: SparkSession,
        client: MetaServiceClient,
        catalog: Catalog,
        catalog_options: dict[str, str],
        name: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        state_dir: Path,
        reporter: Reporter,
        offline: OfflineBarriers | None = None,
        patience_s: float = 3600.0,
        lookups: Sequence[str] = (),
        read_lease_s: int = 3600,
        aliases: Mapping[str, str] | None = None,
        revision: int | None = None,
        log: JobLog | None = None,
        requests: BatchRequests | None = None,
        interval_ms: int | None = None,
    ) -> None:
        self.spark = spark
        self.client = client
        self.catalog = catalog
        self.catalog_options = catalog_options
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.state_dir = state_dir
        self.reporter = reporter
        self.offline = offline  # source jobs with an outbox: barriers while the service is down
        self.patience_s = patience_s  # how long a batch waits for an unreachable service
        self.lookups = list(lookups)  # read as of each batch's barrier, never streamed
        self.read_lease_s = read_lease_s  # lease on what ctx.read reads; released after the batch
        # Revision mode (spark_barrier.revision): an original table -> the mirror used instead.
        self.aliases = dict(aliases or {})
        self.revision = revision
        self.log = log  # the outputs' log store (register(log=...)), or None
        # A batch's barrier request, carrying the job's parts (spark_barrier/carry.py).
        self.requests = requests or BatchRequests(client, name)
        self.interval_ms = interval_ms  # the barrier clock's, when the job learnt it

    def actual(self, table: str) -> str:
        """The table the job reads or writes for ``table`` as its code names it: in
        revision mode, a mirror for an affected original; else ``table`` itself."""
        return self.aliases.get(table, table)

    def source(
        self,
        table: str,
        *,
        changelog: bool = False,
        changelog_keys: Sequence[str] | None = None,
    ) -> DataFrame:
        """The stream that makes ``table`` an input of the job's batches: hand it (or the
        union of several inputs' streams) to :meth:`start`.

        Its offsets are the job's barriers; it carries **no rows**. The sink reads each
        batch's rows of ``table`` itself, natively in Spark, from the snapshots the
        MetaService maps the batch's barriers to, and hands them to the transform (see
        :mod:`spark_barrier.inputs`). Transformations applied to this stream therefore
        see nothing: filter, join and aggregate in the sink's ``transform``, on the
        batch it gets (or ``ctx.input(table)``).

        ``changelog=True`` makes the batch the changes of ``table`` in the batch's
        range, with a ``_change_type`` column (``INSERT``, ``DELETE``, ``UPDATE_BEFORE``,
        ``UPDATE_AFTER``): needed for tables written by upserts, CDC or deletes, which
        an ordinary read refuses. Updates are paired by ``changelog_keys``, else by the
        table's identifier fields (a CDC sink sets them); without keys an update
        reads as a DELETE and an INSERT.

        >>> orders = job.source("ods.orders", changelog=True)  # doctest: +SKIP
        """
        table = self.actual(table)
        if table in self.lookups:
            raise BarrierConfigError(
                f"'{table}' is a lookup table of job '{self.name}': it is not streamed; "
                f"read it with ctx.read('{table}') in the transform, or declare it in inputs="
            )
        if table not in self.inputs:
            raise BarrierConfigError(
                f"job '{self.name}' does not declare '{table}' as an input; "
                f"add it to inputs= in register() (inputs now: {self.inputs})"
            )
        if changelog_keys and not changelog:
            raise BarrierConfigError("changelog_keys are only used with changelog=True")
        if changelog_keys:
            try:
                check_changelog_keys(self.table(table), changelog_keys)
            except ValueError as exc:
                raise BarrierConfigError(str(exc)) from exc
        streamed = StreamedInput(table, changelog, tuple(changelog_keys or ()))
        options = {
            **self.catalog_options,
            "url": self.client.url,
            **streamed.options(),
            "patience_s": str(self.patience_s),
            "wait_ms": str(NEXT_BARRIER_WAIT_MS),
            # One barrier stream per job: its sources share each ready end (source.py).
            "shared_ends": str(self.state_dir / "next-barrier.json"),
        }
        if self.revision is not None and self.aliases:
            # A revision job's driver started before the swap: an idle source notices it.
            options["revision"] = str(self.revision)
        reader = self.spark.readStream.format(SOURCE_NAME).option("job", self.name)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    def sink(
        self,
        table: str | None = None,
        *,
        mode: Mode = "append",
        key_columns: Sequence[str] | None = None,
        transform: Transform | None = None,
        op_column: str | None = None,
        order_by: str | None = None,
    ) -> BarrierSink:
        """The ``foreachBatch`` function that commits each batch to ``table`` at its barrier.

        A derived job's batch is read by the sink (see :meth:`source`); ``transform``
        turns it into the rows to commit. ``mode``: ``"append"``; ``"upsert"`` (replace
        rows by ``key_columns``); ``"cdc"``: apply change records by ``key_columns``,
        whose op is in ``op_column`` (``I``/``U``/``D`` or ``INSERT``/``UPDATE``/
        ``DELETE``, any case; not stored): per key the batch's last record wins (the
        largest ``order_by``, else the last in the batch), deletes remove the key and
        the others are upserted. A CDC sink makes ``key_columns`` the table's
        identifier fields (required columns), which changelog readers pair updates by.
        See :func:`spark_barrier.iceberg.commit.commit_batch`.
        """
        table = self.actual(table) if table else self.outputs[0]
        if table not in self.outputs:
            raise BarrierConfigError(
                f"job '{self.name}' does not write '{table}'; its outputs are {self.outputs}"
            )
        iceberg = self.table(table)
        try:
            check_mode(mode, key_columns, iceberg, op_column, order_by)
            if mode == "cdc" and key_columns:
                declare_keys(iceberg, key_columns)
        except ValueError as exc:
            raise BarrierConfigError(f"job '{self.name}' sink of '{table}': {exc}") from exc
        return BarrierSink(self, table, mode, key_columns, transform, op_column, order_by)

    def start(
        self,
        stream: DataFrame,
        sink: BarrierSink,
        *,
        trigger_seconds: float | None = None,
        checkpoint: str | None = None,
    ) -> StreamingQuery:
        """Start the streaming query named after the job, checkpointed under the state folder.

        ``trigger_seconds`` defaults to the barrier interval for a source job (one
        batch per barrier slot, each batch's request carrying the last one's report)
        and to 0 for a derived job: its barrier sources long-poll the MetaService for
        the next batch, so a batch starts as soon as its inputs are final there rather
        than at the next trigger.
        """
        if trigger_seconds is None:
            source_trigger = self.interval_ms / 1000 if self.interval_ms else SOURCE_TRIGGER_S
            trigger_seconds = 0.0 if self.inputs else source_trigger
        location = checkpoint or str(self.state_dir / "checkpoint")
        return (
            stream.writeStream.queryName(self.name)
            .option("checkpointLocation", location)
            .trigger(processingTime=f"{trigger_seconds} seconds")
            .foreachBatch(sink)
            .start()
        )

    def table(self, name: str) -> Table:
        actual = self.actual(name)
        try:
            return self.catalog.load_table(actual)
        except NoSuchTableError:
            if actual in self.aliases.values():  # a mirror
                self._check_not_swapped()
            raise

    def _check_not_swapped(self) -> None:
        """A mirror this driver names is gone from the catalog: if the revision was
        swapped meanwhile, stop with what to do (the mirror carries its original's name)."""
        assert self.revision is not None
        state = self.client.get_revision(self.revision).state
        if state == "swapped":
            raise BarrierBatchError(
                swapped_message(self.name, self.revision, sorted(self.aliases)),
                code="revision_swapped",
            )

    def read_at(self, table: str, barrier: int) -> DataFrame:
        return read_at_barrier(self.spark, self.catalog, self.actual(table), barrier)

    def read_in_batch(self, ctx: BatchContext, table: str) -> DataFrame:
        """:meth:`BatchContext.read`: checks, waits for exactness, leases, reads."""
        table = self.actual(table)
        with step("transform.ctx_read_wait"):
            version = self.version_in_batch(ctx, table)
        if version is None:
            return read_snapshot(self.spark, self.table(table), None)
        if version.lease_id is not None:
            ctx.leases.append(version.lease_id)
        return read_snapshot(self.spark, self.table(table), version.snapshots.get(table))

    def version_in_batch(self, ctx: BatchContext, table: str) -> ConsistentVersion | None:
        """The leased version :meth:`BatchContext.read` reads ``table`` at (None: empty).

        A declared input or lookup: exact at the batch's barrier. An output of the job
        itself: its state before this batch, i.e. at the batch's start, where the job
        committed last (None before its first batch).
        """
        table = self.actual(table)
        if not self.inputs:
            raise BarrierConfigError(
                f"job '{self.name}' is a source job: its batches run at the barrier clock's "
                "current slot, at which no table is complete yet, so ctx.read has no exact "
                f"version of '{table}' to give. Read tables with spark_barrier.read_consistent, "
                "or read them in a derived job (declare them in inputs= or lookups=)"
            )
        if table in self.outputs:
            if not ctx.start_barrier:
                return None
            return self._exact_version(table, ctx.start_barrier)
        if table not in self.inputs and table not in self.lookups:
            raise BarrierConfigError(
                f"job '{self.name}' reads '{table}' in a batch but does not declare it; add it "
                f"to lookups= (or inputs=) in register(), so that the job's barriers wait for "
                f"it (inputs: {self.inputs}, lookups: {self.lookups})"
            )
        return self._exact_version(table, ctx.barrier)

    def _exact_version(self, table: str, barrier: int) -> ConsistentVersion | None:
        """The version of ``table`` that is its state at ``barrier``, leased; waits until
        the table is final there. None: final there with nothing committed at or before
        it, so its state is empty.

        Usually a version at ``barrier`` itself. When the table is final at ``barrier``
        (its frontier is at or past it) but ``barrier`` is not in its history (a job's
        own batch may start at an end Spark planned while the MetaService advanced the
        idle job past it), the newest version before it is the same state: nothing was
        committed in between, and nothing can be any more. The same advance can make a
        table final before its first commit (a derived job whose inputs had no rows yet):
        the service has no version of it to give, and the state is empty."""
        started = time.monotonic()
        deadline = started + self.patience_s
        delay = 0.05
        seen: int | None = None
        answer = "no answer yet"
        warned = False
        leased_at = self._leased_at(table, barrier)
        if leased_at is not None:
            return leased_at
        while True:
            if not warned and time.monotonic() - started >= WAIT_WARNING_S:
                # A batch that waits this long is usually stuck, not slow: say on what.
                log.warning(
                    "job %s has waited %.0f s for '%s' to be exact at barrier %s (latest "
                    "version at or before it: %s; last answer: %s)",
                    self.name, time.monotonic() - started, table, barrier, seen, answer,
                )  # fmt: skip
                warned = True
            try:
                seen = self.client.consistent_version([table], at_or_before=barrier).barrier
                # The frontier is read before the leased version, so a commit at or below
                # ``barrier`` cannot come between the two: the version leased is final.
                if seen == barrier or self._final_at(table, barrier):
                    leased = self.client.consistent_version(
                        [table], at_or_before=barrier, lease_seconds=self.read_lease_s
                    )
                    if leased.barrier >= seen:
                        return leased
                    if leased.lease_id is not None:  # cannot happen: versions never go back
                        self.release_lease(leased.lease_id)
                answer = f"version at {seen}, not final at {barrier}"
            except ConflictError as exc:
                answer = f"409 {exc.code}"
                if exc.code == "no_consistent_version" and self._empty_at(table, barrier):
                    return None
            except Unavailable as exc:
                answer = f"MetaService unavailable ({exc})"
                log.debug("job %s waits for the MetaService to read %s: %s", self.name, table, exc)
            if _stop_requested(self.name):
                # Asked to stop STOP_GRACE_S ago, and query.stop() waits for this call to
                # return: give up; nothing of the batch is committed, the next run replays it.
                raise BarrierBatchError(
                    f"job '{self.name}' is stopping: gave up waiting for '{table}' to be "
                    f"exact at barrier {barrier} (last answer: {answer}); the next run "
                    "replays the batch",
                    code="stopping",
                )
            if time.monotonic() + delay > deadline:
                raise BarrierBatchError(
                    f"job '{self.name}': '{table}' is not exact at barrier {barrier} after "
                    f"{self.patience_s:.0f} s (its latest consistent version at or before it "
                    f"is {seen}; last answer: {answer}). The job that writes it must "
                    "commit (or be advanced to) "
                    "this barrier; declare it in lookups= so the job's barriers wait for it",
                    code="not_exact",
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _leased_at(self, table: str, barrier: int) -> ConsistentVersion | None:
        """The usual case of :meth:`_exact_version` in one request: a leased version of
        ``table`` at ``barrier`` itself (exact there; a source table is exact at every
        barrier up to its frontier, a derived one where its job committed). None (and
        no lease kept) otherwise: the caller's loop finds out why, and waits."""
        try:
            version = self.client.consistent_version(
                [table], at_or_before=barrier, lease_seconds=self.read_lease_s
            )
        except (ConflictError, Unavailable):
            return None
        if version.barrier == barrier:
            return version
        if version.lease_id is not None:
            self.release_lease(version.lease_id)
        return None

    def _final_at(self, table: str, barrier: int) -> bool:
        frontier = self.client.get_table(table).frontier
        return frontier is not None and frontier >= barrier

    def _empty_at(self, table: str, barrier: int) -> bool:
        """Whether ``table`` is final at ``barrier`` with nothing committed at or before
        it. The frontier is read first, then the version asked again: a commit recorded
        between an earlier answer and the frontier read would otherwise go unseen. The
        table itself must hold no snapshot stamped at or below ``barrier`` either: the
        service's history is its current writer's, and rows another writer committed
        there (before a job was deleted and registered again, say) are not nothing."""
        if not self._final_at(table, barrier):
            return False
        try:
            self.client.consistent_version([table], at_or_before=barrier)
        except ConflictError as exc:
            if exc.code != "no_consistent_version":
                return False
        else:
            return False  # a version appeared: the loop leases it
        return snapshot_at(self.table(table), barrier) is None

    def release_lease(self, lease_id: str) -> None:
        try:
            self.client.delete_lease(lease_id)
        except (ApiError, Unavailable) as exc:
            # It expires by itself after read_lease_s; only expiry waits longer.
            log.warning("job %s could not release lease %s: %s", self.name, lease_id, exc)

    def close(self, timeout: float = 30.0) -> None:
        """Release the job's offline grant, deliver pending reports (waiting up to
        ``timeout``) and close the outbox; the session's listener stops reporting the job
        (and leaves Spark with the last job of its MetaService). Call it once the job's
        queries have stopped."""
        if self.offline is not None:
            self.offline.close(release=True)
        if not self.reporter.flush(timeout):
            log.warning(
                "job %s: reports still undelivered after %s s stay in its outbox and are "
                "delivered when the job runs again",
                self.name, timeout,
            )  # fmt: skip
        self.reporter.close()
        if self.log is not None:
            self.log.close()
        release_listener(self.spark, self.client, self.name)


# Registration imports the job, so its names are loaded from here on first use.
_REGISTRATION = frozenset(
    (
        "_catalog_properties",
        "_check_catalog",
        "_check_inputs",
        "_check_lookups",
        "_check_outputs",
        "_check_reachable",
        "_in_revision",
        "register",
    )
)


def __getattr__(name: str) -> Any:
    if name in _REGISTRATION:
        return getattr(importlib.import_module("spark_barrier.registration"), name)
    raise AttributeError(f"module 'spark_barrier.job' has no attribute {name!r}")
