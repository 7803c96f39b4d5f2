"""The sink: :class:`BarrierSink`, the ``foreachBatch`` function of a job's query. Per
batch it asks the MetaService for the batch's barrier (checking it against what Spark
planned), reads a derived batch's inputs, runs the transform, commits to Iceberg exactly
once, and reports; and the errors that stop the query when the MetaService refuses a batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame

from metaservice.barriers.schemas import BatchBarrier, InputRange
from metaservice.client import ConflictError
from spark_barrier.batch_context import BatchContext, Transform
from spark_barrier.errors import BarrierBatchError, BarrierConfigError
from spark_barrier.faults import crash_point
from spark_barrier.iceberg.commit import Mode, commit_batch
from spark_barrier.iceberg.stamps import find_batch_commit
from spark_barrier.inputs import StreamedInput, batch_frame, plan_input, read_input
from spark_barrier.jvm import PlanUnavailable, planned_scans, running_query_id
from spark_barrier.report import retry
from spark_barrier.source import SOURCE_NAME
from spark_barrier.steps import log_batch, recording, step
from spark_barrier.stopping import _in_batch

if TYPE_CHECKING:
    from spark_barrier.job import BarrierJob

log = logging.getLogger("spark_barrier")


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
