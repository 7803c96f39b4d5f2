"""Queries about jobs' rows and batches: the job locks, the barrier clock, a batch's
reads and plain-statement writes, its recorded inputs and commits.

The statements of the hot requests (barriers, reports, next-barrier) are built once,
at import, with bound parameters (see the comment on ``_LOCK_JOBS_BY_NAME``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import BigInteger, bindparam, delete, func, insert, inspect, or_, select, update
from sqlalchemy.orm import Session, aliased
from sqlalchemy.orm.attributes import set_committed_value

from metaservice.barriers.repository._common import _JOB_ID, _JOBS, _OPEN, _SPARK, _table_of
from metaservice.errors import NotFound
from metaservice.models import Batch, BatchInput, ClockState, Commit, Job, Table
from metaservice.revisions.repository import SUPERSEDING
from metaservice.sql import one_of
from metaservice.topology.repository import COUNT_OUTPUTS, storable

# The statements of the hot requests (barriers, reports, next-barrier) are built once,
# with bound parameters: SQLAlchemy then neither builds them nor computes their cache
# key on each call, about a third of a small ORM statement's Python time.
_LOCK_JOBS_BY_NAME = (
    select(Job)
    .where(one_of(Job.name, bindparam("names", expanding=True)))
    .order_by(Job.name)
    .with_for_update()
    .execution_options(populate_existing=True)
)
_CLOCK = select(ClockState).where(ClockState.id == 1)
_BATCH_COLUMNS = [c for c in _table_of(Batch).columns if c.key != "id"]
_NEWEST_ID = aliased(Batch)
_BATCH_AND_NEWEST = select(Batch).where(
    Batch.job_id == _JOB_ID,
    or_(
        Batch.batch_id == bindparam("batch_id", type_=BigInteger),
        Batch.batch_id
        == select(func.max(_NEWEST_ID.batch_id))
        .where(_NEWEST_ID.job_id == _JOB_ID, _NEWEST_ID.batch_id >= 0)
        .scalar_subquery(),
    ),
)


# What a new batch's barrier needs besides the job and its batches, in one statement
# read after the job's lock is held: the revision superseding the job, the job's output
# count, the last barrier issued, the watermark S (read after the watermark lock is
# held shared, for a source: barriers/watermark.py).
_NEW_BATCH_FACTS = select(
    SUPERSEDING.scalar_subquery(),
    COUNT_OUTPUTS.scalar_subquery(),
    select(ClockState.last_issued).where(ClockState.id == 1).scalar_subquery(),
    select(ClockState.watermark).where(ClockState.id == 1).scalar_subquery(),
)


_INSERT_BATCH = insert(_table_of(Batch))
_OPENED = (
    update(_JOBS)
    .where(_JOBS.c.id == _JOB_ID)
    .values(open_batches=_JOBS.c.open_batches + 1, last_seen_ms=bindparam("now", type_=BigInteger))
)

_TOUCHED = (
    update(_JOBS)
    .where(_JOBS.c.id == _JOB_ID)
    .values(last_seen_ms=bindparam("now", type_=BigInteger))
)
_INSERT_BATCH_INPUTS = insert(_table_of(BatchInput))


def lock_job(session: Session, job_id: int) -> Job:
    """The job row, locked for the rest of the transaction (PostgreSQL; SQLite's
    BEGIN IMMEDIATE already serialises writers). A job deleted since the caller
    looked it up is a 404, not a 500."""
    job = session.execute(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if job is None:
        raise NotFound("the job was deleted while this request ran", field="job")
    return job


def lock_jobs_by_name(session: Session, names: Iterable[str]) -> dict[str, Job]:
    """The named jobs' rows, locked in name order in one statement (the order every
    report request takes, so two of them never deadlock); missing names are left out."""
    wanted = sorted({n for n in names if storable(n)})
    if not wanted:
        return {}
    rows = session.execute(_LOCK_JOBS_BY_NAME, {"names": wanted}).scalars()
    return {job.name: job for job in rows}


def clock(session: Session) -> ClockState:
    return session.execute(_CLOCK).scalar_one()


class NewBatchFacts(NamedTuple):
    superseded_by: int | None  # the revision replacing the job, swapping or swapped
    outputs: int
    last_issued: int
    watermark: int


def new_batch_facts(session: Session, job: Job) -> NewBatchFacts:
    """:class:`NewBatchFacts` of the locked job, in one statement."""
    params = {"writer": job.name, "job_id": job.id}
    row = session.connection().execute(_NEW_BATCH_FACTS, params).one()
    return NewBatchFacts(*row)


_CLOCK_TABLE = _table_of(ClockState)
_RAISE_CLOCK = (
    update(_CLOCK_TABLE)
    .where(_CLOCK_TABLE.c.id == 1, _CLOCK_TABLE.c.last_issued < bindparam("barrier"))
    .values(last_issued=bindparam("barrier"))
)


def raise_clock(session: Session, barrier: int) -> None:
    """:func:`raise_last_issued` with a statement built once, for a transaction that
    has not loaded the clock's row (it would not be brought up to date)."""
    session.connection().execute(_RAISE_CLOCK, {"barrier": barrier})


