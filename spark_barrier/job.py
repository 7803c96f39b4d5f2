"""``register``: one call that makes a Spark streaming query a barrier-aligned job.

job = spark_barrier.register(
    spark, "http://127.0.0.1:8765", job="build_order_detail",
    inputs=["ods.orders", "ods.items"], outputs={"dwd.order_detail": DETAIL_SCHEMA},
)
orders = job.source("ods.orders")                       # offsets are barriers
sink = job.sink("dwd.order_detail", transform=enrich)   # foreachBatch function
query = job.start(orders, sink)
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from metaservice.barriers.schemas import BatchBarrier, InputRange
from metaservice.client import ApiError, ConflictError, MetaServiceClient, Unavailable
from metaservice.versions.schemas import ConsistentVersion
from spark_barrier.carry import BatchRequests, carry_seconds
from spark_barrier.errors import BarrierBatchError, BarrierConfigError, swapped_message
from spark_barrier.faults import crash_point
from spark_barrier.iceberg import manifests
from spark_barrier.iceberg.catalog import (
    CATALOG_NAME,
    CatalogUnavailable,
    check_partition_by,
    check_warehouse,
    ensure_table,
    load_catalog,
    normalised_properties,
    sql_catalog_properties,
)
from spark_barrier.iceberg.cdc import declare_keys
from spark_barrier.iceberg.commit import Mode, check_mode, commit_batch
from spark_barrier.iceberg.partitioning import PartitionSpecError
from spark_barrier.iceberg.read import read_snapshot
from spark_barrier.iceberg.stamps import find_batch_commit, snapshot_at
from spark_barrier.inputs import (
    StreamedInput,
    batch_frame,
    check_changelog_keys,
    plan_input,
    read_input,
)
from spark_barrier.jvm import PlanUnavailable, planned_scans, running_query_id
from spark_barrier.listener import BarrierListener
from spark_barrier.log import JobLog, check_log_options, open_job_log
from spark_barrier.offline import OfflineBarriers
from spark_barrier.reads import read_at_barrier
from spark_barrier.report import DirectReporter, OutboxReporter, Reporter, retry
from spark_barrier.revision import RevisionJob, RevisionModeError, revision_job
from spark_barrier.source import SOURCE_NAME, BarrierSource
from spark_barrier.steps import log_batch, recording, step

log = logging.getLogger("spark_barrier")


# A source job's trigger: one batch per barrier slot (the service's interval, learnt
# from its offline grant; this when the job holds none).
SOURCE_TRIGGER_S = 1.0
# How long a derived job's barrier source waits in one next-barrier call for its batch
# to become ready (a long poll; the MetaService answers as soon as it is).
NEXT_BARRIER_WAIT_MS = 2000


@dataclass
class BatchContext:
    """What a transform knows about the batch it runs in."""

    job: BarrierJob
    batch_id: int
    barrier: int
    start_barrier: int | None
    leases: list[str] = field(default_factory=list)  # taken by read(), released after the batch
    # A derived batch's rows of each streamed input (job.source(table)), by table.
    inputs: dict[str, DataFrame] = field(default_factory=dict)

    def input(self, table: str) -> DataFrame:
        """This batch's rows of the streamed input ``table``: what ``job.source(table)``
        streams in ``(start_barrier, barrier]`` (its changes with ``_change_type`` for
        ``changelog=True``), without the ``_table`` column a batch of several inputs has.

        >>> def join(rows, ctx):  # doctest: +SKIP
        ...     return ctx.input("ods.orders").join(ctx.input("ods.payments"), "order_id")
        """
        table = self.job.actual(table)
        if table not in self.inputs:
            raise BarrierConfigError(
                f"job '{self.job.name}' batch {self.batch_id} streams no input '{table}' "
                f"(it streams {sorted(self.inputs)}): build the query's stream from "
                f"job.source('{table}'), or read the table with ctx.read('{table}')"
            )
        return self.inputs[table]

    def read(self, table: str) -> DataFrame:
        """``table`` as of this batch's barrier, for lookup joins at the same version.

        Only a declared input or lookup table (``register(..., lookups=[...])``) of a
        derived job. Waits (up to the job's ``patience_s``) until the table is exact at
        the barrier, and keeps the snapshot read from expiry (a lease) until the batch
        has committed. An output of the job itself reads as before this batch (at its
        start barrier, where the job committed last): running totals and the like.

        >>> def enrich(orders, ctx):  # doctest: +SKIP
        ...     return orders.join(ctx.read("ods.items"), "item_id")
        """
        return self.job.read_in_batch(self, table)

    def release(self) -> None:
        """Give back what :meth:`read` kept in use (the sink calls it when the batch ends)."""
        while self.leases:
            self.job.release_lease(self.leases.pop())


Transform = Callable[[DataFrame, BatchContext], DataFrame]


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
        _release_listener(self.spark, self.client, self.name)


class BarrierSink:
    """foreachBatch(df, batch_id): barrier, exactly-once commit to Iceberg, report."""

    def __init__(
        self,
        job: BarrierJob,
        table: str,
        mode: Mode,
        key_columns: Sequence[str] | None,
        transform: Transform | None,
        op_column: str | None = None,
        order_by: str | None = None,
    ) -> None:
        self.job = job
        self.table = table
        self.mode = mode
        self.key_columns = list(key_columns) if key_columns else None
        self.transform = transform
        self.op_column = op_column
        self.order_by = order_by

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self._barrier: int | None = None
        started = time.perf_counter()
        with _in_batch(self.job.name), recording() as steps:
            try:
                self._run_batch(df, batch_id)
            finally:
                total_ms = (time.perf_counter() - started) * 1000
                log_batch(self.job.name, batch_id, self._barrier, steps, total_ms)

    def _run_batch(self, df: DataFrame, batch_id: int) -> None:
        job = self.job
        query_id = self._query_id(batch_id)
        iceberg = job.table(self.table)
        done = find_batch_commit(iceberg, job.name, batch_id, query_id)
        if done is not None:
            # A replayed batch: its snapshot (and the barrier stamped on it) is the truth.
            log.info(
                "%s batch %d was committed before (snapshot %d); reporting it",
                job.name, batch_id, done.snapshot_id,
            )  # fmt: skip
            self._persisted(batch_id, done.barrier, done.snapshot_id)
            self._report(batch_id, done.barrier, done.snapshot_id)
            return
        plan: _Plan | None = None
        ranges: list[InputRange] = []
        try:
            if job.offline is not None:
                barrier = job.offline.barrier_for(batch_id, query_id=query_id)
                start = None
            else:
                with step("plan"):
                    plan = self._planned(batch_id, query_id) if job.inputs else None
                if plan is not None and plan.start == plan.end:
                    # Nothing to read (a new query's first batch ends at its start): no
                    # barrier, no commit, no report.
                    log.debug("%s batch %d is empty (%d, %d]", job.name, batch_id, *plan.span)
                    return
                with step("barrier"):
                    answer = self._ask_barrier(batch_id, plan, query_id)
                if answer is None:
                    return
                barrier, start, ranges = answer.barrier, answer.start_barrier, answer.inputs
        except ConflictError as exc:
            raise _refused(job, batch_id, query_id, exc) from exc
        self._barrier = barrier
        ctx = BatchContext(job, batch_id, barrier, start)
        try:
            if plan is not None:
                # A derived batch: the stream's DataFrame has no rows (see job.source).
                with step("inputs"):
                    ctx.inputs = self._read_inputs(batch_id, plan, ranges)
                    df = batch_frame(ctx.inputs)
            with step("transform"):
                rows = self.transform(df, ctx) if self.transform else df
            snapshot = commit_batch(
                rows,
                iceberg,
                barrier=barrier,
                job=job.name,
                batch_id=batch_id,
                mode=self.mode,
                key_columns=self.key_columns,
                query_id=query_id,
                op_column=self.op_column,
                order_by=self.order_by,
                log_target=job.log.target(self.table, barrier, batch_id) if job.log else None,
            )
        finally:
            ctx.release()
        self._persisted(batch_id, barrier, snapshot)
        with step("report"):
            self._report(batch_id, barrier, snapshot)

    def _read_inputs(
        self, batch_id: int, plan: _Plan, ranges: Sequence[InputRange]
    ) -> dict[str, DataFrame]:
        """Each streamed input's rows of the batch: files planned here from the
        MetaService's snapshot ranges (sent with the batch's barrier), rows read by
        Spark's native Parquet reader on the executors."""
        job = self.job
        by_table = {r.table: r for r in ranges}
        frames = {}
        for name, streamed in sorted(plan.streamed.items()):
            span = by_table.get(name)
            if span is None:
                raise BarrierBatchError(
                    f"job '{job.name}' batch {batch_id}: the MetaService gave no snapshot "
                    f"range of '{name}' for barriers ({plan.start}, {plan.end}] (it gave "
                    f"{sorted(by_table)}); nothing was committed. Is '{name}' still an input "
                    "of the job? Check the job with `metaservice jobs show`",
                    code="no_input_range",
                )
            table = job.table(name)
            frames[name] = read_input(job.spark, table, plan_input(table, streamed, span))
        return frames

    def _query_id(self, batch_id: int) -> str:
        query_id = running_query_id(self.job.spark, self.job.name)
        if query_id is None:
            raise BarrierConfigError(
                f"batch {batch_id} of job '{self.job.name}' runs outside a streaming query: "
                "use the sink as the foreachBatch function of the job's query (job.start)"
            )
        return query_id

    def _planned(self, batch_id: int, query_id: str) -> _Plan:
        """The barriers ``(start, end]`` Spark planned for this batch: the same for every
        barrier source of the job, or the batch is refused; and how each input is read."""
        job = self.job
        try:
            scans = planned_scans(job.spark, query_id, batch_id)
        except PlanUnavailable as exc:
            raise BarrierBatchError(
                f"job '{job.name}' cannot tell which barriers Spark planned for batch "
                f"{batch_id} ({exc}); nothing was committed",
                code="plan_unavailable",
            ) from exc
        mine = [s for s in scans if s.source == SOURCE_NAME and s.options.get("job") == job.name]
        planned = {scan.options.get("table", "?"): (scan.start, scan.end) for scan in mine}
        if not planned:
            raise BarrierConfigError(
                f"the query of derived job '{job.name}' reads none of its inputs through "
                "a barrier source: build its stream from job.source(table)"
            )
        ends = {
            (int(start["barrier"]), int(end["barrier"]))
            for start, end in planned.values()
            if start is not None and end is not None
        }
        if len(ends) != 1 or any(None in pair for pair in planned.values()):
            shown = ", ".join(
                f"{t} ({_barrier_of(a)}, {_barrier_of(b)}]" for t, (a, b) in sorted(planned.items())
            )
            raise BarrierBatchError(
                f"job '{job.name}' batch {batch_id}: its barrier sources planned different "
                f"batches: {shown}. Every input of a batch must end at the same barrier, so "
                "nothing was committed and the query stops. This happens when the "
                "MetaService stayed unreachable for one source of a trigger while another "
                f"got an answer. The batch is not committed: delete offsets/{batch_id} "
                "from the query's checkpoint and restart the query, which plans the batch "
                "again",
                code="sources_disagree",
            )
        ((start, end),) = ends
        streamed = {s.options["table"]: StreamedInput.from_options(s.options) for s in mine}
        return _Plan(start, end, streamed)

    def _ask_barrier(self, batch_id: int, plan: _Plan | None, query_id: str) -> BatchBarrier | None:
        """The MetaService's barrier for the batch Spark planned (``plan``: derived jobs),
        waiting while it is unreachable; None when it says the batch is empty."""
        job = self.job
        start, end = plan.span if plan is not None else (None, None)
        try:
            answer: BatchBarrier = retry(
                lambda: job.requests.ask(batch_id, start=start, end=end, query_id=query_id),
                job.patience_s,
                "get a batch barrier",
            )
        except ConflictError as exc:
            if exc.code != "empty_range":
                raise
            log.debug("%s batch %d has nothing to read; skipped", job.name, batch_id)
            return None
        if plan is not None and (answer.start_barrier, answer.barrier) != plan.span:
            raise BarrierBatchError(
                f"job '{job.name}' batch {batch_id}: Spark planned barriers ({start}, {end}] "
                f"but the MetaService gave ({answer.start_barrier}, {answer.barrier}]; "
                "nothing was committed. Check that the query runs from this job's own "
                "checkpoint and that the MetaService is up to date",
                code="batch_plan_mismatch",
            )
        return answer

    def _persisted(self, batch_id: int, barrier: int, snapshot: int | None) -> None:
        if self.job.log is not None and snapshot is not None:
            self.job.log.persisted(self.table, barrier, batch_id, snapshot)

    def _report(self, batch_id: int, barrier: int, snapshot: int | None) -> None:
        crash_point("after_commit", batch_id)
        self.job.reporter.report(
            {
                "job": self.job.name,
                "batch_id": batch_id,
                "barrier": barrier,
                "table": self.table,
                "snapshot_id": snapshot,
            }
        )


