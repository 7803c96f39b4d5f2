"""Commit reports: recording a job's commits (all or nothing per request), a batch
completing once all its outputs are reported, the job's progress that moves then, and
:func:`fence`, the one check every path that would record a new commit meets last
(reports, their redelivery, and ``metaservice reconcile``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as repo
from metaservice.barriers.schemas import (
    CommitBatchResult,
    CommitReport,
    CommitResult,
)
from metaservice.context import Context
from metaservice.errors import Conflict, Invalid
from metaservice.models import SOURCE, Batch, Job, Table
from metaservice.revisions import repository as revision_repo
from metaservice.topology import repository as topo


class _ReportScope:
    """What a report request needs, read up front in a few set-based statements, then
    kept up to date in memory as its reports are recorded in order (a report may be a
    duplicate or a conflict of an earlier one in the same request).

    Jobs are locked in name order, so two requests touching the same jobs never
    deadlock. The statements do not grow with the number of reports. Batches and
    commits are plain rows (``repo.BatchRow``, ``repo.CommitRow``), not ORM objects,
    and a job's row moves once per request however many of its batches complete.
    """

    def __init__(
        self,
        session: Session,
        ctx: Context,
        reports: Sequence[CommitReport],
        field_prefix: str = "",
    ) -> None:
        self.session = session
        self.ctx = ctx
        named = sorted({r.table for r in reports})
        self.tables = topo.tables_by_names(session, named)
        # A revision job's report queued before its swap names the mirror's old name.
        self.tables.update(
            revision_repo.swapped_mirrors(session, [n for n in named if n not in self.tables])
        )
        self.jobs = repo.lock_jobs_by_name(session, [r.job for r in reports])
        self.jobs_by_id = {job.id: job for job in self.jobs.values()}
        first: dict[str, int] = {}  # job -> index of its first report, for the error field
        for index, r in enumerate(reports):
            first.setdefault(r.job, index)
        for name in sorted(first):
            if name not in self.jobs:
                field = f"{field_prefix}{first[name]}.job" if field_prefix else "job"
                raise topo.unknown_job(name, field)
        keys = {(self.jobs[r.job].id, r.batch_id) for r in reports}
        self.batches, of_batches, self.by_snapshot = repo.report_rows(
            session,
            keys,
            {
                (self.tables[r.table].id, r.snapshot_id)
                for r in reports
                if r.snapshot_id is not None and r.table in self.tables
            },
        )
        self.commits: dict[tuple[int, int, int], repo.CommitRow] = {}
        self.counts: dict[tuple[int, int], int] = {}
        for c in of_batches:
            self.commits[(c.job_id, c.batch_id, c.table_id)] = c
            self.counts[(c.job_id, c.batch_id)] = self.counts.get((c.job_id, c.batch_id), 0) + 1
        self._outputs: dict[tuple[int, int], int] = {}  # by (job id, batch id)
        self._newest: int | None = None
        self.added: list[repo.CommitRow] = []
        self.completed: dict[int, list[repo.BatchRow]] = {}  # by job id

    def table(self, name: str, field: str) -> Table:
        if name not in self.tables:
            topo.require_table(self.session, name, field=field)  # raises NotFound
        return self.tables[name]

    def outputs(self, job: Job, batch: repo.BatchRow) -> int:
        """The outputs the batch reports, for batches from before each batch recorded
        its own count."""
        key = (job.id, batch.batch_id)
        if key not in self._outputs:
            self._outputs[key] = repo.count_outputs_of_batch(self.session, *key)
        return self._outputs[key]

    def newest(self) -> int:
        """The newest barrier handed out (read only when a report's barrier lies ahead)."""
        if self._newest is None:
            self._newest = max(self.ctx.now_slot(), repo.clock(self.session).last_issued)
        return self._newest

    def add(self, commit: repo.CommitRow) -> None:
        self.added.append(commit)
        self.commits[(commit.job_id, commit.batch_id, commit.table_id)] = commit
        if commit.snapshot_id is not None:
            self.by_snapshot[(commit.table_id, commit.snapshot_id)] = commit
        key = (commit.job_id, commit.batch_id)
        self.counts[key] = self.counts.get(key, 0) + 1

    def complete(self, batch: repo.BatchRow) -> None:
        """Mark the batch committed; its job's row moves once per request, in :meth:`flush`."""
        batch.committed = True
        batch.committed_ms = self.ctx.now_ms()
        self.completed.setdefault(batch.job_id, []).append(batch)

    def flush(self) -> None:
        """Write what the request recorded: new commits, then batches, jobs and plans."""
        plans_upto: dict[int, int] = {}  # derived job id -> plans to drop
        for job_id, batches in self.completed.items():
            drop = _progress(self.ctx, self.jobs_by_id[job_id], batches)
            if drop is not None:
                plans_upto[job_id] = drop
        completed = [b for batches in self.completed.values() for b in batches]
        jobs = [self.jobs_by_id[job_id] for job_id in self.completed]
        repo.write_reports(self.session, self.added, completed, jobs)
        repo.drop_plans_upto_many(self.session, plans_upto)


def report_commits(
    session: Session, ctx: Context, reports: Sequence[CommitReport], *, field_prefix: str = ""
) -> CommitBatchResult:
    """Record commit reports, all or nothing: one bad report refuses the whole request."""
    scope = _ReportScope(session, ctx, reports, field_prefix)
    results = []
    for index, report in enumerate(reports):
        prefix = f"{field_prefix}{index}." if field_prefix else ""
        results.append(_record(scope, report, prefix))
    scope.flush()
    recorded = sum(1 for r in results if r.status == "recorded")
    return CommitBatchResult(results=results, recorded=recorded, duplicates=len(results) - recorded)


def _record(scope: _ReportScope, report: CommitReport, prefix: str) -> CommitResult:
    ctx = scope.ctx
    job = scope.jobs[report.job]
    table = scope.table(report.table, field=f"{prefix}table")
    batch = scope.batches.get((job.id, report.batch_id))
    existing = scope.commits.get((job.id, report.batch_id, table.id))
    if _same_commit(existing, report) and batch is not None and not batch.abandoned:
        # Recorded before (an outbox retry whose answer was lost, or a Spark replay):
        # the same answer, even if the job has stopped writing the table since.
        return _result(report, "duplicate", batch.committed)
    if table.writer_id != job.id:
        raise Conflict(
            f"job '{job.name}' does not write table '{table.name}'",
            field=f"{prefix}table",
            code="not_writer",
        )
    # A source job's own offline claim may lie ahead of the service's clock.
    own = batch.barrier if batch is not None else 0
    if report.barrier > max(ctx.now_slot(), own) and report.barrier > max(scope.newest(), own):
        raise Invalid(
            f"barrier {report.barrier} is in the future: the barrier clock is at {scope.newest()}",
            field=f"{prefix}barrier",
            code="barrier_from_future",
        )
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
    if existing is not None:
        raise Conflict(
            f"batch {report.batch_id} of job '{job.name}' was already reported for "
            f"'{table.name}' with snapshot {existing.snapshot_id}, not {report.snapshot_id}",
            field=f"{prefix}snapshot_id",
            code="conflicting_report",
        )
    if report.snapshot_id is not None:
        other = scope.by_snapshot.get((table.id, report.snapshot_id))
        if other is not None:
            raise Conflict(
                f"snapshot {report.snapshot_id} of '{table.name}' was already reported "
                f"for batch {other.batch_id}",
                field=f"{prefix}snapshot_id",
                code="conflicting_report",
            )
    fence(job, table, batch.batch_id, batch, field_prefix=prefix)
    scope.add(
        repo.CommitRow(
            job.id, report.batch_id, table.id, report.barrier, report.snapshot_id, ctx.now_ms()
        )
    )
    # A batch completes once, when the outputs it was opened with are all reported.
    needed = batch.outputs if batch.outputs is not None else scope.outputs(job, batch)
    complete = scope.counts[(job.id, report.batch_id)] >= needed
    if complete and not batch.committed:
        scope.complete(batch)
    return _result(report, "recorded", batch.committed)


def fence(
    job: Job,
    table: Table,
    batch_id: int,
    batch: Batch | repo.BatchRow | None,
    *,
    field_prefix: str = "",
) -> None:
    """The one check every path that would record a new commit meets last: a report, its
    redelivery from an outbox or a zombie driver, and `metaservice reconcile` (``batch``
    None: a batch the service never heard of). A version already handed out rests on a
    batch's commits, so they never change once the batch could have been read: 409

    - ``batch_abandoned``: an operator abandoned the batch; the frontier went past its
      barrier (a replay of the batch runs at a new one,
      :func:`.source_batches.reopen_abandoned`);
    - ``output_added_after_batch``: the table became the job's output after the batch
      was opened, so the batch completes without it (at a barrier the table's frontier
      then passes); the table is recorded from the job's next batch on;
    - ``batch_complete``: the batch completed without this table.

    Nothing to retry in any of them: the report is final, and a deliverer drops it.
    """
    field = f"{field_prefix}batch_id"
    if batch is not None and batch.abandoned:
        raise Conflict(
            f"batch {batch_id} of job '{job.name}' was abandoned by an operator at barrier "
            f"{batch.barrier}, and readers have moved past it: its commit is not recorded "
            f"(a version already handed out would change). Nothing to retry; a replay of the "
            f"batch asks for a new barrier (POST /api/v1/jobs/{job.name}/batches/{batch_id}"
            "/barrier)",
            field=field,
            code="batch_abandoned",
        )
    if not reports_table(table, batch_id):
        first = table.writer_first_batch
        raise Conflict(
            f"table '{table.name}' became an output of job '{job.name}' after its batch "
            f"{batch_id} was opened: that batch completes without it, so its report for the "
            f"table is not recorded (a version already handed out would change). Nothing to "
            f"retry: '{table.name}' is recorded from the job's batch {first} on, whose "
            "snapshot is the table's whole state, this batch's rows included",
            field=f"{field_prefix}table",
            code="output_added_after_batch",
        )
    if batch is not None and batch.committed:
        raise Conflict(
            f"batch {batch_id} of job '{job.name}' completed without a report for "
            f"'{table.name}': its commits are final (a version may name them). Nothing to "
            "retry",
            field=f"{field_prefix}table",
            code="batch_complete",
        )


def reports_table(table: Table, batch_id: int) -> bool:
    """Whether the writer's batch ``batch_id`` was opened with the table among its outputs
    (it took the table on at ``writer_first_batch``; None: with its first batch)."""
    first = table.writer_first_batch
    return first is None or batch_id >= first


def _same_commit(existing: repo.CommitRow | None, report: CommitReport) -> bool:
    return (
        existing is not None
        and existing.snapshot_id == report.snapshot_id
        and existing.barrier == report.barrier
    )


def complete_batch(session: Session, ctx: Context, job: Job, batch: Batch) -> None:
    """Mark a batch committed once every output is recorded and move the job's progress
    (also used by reconciliation, so both paths complete a batch the same way). Only an
    open batch completes: a committed or abandoned one was already taken off the job's
    count, and counting it again would move its frontier wrongly for good."""
    if batch.committed or batch.abandoned:
        raise AssertionError(
            f"batch {batch.batch_id} of job '{job.name}' is not open: it cannot complete"
        )
    drop = mark_complete(ctx, job, batch)
    if drop is not None:
        repo.drop_plans_upto(session, job.id, drop)


def mark_complete(ctx: Context, job: Job, batch: Batch) -> int | None:
    """:func:`complete_batch` on the rows in memory; answers where the job's plans may
    be dropped up to (a derived batch's start: its plan is used), or None."""
    batch.committed = True
    batch.committed_ms = ctx.now_ms()
    return _progress(ctx, job, [batch])


def _progress(ctx: Context, job: Job, batches: Sequence[Batch | repo.BatchRow]) -> int | None:
    """What completing these batches of the job moves on its row, set once per column
    (a report request may complete hundreds of one job's batches); where its plans may
    be dropped up to, or None (see :func:`mark_complete`)."""
    barrier = max(b.barrier for b in batches)
    job.last_barrier = max(job.last_barrier or 0, barrier)
    job.last_batch_id = max(job.last_batch_id or 0, max(b.batch_id for b in batches))
    job.last_seen_ms = ctx.now_ms()
    if job.kind == SOURCE:
        before = job.open_batches
        job.open_batches = before - len(batches)
        if 0 < before <= len(batches):  # its open batches reached 0
            # Under the row lock no batch can be given a barrier <= the closed slot any more.
            job.frontier = max(job.frontier, fr.sealable_slot(ctx, job))
        return None
    job.frontier = max(job.frontier, barrier)
    if job.pending_target is not None and job.pending_target <= barrier:
        job.pending_target = None
    starts = [b.start_barrier for b in batches if b.start_barrier is not None]
    return max(starts) if starts else None


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
