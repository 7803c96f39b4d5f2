"""Rebuild or check the barrier-to-snapshot mapping from the tables' own stamps (G4).

Every snapshot a barrier job commits carries ``metaservice.barrier``,
``metaservice.job`` and ``metaservice.batch`` in its summary. Given those stamps
(plain data: this module never touches Iceberg), :func:`reconcile` records every
commit the database is missing, the way a commit report would have:

- the batch row is created when missing, with the stamped barrier (a derived
  job's batch starts after the job's previous committed barrier, or 0);
- the commit is recorded and the batch completed with
  :func:`metaservice.barriers.service.complete_batch`, so frontiers,
  ``open_batches``, ``pending_target`` and ``last_barrier`` move exactly as
  they do for reports;
- an open batch of a job that a later stamped batch of the same job proves
  finished (Spark runs a query's batches one after the other) is completed,
  with an empty commit for each output table it was opened with where it left
  no snapshot;
- a stamp the commit reports would be refused for is skipped the same way
  (:func:`metaservice.barriers.service.fence`): one of a batch an operator
  abandoned (the late commit the abandon fenced off), or one for a table that
  became the job's output after the batch was opened;
- a source job is sealed at least at every barrier a derived job reading it was
  found to have committed (that job read the source as complete up to there),
  and the barrier clock is raised to every accepted barrier, so barriers never
  go backwards after a restore.

Stamps that contradict the database are reported, never applied; stamps of a
job that does not write the table are reported and skipped. Everything runs in
the caller's write transaction; ``check=True`` computes the same report inside
a savepoint that is rolled back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from metaservice.barriers import repository as repo
from metaservice.barriers.service import complete_batch, fence, reports_table
from metaservice.context import Context
from metaservice.errors import Conflict
from metaservice.models import SOURCE, Batch, Commit, Job, Table
from metaservice.reconcile import repository as reconcile_repo
from metaservice.reconcile.schemas import (
    ReconcileReport,
    Recorded,
    Stamp,
    StampIssue,
    TableReconciliation,
)
from metaservice.topology import repository as topo


def tables_to_reconcile(session: Session) -> list[str]:
    """Registered tables that have a writing job, by name."""
    return reconcile_repo.written_table_names(session)


def reconcile(
    session: Session,
    ctx: Context,
    stamps: Mapping[str, Sequence[Stamp]],
    *,
    check: bool = False,
) -> ReconcileReport:
    """Apply (or, with ``check``, only evaluate) the stamps of each table, given in commit order."""
    if not check:
        return _Reconciliation(session, ctx, stamps).run(check=False)
    savepoint = session.begin_nested()
    try:
        return _Reconciliation(session, ctx, stamps).run(check=True)
    finally:
        savepoint.rollback()


@dataclass
class _TableIndex:
    """The commits already recorded for one table."""

    # (job id, batch id) -> (snapshot, barrier), and snapshot -> (job id, batch id); the
    # job id is None for a commit of a job since deleted (the table keeps it)
    by_batch: dict[tuple[int | None, int], tuple[int | None, int]]
    by_snapshot: dict[int, tuple[int | None, int]]

    @classmethod
    def load(cls, session: Session, table_id: int) -> _TableIndex:
        index = cls(by_batch={}, by_snapshot={})
        for job_id, batch_id, snapshot_id, barrier in reconcile_repo.commits_of_table(
            session, table_id
        ):
            index.add(job_id, batch_id, snapshot_id, barrier)
        return index

    def add(self, job_id: int | None, batch_id: int, snapshot_id: int | None, barrier: int) -> None:
        self.by_batch[(job_id, batch_id)] = (snapshot_id, barrier)
        if snapshot_id is not None:
            self.by_snapshot[snapshot_id] = (job_id, batch_id)


@dataclass
class _Work:
    table: Table
    stamp: Stamp
    order: int  # commit order across the job's tables, to keep replays in sequence


@dataclass
class _Reconciliation:
    session: Session
    ctx: Context
    stamps: Mapping[str, Sequence[Stamp]]
    reports: dict[str, TableReconciliation] = field(default_factory=dict)
    indexes: dict[int, _TableIndex] = field(default_factory=dict)
    newest: int = 0  # stamps above this barrier are from the future
    highest: int = 0  # the largest barrier accepted
    consumed: dict[int, int] = field(default_factory=dict)  # derived job -> largest barrier added

    def run(self, *, check: bool) -> ReconcileReport:
        session = self.session
        names = sorted(self.stamps)
        tables = topo.tables_by_names(session, names)
        writer_ids = sorted({t.writer_id for t in tables.values() if t.writer_id is not None})
        # Lock the writers in name order, as commit reports do, so the two never deadlock.
        jobs: dict[int, Job] = {}
        for job in sorted(topo.jobs_by_ids(session, writer_ids).values(), key=lambda j: j.name):
            jobs[job.id] = repo.lock_job(session, job.id)
        before = repo.clock(session).last_issued
        self.newest = max(self.ctx.now_slot(), before)
        self.highest = before

        work: dict[int, list[_Work]] = {}
        order = 0
        for name in names:
            entry = self.reports[name] = TableReconciliation(
                table=name, stamped=len(self.stamps[name])
            )
            table = tables.get(name)
            if table is None:
                entry.note = "not registered: no job reads or writes it"
                continue
            if table.writer_id is None:
                entry.note = "no job writes it"
                continue
            writer = jobs[table.writer_id]
            entry.writer = writer.name
            for stamp in self.stamps[name]:
                if stamp.job != writer.name:
                    entry.skipped.append(
                        _issue(
                            stamp,
                            "not_writer",
                            f"job '{stamp.job}' does not write '{name}' "
                            f"(its writer is '{writer.name}')",
                        )
                    )
                    continue
                work.setdefault(writer.id, []).append(_Work(table, stamp, order))
                order += 1

        for job in jobs.values():
            if job.id in work:
                self._reconcile_job(job, work[job.id])
        self._seal_read_sources(jobs)
        if self.highest > before:
            repo.raise_last_issued(session, self.highest)
        session.flush()
        return ReconcileReport(
            check=check,
            tables=[self.reports[n] for n in names],
            last_issued_before=before,
            last_issued_after=max(before, self.highest),
        )

    # -- one job ---------------------------------------------------------------------------

    def _reconcile_job(self, job: Job, items: list[_Work]) -> None:
        session = self.session
        outputs = topo.output_tables(session, job.id)
        # Finished-but-open batches can only be closed when every output's stamps are known.
        outputs_read = all(t.name in self.stamps for t in outputs)
        # Abandoned batches are not open: the abandon already took them off the job's count.
        open_batches = repo.open_batches(session, job.id)
        for item in sorted(items, key=lambda w: (w.stamp.batch_id, w.order)):
            table, stamp = item.table, item.stamp
            report = self.reports[table.name]
            verdict = self._judge(job, table, stamp)
            if isinstance(verdict, _Fenced):
                report.skipped.append(verdict.issue)
                continue
            if isinstance(verdict, StampIssue):
                report.conflicts.append(verdict)
                continue
            self.highest = max(self.highest, stamp.barrier)
            if outputs_read:
                while open_batches and open_batches[0].batch_id < stamp.batch_id:
                    finished = open_batches.pop(0)
                    if not finished.committed:
                        self._close_empty(job, outputs, finished)
            if isinstance(verdict, _Present):
                report.already_present += 1
                continue
            batch = verdict.batch or self._new_batch(job, stamp)
            self._add(job, table, batch, stamp)
            if job.kind != SOURCE:
                self.consumed[job.id] = max(self.consumed.get(job.id, 0), stamp.barrier)
            if not batch.committed and batch not in open_batches:
                open_batches.append(batch)
                open_batches.sort(key=lambda b: b.batch_id)

    def _seal_read_sources(self, jobs: Mapping[int, Job]) -> None:
        """A derived job that committed barrier b read its inputs as complete up to b: no
        new batch of a source job it reads may get a barrier <= b (matters when the clock
        is behind the one that issued the stamps)."""
        for reader_id, barrier in self.consumed.items():
            for table in topo.input_tables(self.session, reader_id):
                source = jobs.get(table.writer_id) if table.writer_id is not None else None
                if source is not None and source.kind == SOURCE and source.frontier < barrier:
                    source.frontier = barrier

    def _judge(
        self, job: Job, table: Table, stamp: Stamp
    ) -> _Add | _Present | _Fenced | StampIssue:
        index = self._index(table)
        recorded = index.by_batch.get((job.id, stamp.batch_id))
        if recorded is not None:
            snapshot, barrier = recorded
            if snapshot == stamp.snapshot_id and barrier == stamp.barrier:
                return _PRESENT
            return _issue(
                stamp,
                "conflicting_report",
                f"batch {stamp.batch_id} of job '{job.name}' is recorded for '{table.name}' "
                f"as snapshot {snapshot} at barrier {barrier}",
            )
        other = index.by_snapshot.get(stamp.snapshot_id)
        if other is not None:
            if other[0] is None:
                # Recorded for a job since deleted (the table keeps its commits): a job
                # registered again under the name finds its former batches recorded.
                return _PRESENT
            other_job = self.session.get(Job, other[0])
            return _issue(
                stamp,
                "snapshot_recorded_elsewhere",
                f"snapshot {stamp.snapshot_id} of '{table.name}' is recorded for batch "
                f"{other[1]} of job '{other_job.name if other_job else other[0]}'",
            )
        if stamp.barrier > self.newest:
            return _issue(
                stamp,
                "barrier_from_future",
                f"barrier {stamp.barrier} is in the future: the barrier clock is at {self.newest}",
            )
        batch = repo.get_batch(self.session, job.id, stamp.batch_id)
        try:
            fence(job, table, stamp.batch_id, batch)
        except Conflict as refused:
            issue = _issue(stamp, refused.code, refused.message)
            # A batch that completed without the table is a contradiction; the others
            # are what the fence is for.
            return issue if refused.code == "batch_complete" else _Fenced(issue)
        if batch is not None and batch.barrier != stamp.barrier:
            return _issue(
                stamp,
                "barrier_mismatch",
                f"batch {stamp.batch_id} of job '{job.name}' has barrier {batch.barrier}",
            )
        return _Add(batch)

    def _index(self, table: Table) -> _TableIndex:
        if table.id not in self.indexes:
            self.indexes[table.id] = _TableIndex.load(self.session, table.id)
        return self.indexes[table.id]

    def _new_batch(self, job: Job, stamp: Stamp) -> Batch:
        batch = Batch(
            job_id=job.id,
            batch_id=stamp.batch_id,
            barrier=stamp.barrier,
            committed=False,
            created_ms=self.ctx.now_ms(),
            outputs=repo.count_outputs_of_batch(self.session, job.id, stamp.batch_id),
        )
        if job.kind == SOURCE:
            job.open_batches += 1
        else:
            batch.start_barrier = reconcile_repo.previous_committed_barrier(
                self.session, job.id, stamp.batch_id
            )
        self.session.add(batch)
        self.session.flush()
        return batch

    def _add(self, job: Job, table: Table, batch: Batch, stamp: Stamp) -> None:
        self._record(job, table, batch, stamp.snapshot_id)
        self.reports[table.name].added.append(_recorded(job, batch, stamp.snapshot_id))
        outputs = batch.outputs
        if outputs is None:  # a batch from before batches recorded their output count
            outputs = repo.count_outputs_of_batch(self.session, job.id, batch.batch_id)
        if not batch.committed and (
            repo.count_batch_commits(self.session, job.id, batch.batch_id) >= outputs
        ):
            complete_batch(self.session, self.ctx, job, batch)

    def _close_empty(self, job: Job, outputs: list[Table], batch: Batch) -> None:
        """A later batch of the job is committed, so this one finished: where it left no
        snapshot among the outputs it was opened with, it committed nothing."""
        for table in outputs:
            if not reports_table(table, batch.batch_id):
                continue
            if (job.id, batch.batch_id) not in self._index(table).by_batch:
                self._record(job, table, batch, None)
                self.reports[table.name].closed_empty.append(_recorded(job, batch, None))
        complete_batch(self.session, self.ctx, job, batch)

    def _record(self, job: Job, table: Table, batch: Batch, snapshot_id: int | None) -> None:
        self.session.add(
            Commit(
                job_id=job.id,
                batch_id=batch.batch_id,
                table_id=table.id,
                barrier=batch.barrier,
                snapshot_id=snapshot_id,
                created_ms=self.ctx.now_ms(),
            )
        )
        self.session.flush()
        self._index(table).add(job.id, batch.batch_id, snapshot_id, batch.barrier)


@dataclass
class _Add:
    batch: Batch | None  # None: the batch row is missing too


class _Present:
    """The stamp's commit is recorded already."""


@dataclass
class _Fenced:
    """The stamp's commit is one the fence keeps out (skipped, not a conflict)."""

    issue: StampIssue


_PRESENT = _Present()


def _issue(stamp: Stamp, code: str, message: str) -> StampIssue:
    return StampIssue(
        job=stamp.job,
        batch_id=stamp.batch_id,
        barrier=stamp.barrier,
        snapshot_id=stamp.snapshot_id,
        code=code,
        message=message,
    )


def _recorded(job: Job, batch: Batch, snapshot_id: int | None) -> Recorded:
    return Recorded(
        job=job.name, batch_id=batch.batch_id, barrier=batch.barrier, snapshot_id=snapshot_id
    )