@dataclass(frozen=True)
class _Plan:
    """A derived batch as Spark planned it: barriers ``(start, end]``, and how the
    query streams each input (its barrier source's options)."""

    start: int
    end: int
    streamed: dict[str, StreamedInput]

    @property
    def span(self) -> tuple[int, int]:
        return (self.start, self.end)


def _barrier_of(offset: Mapping[str, Any] | None) -> object:
    return offset.get("barrier") if offset is not None else None


def _refused(job: BarrierJob, batch_id: int, query_id: str, exc: ConflictError) -> Exception:
    """The error that stops the query when the MetaService refuses a batch."""
    if exc.code in ("query_reset", "batch_out_of_order"):
        return BarrierBatchError(
            f"job '{job.name}': batch {batch_id} comes from Spark query {query_id}, but the "
            f"job's batches came from another query ({exc.message}). The query's checkpoint "
            "was reset or deleted, or a new query was started under the job's name: Spark "
            "numbers batches again from 0, and running them would skip or mis-stamp "
            "batches. Nothing was committed and the query stops. Restart it from the job's "
            "original checkpoint; to run it from a new checkpoint, make it a new job (a new "
            "name, writing new tables) or delete the job first",
            code=exc.code,
        )
    if exc.code == "batch_plan_mismatch":
        return BarrierBatchError(
            f"job '{job.name}' batch {batch_id}: the MetaService recorded other barriers "
            f"for this batch than Spark planned ({exc.message}); nothing was committed and "
            "the query stops. Check that the query runs from this job's own checkpoint",
            code=exc.code,
        )
    if exc.code == "superseded":
        return BarrierBatchError(
            f"job '{job.name}' was replaced by a revision ({exc.message}): its tables are "
            "the revision's now, and the revision's job writes them. Nothing was committed "
            "and the query stops; run the revision's job instead (see metaservice revision "
            "status)",
            code=exc.code,
        )
    if exc.code == "batch_abandoned":
        return BarrierBatchError(
            f"job '{job.name}' batch {batch_id} was abandoned by an operator ({exc.message}); "
            "this driver must not commit it, and the query stops. Restart the job only "
            "after checking why its batch was abandoned",
            code=exc.code,
        )
    return exc


