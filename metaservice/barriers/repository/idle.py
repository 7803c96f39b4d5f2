"""Queries of the idle advance (``barriers.idle``): the derived upstream closure,
its rows locked without waiting, its inputs' first changes and committed barriers,
and the advances written in a statement or two."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Integer, and_, bindparam, or_, select, update
from sqlalchemy.orm import Session, aliased
from sqlalchemy.orm.attributes import set_committed_value

from metaservice.barriers.repository._common import _JOBS
from metaservice.barriers.repository.batches import insert_batch_rows
from metaservice.models import DERIVED, Batch, Commit, Job, JobInput, Table
from metaservice.sql import one_of


def try_lock_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, Job]:
    """The jobs' rows, locked in one statement, by id: work that may just be left to a
    later call, so a row another transaction holds locked (``SKIP LOCKED``), or a
    deleted job, is left out. Never waits, so the order rows are taken in cannot
    deadlock."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Job)
        .where(one_of(Job.id, sorted(job_ids)))
        .order_by(Job.id)
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    ).scalars()
    return {job.id: job for job in rows}


def derived_upstream(session: Session, job_ids: Sequence[int]) -> list[int]:
    """The derived jobs among these and every derived job upstream of them (one
    recursive statement; a read without locks)."""
    if not job_ids:
        return []
    start = select(Job.id).where(one_of(Job.id, sorted(job_ids)), Job.kind == DERIVED)
    up = start.cte("up", recursive=True)
    writer = aliased(Job)
    up = up.union(
        select(writer.id)
        .select_from(up)
        .join(JobInput, JobInput.job_id == up.c.id)
        .join(Table, Table.id == JobInput.table_id)
        .join(writer, writer.id == Table.writer_id)
        .where(writer.kind == DERIVED)
    )
    return list(session.execute(select(up.c.id)).scalars())


def first_changes(session: Session, job_ids: Sequence[int]) -> dict[int, int]:
    """For each job, the lowest barrier above its frontier (as stored) at which one of
    its inputs got a snapshot; jobs none of whose inputs changed since are left out.
    One index seek per input; a job's inputs changed in ``(frontier, b]`` exactly when
    its first change is ``<= b``."""
    if not job_ids:
        return {}
    first = (
        select(Commit.barrier)
        .where(
            Commit.table_id == JobInput.table_id,
            Commit.snapshot_id.is_not(None),
            Commit.barrier > Job.frontier,
        )
        .order_by(Commit.barrier)
        .limit(1)
        .correlate(JobInput, Job)
        .scalar_subquery()
    )
    rows = session.execute(
        select(JobInput.job_id, first)
        .join(Job, Job.id == JobInput.job_id)
        .where(one_of(JobInput.job_id, sorted(job_ids)))
    )
    found: dict[int, int] = {}
    for job_id, barrier in rows:
        if barrier is not None:
            found[job_id] = min(barrier, found.get(job_id, barrier))
    return found


def committed_in_ranges(
    session: Session, ranges: dict[tuple[int, int | None], set[int]]
) -> dict[int, set[int]]:
    """The barriers each job committed in a range of its own, in one statement:
    ``ranges`` maps ``(after, below)`` (``below`` None: no upper end) to the jobs read
    in ``(after, below)``; :func:`committed_barriers` for many jobs."""
    found: dict[int, set[int]] = {j: set() for jobs in ranges.values() for j in jobs}
    terms = [
        and_(
            one_of(Batch.job_id, sorted(jobs)),
            Batch.barrier > after,
            *([Batch.barrier < below] if below is not None else []),
        )
        for (after, below), jobs in sorted(ranges.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0))
        if jobs and (below is None or below > after + 1)
    ]
    if terms:
        rows = session.execute(
            select(Batch.job_id, Batch.barrier)
            .where(Batch.committed.is_(True), or_(*terms))
            .distinct()
        )
        for job_id, barrier in rows:
            found[job_id].add(barrier)
    return found


_ADVANCE_JOB = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("advanced_id", type_=Integer))
    .values(frontier=bindparam("advanced_to", type_=BigInteger), pending_target=None)
)


def advanced_batch(job_id: int, start: int, target: int, now_ms: int) -> dict[str, Any]:
    """The row of the committed batch the MetaService records when it advances an idle
    job over ``(start, target]`` (``batch_id`` is ``-target``: never a Spark batch id)."""
    return {
        "job_id": job_id,
        "batch_id": -target,
        "barrier": target,
        "start_barrier": start,
        "committed": True,
        "abandoned": False,
        "advanced": True,
        "created_ms": now_ms,
        "committed_ms": now_ms,
        "query_id": None,
        "outputs": None,
    }


def write_advances(
    session: Session, batches: Sequence[dict[str, Any]], moved: dict[Job, int]
) -> None:
    """Write what advancing idle jobs recorded: the batches (rows of
    :func:`advanced_batch`) in one statement, the jobs' new frontiers (``moved``: job ->
    frontier) in one more; the jobs' rows in the session take the values written
    without being marked changed."""
    insert_batch_rows(session, batches)
    if not moved:
        return
    rows = [{"advanced_id": job.id, "advanced_to": f} for job, f in moved.items()]
    session.connection().execute(_ADVANCE_JOB, rows)
    for job, frontier in moved.items():
        set_committed_value(job, "frontier", frontier)
        set_committed_value(job, "pending_target", None)
