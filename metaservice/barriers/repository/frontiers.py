"""Queries about source jobs' frontiers: their progress read in one statement, the
seal of idle sources, and the latest barrier each job committed at."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from sqlalchemy import ColumnElement, bindparam, case, func, select, update
from sqlalchemy.orm import Session

from metaservice.barriers.repository._common import _OPEN
from metaservice.models import SOURCE, Batch, ClockState, Job
from metaservice.sql import one_of

_OLDEST_OPEN = (
    select(func.min(Batch.barrier)).where(Batch.job_id == Job.id, _OPEN).correlate(Job)
).scalar_subquery()
_WATERMARK = select(ClockState.watermark).where(ClockState.id == 1).scalar_subquery()
_SOURCE_PROGRESS = select(Job.id, Job.frontier, _OLDEST_OPEN, Job.offline_floor, _WATERMARK).where(
    one_of(Job.id, bindparam("ids", expanding=True))
)


class SourceProgress(NamedTuple):
    sealed: int
    oldest_open: int | None
    offline_floor: int | None
    watermark: int  # the clock row's S (barriers/watermark.py), read with the row


def source_progress(session: Session, job_ids: Sequence[int]) -> dict[int, SourceProgress]:
    """(sealed frontier, oldest open barrier, offline floor, watermark S) of each job,
    read in ONE statement.

    Two statements would let a batch commit in between under READ COMMITTED (write
    transactions, e.g. a consistent version taken with a lease): the job would look
    fully committed while its frontier still held the older value. And S read after the
    rows could be a raise that came after a batch opened at or below it, which the rows
    read before did not show (barriers/watermark.py).
    """
    if not job_ids:
        return {}
    rows = session.execute(_SOURCE_PROGRESS, {"ids": list(job_ids)})
    return {job_id: SourceProgress(*rest) for job_id, *rest in rows}


def latest_committed_at_or_before(
    session: Session, job_ids: Sequence[int], barrier: int
) -> dict[int, int]:
    """The largest barrier each job committed at or below ``barrier`` (jobs with none
    are left out), in one statement: one backward index seek per job, so the cost does
    not grow with the jobs' history (a grouped ``max`` read every batch below it)."""
    if not job_ids:
        return {}
    latest = (
        select(Batch.barrier)
        .where(Batch.job_id == Job.id, Batch.committed.is_(True), Batch.barrier <= barrier)
        .order_by(Batch.barrier.desc())
        .limit(1)
        .correlate(Job)
        .scalar_subquery()
    )
    rows = session.execute(select(Job.id, latest).where(one_of(Job.id, job_ids)))
    return {job_id: found for job_id, found in rows if found is not None}


def _sealable(closed: int, interval: int) -> ColumnElement[int]:
    """SQL for frontiers.sealable_slot: the closed slot, kept below an offline floor."""
    below_floor = Job.offline_floor - interval
    return case(
        (Job.offline_floor.is_not(None) & (below_floor < closed), below_floor), else_=closed
    )


def seal_candidates(
    session: Session, job_ids: Iterable[int], closed: int, interval: int
) -> list[int]:
    """Idle source jobs whose frontier can move up towards the last closed slot, locked in
    id order; a row another transaction holds locked is left out (``SKIP LOCKED``).

    Leaving one out is always safe: its frontier stays at its sealed value, below what
    sealing would give, so the caller decides on less than it could, and sealing is
    tried again on the next call. Waiting for the lock instead queued every derived
    job's next-barrier round (holding that job's own row) behind the source's barrier,
    report, grant and listener event: the convoy of issue 13."""
    ids = list(job_ids)
    if not ids:
        return []
    return list(
        session.execute(
            select(Job.id)
            .where(
                one_of(Job.id, ids),
                Job.kind == SOURCE,
                Job.open_batches == 0,
                Job.frontier < _sealable(closed, interval),
            )
            .order_by(Job.id)
            .with_for_update(skip_locked=True)
        ).scalars()
    )


def seal(session: Session, job_ids: Sequence[int], closed: int, interval: int) -> dict[int, int]:
    """Move the jobs' frontiers up to their sealable slot; the new frontier of each job
    moved, returned by the UPDATE itself (no second read of the rows)."""
    limit = _sealable(closed, interval)
    rows = session.execute(
        update(Job)
        .where(one_of(Job.id, job_ids), Job.open_batches == 0, Job.frontier < limit)
        .values(frontier=limit)
        .returning(Job.id, Job.frontier)
        .execution_options(synchronize_session=False)
    )
    return {job_id: frontier for job_id, frontier in rows}