def insert_batch(session: Session, batch: Batch) -> None:
    """Write a new batch as one plain statement rather than through the session's unit
    of work (about half a barrier request's SQLAlchemy time); ``batch`` stays out of
    the session."""
    values = {c.key: getattr(batch, c.key) for c in _BATCH_COLUMNS}
    for flag in ("committed", "abandoned", "advanced"):
        values[flag] = bool(values[flag])
    # The session's connection: session.execute would flush pending changes first.
    session.connection().execute(_INSERT_BATCH, values)


def insert_batches(session: Session, batches: Sequence[Batch]) -> None:
    """:func:`insert_batch` for several batches, in one statement."""
    if len(batches) == 1:
        insert_batch(session, batches[0])
    elif batches:
        insert_batch_rows(
            session, [{c.key: getattr(b, c.key) for c in _BATCH_COLUMNS} for b in batches]
        )


def insert_batch_rows(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Write new batches given as rows (every column of ``batches`` but ``id``), in one
    statement, without building an ORM object per batch."""
    if rows:
        session.connection().execute(_INSERT_BATCH, list(rows))


def insert_open_batch(session: Session, job: Job, batch: Batch, now_ms: int) -> None:
    """:func:`insert_batch` for a new open batch of the locked job, counted on the job's
    row by a second plain statement; the job's row in the session takes the values
    written, without being marked changed."""
    insert_batch(session, batch)
    session.connection().execute(_OPENED, {"job_id": job.id, "now": now_ms})
    set_committed_value(job, "open_batches", job.open_batches + 1)
    set_committed_value(job, "last_seen_ms", now_ms)


def touch_job(session: Session, job: Job, now_ms: int) -> None:
    """``job.last_seen_ms = now_ms``: as one plain UPDATE when nothing else of the job's
    row changed (no flush of the job through the unit of work), else with the rest."""
    if job.last_seen_ms == now_ms:
        return  # as the unit of work, which writes no unchanged value
    if inspect(job).modified:
        job.last_seen_ms = now_ms
        return
    session.connection().execute(_TOUCHED, {"job_id": job.id, "now": now_ms})
    set_committed_value(job, "last_seen_ms", now_ms)


def touch_job_id(session: Session, job_id: int, now_ms: int) -> None:
    """:func:`touch_job` of a job not read in this transaction (one plain UPDATE)."""
    session.connection().execute(_TOUCHED, {"job_id": job_id, "now": now_ms})


def raise_last_issued(session: Session, barrier: int) -> None:
    # Built per call: the ORM brings a clock row already read up to date only when it can
    # evaluate the criteria in Python, which it cannot with a bound parameter.
    session.execute(
        update(ClockState)
        .where(ClockState.id == 1, ClockState.last_issued < barrier)
        .values(last_issued=barrier)
    )


def get_batch(session: Session, job_id: int, batch_id: int) -> Batch | None:
    return session.execute(
        select(Batch).where(Batch.job_id == job_id, Batch.batch_id == batch_id)
    ).scalar_one_or_none()


def batches_by_id(session: Session, job_id: int, batch_ids: Sequence[int]) -> dict[int, Batch]:
    rows = session.execute(
        select(Batch).where(Batch.job_id == job_id, one_of(Batch.batch_id, set(batch_ids)))
    ).scalars()
    return {batch.batch_id: batch for batch in rows}


def newest_batch(session: Session, job_id: int) -> Batch | None:
    """The job's Spark batch with the largest id."""
    return session.execute(
        select(Batch).where(Batch.job_id == job_id, _SPARK).order_by(Batch.batch_id.desc()).limit(1)
    ).scalar_one_or_none()


def batch_and_newest(
    session: Session, job_id: int, batch_id: int
) -> tuple[Batch | None, Batch | None]:
    """The job's batch ``batch_id`` and its newest Spark batch (see :func:`newest_batch`),
    in one statement."""
    rows = list(
        session.execute(_BATCH_AND_NEWEST, {"job_id": job_id, "batch_id": batch_id}).scalars()
    )
    batch = next((b for b in rows if b.batch_id == batch_id), None)
    spark = [b for b in rows if b.batch_id >= 0]
    return batch, max(spark, key=lambda b: b.batch_id, default=None)


def next_batch_id(session: Session, job_id: int) -> int | None:
    """The lowest id the job's next Spark batch can have: one past its newest (a batch
    id never goes back); None for a job that never had one."""
    newest = session.execute(
        select(func.max(Batch.batch_id)).where(Batch.job_id == job_id, _SPARK)
    ).scalar_one()
    return None if newest is None else int(newest) + 1


def count_outputs_of_batch(session: Session, job_id: int, batch_id: int) -> int:
    """How many of the job's outputs its batch ``batch_id`` reports: those the job
    wrote when the batch was opened (``Table.writer_first_batch`` at or below it)."""
    return session.execute(
        select(func.count())
        .select_from(Table)
        .where(
            Table.writer_id == job_id,
            or_(Table.writer_first_batch.is_(None), Table.writer_first_batch <= batch_id),
        )
    ).scalar_one()


def open_batches(session: Session, job_id: int) -> list[Batch]:
    """The job's open batches (neither committed nor abandoned), by batch id."""
    return list(
        session.execute(
            select(Batch).where(Batch.job_id == job_id, _OPEN).order_by(Batch.batch_id)
        ).scalars()
    )


def has_batches(session: Session, job_id: int) -> bool:
    """Whether the job ever had a batch (Spark's, or an advance of the MetaService's)."""
    return (
        session.execute(select(Batch.id).where(Batch.job_id == job_id).limit(1)).first() is not None
    )


def jobs_with_open_batches(session: Session, job_ids: Sequence[int]) -> set[int]:
    """Which of these jobs have a batch open (one statement for all)."""
    if not job_ids:
        return set()
    return set(
        session.execute(
            select(Batch.job_id).where(one_of(Batch.job_id, list(job_ids)), _OPEN).distinct()
        ).scalars()
    )


def open_batch(session: Session, job_id: int) -> Batch | None:
    return session.execute(
        select(Batch).where(Batch.job_id == job_id, _OPEN).limit(1)
    ).scalar_one_or_none()


def add_batch_inputs(
    session: Session, job_id: int, batch_id: int, table_ids: Sequence[int]
) -> None:
    rows = [{"job_id": job_id, "batch_id": batch_id, "table_id": t} for t in table_ids]
    if rows:  # one plain statement, as insert_batch
        session.connection().execute(_INSERT_BATCH_INPUTS, rows[0] if len(rows) == 1 else rows)


def batch_input_tables(session: Session, job_id: int, batch_id: int) -> list[Table]:
    """The inputs a derived batch was opened with, by name ([] for batches from before
    they were recorded)."""
    return list(
        session.execute(
            select(Table)
            .join(BatchInput, BatchInput.table_id == Table.id)
            .where(BatchInput.job_id == job_id, BatchInput.batch_id == batch_id)
            .order_by(Table.name)
        ).scalars()
    )


def delete_batch_commits(session: Session, job_id: int, batch_id: int) -> None:
    session.execute(delete(Commit).where(Commit.job_id == job_id, Commit.batch_id == batch_id))


def previous_batch(session: Session, job_id: int, batch_id: int) -> Batch | None:
    """The job's batch with the largest id below ``batch_id``."""
    return session.execute(
        select(Batch)
        .where(Batch.job_id == job_id, Batch.batch_id < batch_id)
        .order_by(Batch.batch_id.desc())
        .limit(1)
    ).scalar_one_or_none()


def commit_with_snapshot(session: Session, table_id: int, snapshot_id: int) -> Commit | None:
    return session.execute(
        select(Commit).where(Commit.table_id == table_id, Commit.snapshot_id == snapshot_id)
    ).scalar_one_or_none()


def count_batch_commits(session: Session, job_id: int, batch_id: int) -> int:
    return session.execute(
        select(func.count()).where(Commit.job_id == job_id, Commit.batch_id == batch_id)
    ).scalar_one()
