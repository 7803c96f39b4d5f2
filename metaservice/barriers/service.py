"""Rules for handing out barriers and recording commits (the model's core).

Every function runs inside one write transaction and starts by locking the
job's row, which serialises all changes to one job's progress across threads
and replicas.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as repo
from metaservice.barriers.schemas import (
    BatchBarrier,
    CommitBatchResult,
    CommitReport,
    CommitResult,
    InputRange,
    NextBarrier,
)
from metaservice.context import Context
from metaservice.errors import Conflict, Invalid
from metaservice.models import DERIVED, SOURCE, Batch, Commit, Job, Table
from metaservice.topology import repository as topo


def batch_barrier(session: Session, ctx: Context, job_name: str, batch_id: int) -> BatchBarrier:
    """The barrier of a batch; the same answer for a replayed batch."""
    job = repo.lock_job(session, topo.require_job(session, job_name).id)
    batch = repo.get_batch(session, job.id, batch_id)
    if batch is None:
        check_batch_order(session, job, batch_id)
        batch = (
            _new_source_batch(session, ctx, job, batch_id)
            if job.kind == SOURCE
            else (_new_derived_batch(session, ctx, job, batch_id))
        )
    job.last_seen_ms = ctx.now_ms()
    return batch_view(session, job, batch)


def check_batch_order(session: Session, job: Job, batch_id: int) -> None:
    last = repo.last_batch_id(session, job.id)
    if last is not None and batch_id < last:
        raise Conflict(
            f"job '{job.name}' already has batch {last}; batch ids must increase "
            f"(was the Spark checkpoint deleted? register the job under a new name)",
            field="batch_id",
            code="batch_out_of_order",
        )


def _new_source_batch(session: Session, ctx: Context, job: Job, batch_id: int) -> Batch:
    state = repo.clock(session)
    # Never below the last issued barrier (clock stepped back after a restart) and
    # never at or below a sealed frontier (a reader already took that slot as complete).
    barrier = max(ctx.now_slot(), state.last_issued, job.frontier + ctx.interval)
    return open_source_batch(session, ctx, job, batch_id, barrier)


def open_source_batch(
    session: Session, ctx: Context, job: Job, batch_id: int, barrier: int
) -> Batch:
    """A new open batch of a source job at ``barrier`` (it holds the job's frontier below it)."""
    repo.raise_last_issued(session, barrier)
    batch = Batch(
        job_id=job.id, batch_id=batch_id, barrier=barrier, committed=False, created_ms=ctx.now_ms()
    )
    session.add(batch)
    job.open_batches += 1
    session.flush()
    return batch


def _new_derived_batch(session: Session, ctx: Context, job: Job, batch_id: int) -> Batch:
    still_open = repo.open_batch(session, job.id)
    if still_open is not None:
        raise Conflict(
            f"batch {still_open.batch_id} of job '{job.name}' (barrier {still_open.barrier}) "
            f"is not committed yet; report its commit before starting batch {batch_id}",
            field="batch_id",
            code="batch_still_open",
        )
    target = job.pending_target or _choose_target(session, ctx, job)
    if target is None:
        raise Conflict(
            f"no new barrier for job '{job.name}': its inputs have not advanced past "
            f"barrier {job.frontier}",
            code="no_barrier_ready",
        )
    job.pending_target = target
    batch = Batch(
        job_id=job.id,
        batch_id=batch_id,
        barrier=target,
        start_barrier=job.frontier,
        committed=False,
        created_ms=ctx.now_ms(),
    )
    session.add(batch)
    session.flush()
    return batch


def next_barrier(session: Session, ctx: Context, job_name: str) -> NextBarrier:
    """The aligned target every barrier source of a derived job reports as its latest offset."""
    job = repo.lock_job(session, topo.require_job(session, job_name).id)
    if job.kind != DERIVED:
        raise Invalid(
            f"job '{job.name}' has no table inputs; a source job's batches get their "
            f"barriers from POST /api/v1/jobs/{job.name}/batches/{{batch_id}}/barrier",
            field="job",
            code="not_derived",
        )
    job.last_seen_ms = ctx.now_ms()
    if job.pending_target is None:
        job.pending_target = _choose_target(session, ctx, job)
    target = job.pending_target
    return NextBarrier(
        job=job.name,
        barrier=target if target is not None else job.frontier,
        start_barrier=job.frontier,
        ready=target is not None,
    )


def _choose_target(session: Session, ctx: Context, job: Job) -> int | None:
    inputs = topo.input_tables(session, job.id)
    if any(t.writer_id is None for t in inputs):
        return None  # an input nobody writes has no frontier yet
    writers = list(topo.jobs_by_ids(session, [t.writer_id for t in inputs if t.writer_id]).values())
    fr.seal_sources(session, ctx, writers)
    limit = min(fr.frontiers(session, ctx, writers).values())
    derived = [w for w in writers if w.kind == DERIVED]
    candidates = None
    if derived:
        sets = [set(repo.committed_barriers(session, w.id, job.frontier, limit)) for w in derived]
        candidates = sorted(set.intersection(*sets))
    # A job's first batch takes everything available; later catch-up batches align.
    window = 1 if job.frontier == 0 else ctx.settings.catchup_window_slots
    return fr.aligned_target(job.frontier, limit, ctx.interval, window, candidates)


def batch_view(session: Session, job: Job, batch: Batch) -> BatchBarrier:
    ranges: list[InputRange] = []
    if batch.start_barrier is not None:
        for table in topo.input_tables(session, job.id):
            ranges.append(
                InputRange(
                    table=table.name,
                    from_barrier=batch.start_barrier,
                    to_barrier=batch.barrier,
                    from_snapshot=repo.snapshot_at(session, table.id, batch.start_barrier),
                    to_snapshot=repo.snapshot_at(session, table.id, batch.barrier),
                )
            )
    return BatchBarrier(
        job=job.name,
        batch_id=batch.batch_id,
        barrier=batch.barrier,
        start_barrier=batch.start_barrier,
        committed=batch.committed,
        inputs=ranges,
    )


class _ReportScope:
    """Looks up each job and table once per request, and locks jobs in name order
    so that two requests touching the same jobs never deadlock."""

    def __init__(
        self, session: Session, reports: Sequence[CommitReport], field_prefix: str = ""
    ) -> None:
        self.session = session
        self.tables = topo.tables_by_names(session, sorted({r.table for r in reports}))
        self.jobs: dict[str, Job] = {}
        self.outputs: dict[int, int] = {}
        first: dict[str, int] = {}  # job -> index of its first report, for the error field
        for index, r in enumerate(reports):
            first.setdefault(r.job, index)
        for name in sorted(first):
            field = f"{field_prefix}{first[name]}.job" if field_prefix else "job"
            job = repo.lock_job(session, topo.require_job(session, name, field=field).id)
            self.jobs[name] = job
            self.outputs[job.id] = topo.count_outputs(session, job.id)

    def table(self, name: str, field: str) -> Table:
        if name not in self.tables:
            topo.require_table(self.session, name, field=field)  # raises NotFound
        return self.tables[name]


def report_commits(
    session: Session, ctx: Context, reports: Sequence[CommitReport], *, field_prefix: str = ""
) -> CommitBatchResult:
    """Record commit reports, all or nothing: one bad report refuses the whole request."""
    scope = _ReportScope(session, reports, field_prefix)
    newest = max(ctx.now_slot(), repo.clock(session).last_issued)
    results = []
    for index, report in enumerate(reports):
        prefix = f"{field_prefix}{index}." if field_prefix else ""
        results.append(_record(session, ctx, scope, report, newest, prefix))
    recorded = sum(1 for r in results if r.status == "recorded")
    return CommitBatchResult(results=results, recorded=recorded, duplicates=len(results) - recorded)


def _record(
    session: Session,
    ctx: Context,
    scope: _ReportScope,
    report: CommitReport,
    newest: int,
    prefix: str,
) -> CommitResult:
    job = scope.jobs[report.job]
    table = scope.table(report.table, field=f"{prefix}table")
    if table.writer_id != job.id:
        raise Conflict(
            f"job '{job.name}' does not write table '{table.name}'",
            field=f"{prefix}table",
            code="not_writer",
        )
    if report.barrier > newest:
        raise Invalid(
            f"barrier {report.barrier} is in the future: the barrier clock is at {newest}",
            field=f"{prefix}barrier",
            code="barrier_from_future",
        )
    batch = repo.get_batch(session, job.id, report.batch_id)
    if batch is None:
        raise Conflict(
            f"batch {report.batch_id} of job '{job.name}' was never given a barrier; "
            f"ask POST /api/v1/jobs/{job.name}/batches/{report.batch_id}/barrier first",
            field=f"{prefix}batch_id",
            code="unknown_batch",
        )
    if batch.barrier != report.barrier:
        raise Conflict(
            f"batch {report.batch_id} of job '{job.name}' has barrier {batch.barrier}, "
            f"not {report.barrier}",
            field=f"{prefix}barrier",
            code="barrier_mismatch",
        )
    existing = repo.get_commit(session, job.id, report.batch_id, table.id)
    if existing is not None:
        if existing.snapshot_id != report.snapshot_id:
            raise Conflict(
                f"batch {report.batch_id} of job '{job.name}' was already reported for "
                f"'{table.name}' with snapshot {existing.snapshot_id}, not {report.snapshot_id}",
                field=f"{prefix}snapshot_id",
                code="conflicting_report",
            )
        return _result(report, "duplicate", batch.committed)
    if report.snapshot_id is not None:
        other = repo.commit_with_snapshot(session, table.id, report.snapshot_id)
        if other is not None:
            raise Conflict(
                f"snapshot {report.snapshot_id} of '{table.name}' was already reported "
                f"for batch {other.batch_id}",
                field=f"{prefix}snapshot_id",
                code="conflicting_report",
            )
    session.add(
        Commit(
            job_id=job.id,
            batch_id=report.batch_id,
            table_id=table.id,
            barrier=report.barrier,
            snapshot_id=report.snapshot_id,
            created_ms=ctx.now_ms(),
        )
    )
    session.flush()
    # A batch completes once; a job that gained an output later must not count it twice.
    complete = repo.count_batch_commits(session, job.id, report.batch_id) >= scope.outputs[job.id]
    if complete and not batch.committed:
        complete_batch(ctx, job, batch)
    return _result(report, "recorded", batch.committed)


def complete_batch(ctx: Context, job: Job, batch: Batch) -> None:
    """Mark a batch committed once every output is recorded and move the job's progress
    (also used by reconciliation, so both paths complete a batch the same way)."""
    batch.committed = True
    batch.committed_ms = ctx.now_ms()
    job.last_barrier = max(job.last_barrier or 0, batch.barrier)
    job.last_batch_id = max(job.last_batch_id or 0, batch.batch_id)
    job.last_seen_ms = ctx.now_ms()
    if job.kind == SOURCE:
        job.open_batches -= 1
        if job.open_batches == 0:
            # Under the row lock no batch can be given a barrier <= the closed slot any more.
            job.frontier = max(job.frontier, fr.sealable_slot(ctx, job))
    else:
        job.frontier = max(job.frontier, batch.barrier)
        if job.pending_target is not None and job.pending_target <= batch.barrier:
            job.pending_target = None


def _result(report: CommitReport, status: str, committed: bool) -> CommitResult:
    return CommitResult(
        job=report.job,
        batch_id=report.batch_id,
        table=report.table,
        barrier=report.barrier,
        snapshot_id=report.snapshot_id,
        status=status,
        batch_committed=committed,
    )