# Sink calls in progress, by query name (a job's query is named after the job).
_batches_running: dict[str, int] = {}
_batches_lock = threading.Lock()


@contextmanager
def _in_batch(query_name: str) -> Iterator[None]:
    with _batches_lock:
        _batches_running[query_name] = _batches_running.get(query_name, 0) + 1
    try:
        yield
    finally:
        with _batches_lock:
            _batches_running[query_name] -= 1


def _sink_busy(query_name: str) -> bool:
    with _batches_lock:
        return _batches_running.get(query_name, 0) > 0


# Queries in stop_between_batches (their names are job names), with when it was asked.
_stopping: dict[str, float] = {}
# How long a batch's wait may go on after its query was asked to stop: a short wait
# finishes and the batch commits (a clean stop); a stuck one ends.
STOP_GRACE_S = 5.0


def _stop_requested(query_name: str) -> bool:
    """Whether ``query_name`` was asked to stop more than STOP_GRACE_S ago."""
    with _batches_lock:
        asked = _stopping.get(query_name)
    return asked is not None and time.monotonic() - asked >= STOP_GRACE_S


def stop_between_batches(query: StreamingQuery, timeout: float = 60.0) -> None:
    """Stop ``query`` when its sink is between batches, so no commit is interrupted halfway.

    A query that is behind runs its triggers back to back, so waiting for Spark to be
    idle could wait forever; what matters is that no ``foreachBatch`` call is in the
    middle of a commit. Interrupting one is safe (the next run replays it exactly once)
    but noisy; after ``timeout`` seconds the query is stopped anyway.

    A batch that is still waiting for another job (``ctx.read`` of a table not exact
    yet) ``STOP_GRACE_S`` after the stop was asked gives up with ``BarrierBatchError``
    code ``stopping``: Spark's stop waits for the running ``foreachBatch`` call to
    return, which could otherwise take the job's whole patience.
    """
    name = query.name or ""
    with _batches_lock:
        _stopping[name] = time.monotonic()
    try:
        deadline = time.monotonic() + timeout
        while query.isActive and _sink_busy(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        query.stop()
    finally:
        with _batches_lock:
            _stopping.pop(name, None)


_listeners: dict[tuple[int, str], BarrierListener] = {}
_listeners_lock = threading.Lock()


def _listener_for(spark: SparkSession, client: MetaServiceClient) -> BarrierListener:
    """One listener per Spark session and MetaService, shared by the jobs registered there."""
    key = (id(spark), client.url)
    with _listeners_lock:
        listener = _listeners.get(key)
        if listener is None:
            listener = BarrierListener(MetaServiceClient(client.url, token=_token(client)))
            spark.streams.addListener(listener)
            _listeners[key] = listener
        return listener


def _release_listener(spark: SparkSession, client: MetaServiceClient, job: str) -> None:
    """`job` no longer reports through its session's listener; the last job's close removes
    the listener from Spark. Spark calls every registered listener, through Py4J, for every
    event of every query: listeners left behind by closed jobs slow the whole driver, and
    Spark delivers their backlog before a session stops."""
    key = (id(spark), client.url)
    with _listeners_lock:
        listener = _listeners.get(key)
        if listener is None:
            return
        listener.stop_carrying(job)
        listener.jobs.discard(job)
        if listener.jobs:
            return
        del _listeners[key]
    listener.drain(timeout=2.0)  # the terminated events of the queries just stopped
    spark.streams.removeListener(listener)
    listener.stop()


def _token(client: MetaServiceClient) -> str | None:
    auth = client._http.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ") or None


def register(
    spark: SparkSession,
    url: str,
    *,
    job: str,
    inputs: Sequence[str] = (),
    outputs: Mapping[str, StructType | None] | Sequence[str],
    lookups: Sequence[str] = (),
    description: str = "",
    catalog_properties: Mapping[str, str] | None = None,
    catalog_uri: str | None = None,
    warehouse: str | None = None,
    catalog: Catalog | None = None,
    state_dir: str | Path | None = None,
    token: str | None = None,
    outbox: bool = True,
    outbox_options: Mapping[str, Any] | None = None,
    offline: bool = True,
    patience_s: float = 3600.0,
    read_lease_s: int = 3600,
    partition_by: Mapping[str, Sequence[str]] | None = None,
    revision: int | None = None,
    log: str | None = None,
    log_url: str | Sequence[str] | None = None,
) -> BarrierJob:
    """Register ``job`` with the MetaService and make ``spark`` ready to run it.

    ``inputs`` are streamed (``job.source(table)``); ``lookups`` are tables a derived
    job only reads as of each batch's barrier (``ctx.read(table)`` in the transform).
    Both are the job's inputs for the MetaService, so its barriers wait for both.

    Checks, failing fast with :class:`BarrierConfigError`: the MetaService answers,
    the catalog loads and its warehouse can be written (a small object is written and
    deleted there), every input and lookup table exists in the catalog, and no other
    job writes the outputs. A failed check registers nothing and creates no table.
    Output tables given with a schema are created when missing, partitioned as
    ``partition_by`` says (output name -> spec such as ``["day(ordered_at)",
    "bucket(16, item_id)"]``; see :mod:`spark_barrier.iceberg.partitioning`); every
    output's schema and spec are checked before the job is registered and before any
    table is created. Registers the barrier data source and a listener reporting the
    query's progress.

    The tables' catalog is any pyiceberg catalog, by its ``catalog_properties`` (as
    ``pyiceberg.catalog.load_catalog`` takes them: ``type``, ``uri``, ``warehouse``,
    ``s3.endpoint``...; see :mod:`spark_barrier.iceberg.catalog`). Without them it is
    a SQL catalog at ``catalog_uri`` with tables under ``warehouse`` (a folder or an
    ``s3://`` URI), each defaulting to the MetaService's own settings
    (``METASERVICE_DB_URL``, ``METASERVICE_WAREHOUSE``): the catalog shares its
    database. An open ``catalog`` is used by the driver as is; the barrier sources
    (driver and executors) load the same catalog from its properties.
    Reports go through a durable outbox under ``state_dir`` unless ``outbox=False``
    (``outbox_options``: :class:`spark_barrier.outbox.Outbox` settings such as
    ``max_bytes`` or ``fsync``).
    A source job (no ``inputs``) with an outbox holds an offline grant unless
    ``offline=False``: while the MetaService is unreachable its batches get barriers
    of their own and go on committing (see ``spark_barrier.offline``). Other batches
    wait up to ``patience_s`` for an unreachable MetaService before failing.
    What ``ctx.read`` reads is leased for ``read_lease_s`` (released when its batch ends).
    ``revision``: run the job in that revision (see :mod:`spark_barrier.revision`) as
    the revision's job, on its mirror tables; the code keeps naming the original tables.
    ``log``: give the outputs a log store (see :mod:`spark_barrier.log`): "embedded" (a
    log service in this driver) or "external" (the one at ``log_url``, started by
    ``metaservice log start``; a list of addresses spreads each partitioned output's
    rows over those services by partition, see :mod:`metaservice.logstore.routing`).
    """
    log_mode = log  # (``log`` is the module's logger elsewhere)
    properties = _catalog_properties(job, catalog_properties, catalog_uri, warehouse, catalog)
    client = MetaServiceClient(url, token=token)
    _check_reachable(client)
    aliases: dict[str, str] = {}
    if revision is not None:
        running = _in_revision(client, job, revision)
        job, aliases = running.job, dict(running.tables)
        inputs, lookups = [running.table(t) for t in inputs], [running.table(t) for t in lookups]
        if isinstance(outputs, Mapping):
            outputs = {running.table(t): schema for t, schema in outputs.items()}
        else:
            outputs = [running.table(t) for t in outputs]
        partition_by = {running.table(t): spec for t, spec in (partition_by or {}).items()}
    if log_mode is not None or log_url is not None:
        check_log_options(log_mode, log_url, job=job)
    catalog = _check_catalog(job, catalog, properties)
    catalog_options = {"catalog": json.dumps(properties), "catalog_name": catalog.name}
    output_names = list(outputs)
    _check_lookups(job, inputs, lookups)
    _check_inputs(catalog, job, [*inputs, *lookups])
    missing = _check_outputs(catalog, job, outputs, partition_by or {})
    try:
        client.put_job(
            job, inputs=[*inputs, *lookups], outputs=output_names, description=description
        )
    except ConflictError as exc:
        raise BarrierConfigError(f"MetaService refused job '{job}': {exc.message}") from exc
    except ApiError as exc:
        raise BarrierConfigError(f"MetaService refused job '{job}': {exc.message}") from exc
    for name, (schema, spec) in missing.items():
        ensure_table(catalog, name, schema, partition_by=spec)
    job_log = open_job_log(spark, log_mode, log_url, client)
    if job_log is not None:
        try:
            job_log.open(
                client,
                job,
                {name: catalog.load_table(name) for name in output_names},
                client.get_job(job).last_batch_id,
                properties,
            )
        except Exception:
            job_log.close()
            raise
    spark.dataSource.register(BarrierSource)
    listener = _listener_for(spark, client)
    listener.jobs.add(job)
    manifests.install()  # the driver plans and commits every batch: read each manifest once
    state = Path(state_dir or "spark-barrier-state") / job
    state.mkdir(parents=True, exist_ok=True)
    reporter: Reporter
    offline_barriers = None
    carrying: OutboxReporter | None = None
    if outbox:
        outbox_reporter = OutboxReporter(client, state / "outbox", **(outbox_options or {}))
        if offline and not inputs:
            offline_barriers = OfflineBarriers(client, job, outbox_reporter.outbox, state)
            offline_barriers.report_in()  # reachable: _check_reachable passed
        reporter = outbox_reporter
        if not inputs:
            carrying = outbox_reporter  # a derived job's reports go at once (carry.py)
    else:
        reporter = DirectReporter(client, give_up_after_s=patience_s)
    # One request per batch: the batch's barrier request carries the last batch's
    # report (source jobs), its progress and the offline-grant promise.
    interval_ms = offline_barriers.interval_ms if offline_barriers is not None else None
    carry_s = carry_seconds(interval_ms or int(SOURCE_TRIGGER_S * 1000))
    if carrying is not None:
        carrying.carry_s = carry_s
    listener.carry(job, carry_s)
    requests = BatchRequests(client, job, carrying, listener, offline_barriers)
    if offline_barriers is not None:
        offline_barriers.ask = lambda batch_id, query_id: requests.ask(batch_id, query_id=query_id)
    logging.getLogger(__name__).info(
        "job '%s' registered: inputs %s, outputs %s", job, list(inputs), output_names
    )
    return BarrierJob(
        spark,
        client,
        catalog,
        catalog_options,
        job,
        inputs,
        output_names,
        state,
        reporter,
        offline=offline_barriers,
        patience_s=patience_s,
        lookups=lookups,
        read_lease_s=read_lease_s,
        aliases=aliases,
        revision=revision,
        log=job_log,
        requests=requests,
        interval_ms=interval_ms,
    )


def _in_revision(client: MetaServiceClient, job: str, revision: int) -> RevisionJob:
    try:
        return revision_job(client, job, revision)
    except RevisionModeError as exc:
        raise BarrierConfigError(str(exc)) from exc


def _check_lookups(job: str, inputs: Sequence[str], lookups: Sequence[str]) -> None:
    if lookups and not inputs:
        raise BarrierConfigError(
            f"job '{job}' declares lookups {list(lookups)} but no inputs: lookups are read "
            "as of the barriers of a derived job's batches, which its streamed inputs drive"
        )
    both = sorted(set(inputs) & set(lookups))
    if both:
        raise BarrierConfigError(
            f"job '{job}' declares {both} both as inputs and as lookups; an input is "
            "streamed and can be read with ctx.read too, so declare it once"
        )


def _catalog_properties(
    job: str,
    properties: Mapping[str, str] | None,
    catalog_uri: str | None,
    warehouse: str | None,
    catalog: Catalog | None,
) -> dict[str, str]:
    """The pyiceberg properties of the job's catalog, as its sources load it."""
    if properties is not None and (catalog_uri or warehouse):
        raise BarrierConfigError(
            f"job '{job}' is given both catalog_properties and catalog_uri/warehouse (a "
            "shorthand for the default SQL catalog); pass the catalog one way: put "
            "'uri' and 'warehouse' in catalog_properties"
        )
    if properties is None:
        if catalog is not None and not (catalog_uri or warehouse):
            properties = catalog.properties  # the sources load the catalog given
        else:
            properties = sql_catalog_properties(catalog_uri, warehouse)
    return normalised_properties(properties)


def _check_catalog(job: str, catalog: Catalog | None, properties: Mapping[str, str]) -> Catalog:
    """The job's catalog, loaded (unless given), with its warehouse writable."""
    try:
        catalog = catalog or load_catalog(properties, CATALOG_NAME)
        check_warehouse(catalog)
    except CatalogUnavailable as exc:
        raise BarrierConfigError(f"job '{job}' cannot use its Iceberg catalog: {exc}") from exc
    return catalog


def _check_reachable(client: MetaServiceClient) -> None:
    try:
        client.list_jobs(limit=1)
    except Unavailable as exc:
        raise BarrierConfigError(
            f"the MetaService at {client.url} is unreachable ({exc.__cause__ or exc}); "
            "start it with `metaservice start` or pass the right url"
        ) from exc


def _check_inputs(catalog: Catalog, job: str, inputs: Sequence[str]) -> None:
    for name in inputs:
        if not catalog.table_exists(name):
            raise BarrierConfigError(
                f"input table '{name}' of job '{job}' does not exist in the catalog; "
                "register the job that writes it first (with its schema), or fix the name"
            )


def _check_outputs(
    catalog: Catalog,
    job: str,
    outputs: Mapping[str, StructType | None] | Sequence[str],
    partition_by: Mapping[str, Sequence[str]],
) -> dict[str, tuple[StructType, Sequence[str]]]:
    """The outputs to create (name -> schema and partition spec), every one checked;
    creates nothing, so a registration refused on one output leaves no table behind."""
    schemas: Mapping[str, Any] = outputs if isinstance(outputs, Mapping) else dict.fromkeys(outputs)
    unknown = sorted(set(partition_by) - set(schemas))
    if unknown:
        raise BarrierConfigError(
            f"job '{job}' gives partition_by for {unknown}, which are not among its outputs "
            f"{sorted(schemas)}"
        )
    missing: dict[str, tuple[StructType, Sequence[str]]] = {}
    for name, schema in schemas.items():
        spec = list(partition_by.get(name, ()))
        if catalog.table_exists(name):
            existing = catalog.load_table(name)
            if spec and existing.spec().is_unpartitioned():
                raise BarrierConfigError(
                    f"output table '{name}' exists unpartitioned, but job '{job}' asks for "
                    f"partition_by {spec}; drop partition_by, or create the table anew"
                )
            continue
        if schema is None:
            raise BarrierConfigError(
                f"output table '{name}' does not exist; pass its schema: outputs={{'{name}': StructType(...)}}"
            )
        try:
            check_partition_by(schema, spec)
        except PartitionSpecError as exc:
            raise BarrierConfigError(f"output table '{name}' of job '{job}': {exc}") from exc
        missing[name] = (schema, spec)
    return missing
