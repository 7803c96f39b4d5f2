"""Every query about jobs' batches and the barrier-to-snapshot mapping."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    ScalarSelect,
    bindparam,
    case,
    delete,
    func,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.orm import Session, aliased

from metaservice.errors import NotFound
from metaservice.models import SOURCE, Batch, BatchInput, BatchPlan, ClockState, Commit, Job, Table
from metaservice.topology.repository import storable

# A batch that still holds its job's progress: given a barrier, neither committed nor
# abandoned by an operator.
_OPEN = Batch.committed.is_(False) & Batch.abandoned.is_(False)
# A batch Spark ran (the MetaService's own advances of idle jobs have negative ids).
_SPARK = Batch.batch_id >= 0

# The statements of the hot requests (barriers, reports, next-barrier) are built once,
# with bound parameters: SQLAlchemy then neither builds them nor computes their cache
# key on each call, about a third of a small ORM statement's Python time.
_LOCK_JOBS_BY_NAME = (
    select(Job)
    .where(Job.name.in_(bindparam("names", expanding=True)))
    .order_by(Job.name)
    .with_for_update()
    .execution_options(populate_existing=True)
)
_CLOCK = select(ClockState).where(ClockState.id == 1)
_JOB_ID = bindparam("job_id", type_=Integer)
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
_BATCHES_BY_KEY = select(Batch).where(
    tuple_(Batch.job_id, Batch.batch_id).in_(bindparam("keys", expanding=True))
)
_OF_BATCHES = tuple_(Commit.job_id, Commit.batch_id).in_(bindparam("batches", expanding=True))
_OF_SNAPSHOTS = tuple_(Commit.table_id, Commit.snapshot_id).in_(
    bindparam("snapshots", expanding=True)
)
_COMMITS_OF_BATCHES = select(Commit).where(_OF_BATCHES)
_COMMITS_OF_SNAPSHOTS = select(Commit).where(_OF_SNAPSHOTS)
_COMMITS_OF_BATCHES_OR_SNAPSHOTS = select(Commit).where(or_(_OF_BATCHES, _OF_SNAPSHOTS))
_OLDEST_OPEN = (
    select(func.min(Batch.barrier)).where(Batch.job_id == Job.id, _OPEN).correlate(Job)
).scalar_subquery()
_SOURCE_PROGRESS = select(Job.id, Job.frontier, _OLDEST_OPEN, Job.offline_floor).where(
    Job.id.in_(bindparam("ids", expanding=True))
)


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
        select(Batch).where(Batch.job_id == job_id, Batch.batch_id.in_(set(batch_ids)))
    ).scalars()
    return {batch.batch_id: batch for batch in rows}


def batches_by_key(
    session: Session, keys: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], Batch]:
    """Batches by (job id, batch id), in one statement."""
    wanted = set(keys)
    if not wanted:
        return {}
    rows = session.execute(_BATCHES_BY_KEY, {"keys": sorted(wanted)}).scalars()
    return {(batch.job_id, batch.batch_id): batch for batch in rows}


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


def has_batches(session: Session, job_id: int) -> bool:
    """Whether the job ever had a batch (Spark's, or an advance of the MetaService's)."""
    return (
        session.execute(select(Batch.id).where(Batch.job_id == job_id).limit(1)).first() is not None
    )


def open_batch(session: Session, job_id: int) -> Batch | None:
    return session.execute(
        select(Batch).where(Batch.job_id == job_id, _OPEN).limit(1)
    ).scalar_one_or_none()


def get_plan(session: Session, job_id: int, after: int) -> BatchPlan | None:
    return session.get(BatchPlan, (job_id, after))


def plan_ending_at(
    session: Session, job_id: int, barrier: int, after_at_least: int
) -> BatchPlan | None:
    """The plan of the job that ends at ``barrier`` and starts no earlier than given."""
    return session.execute(
        select(BatchPlan)
        .where(
            BatchPlan.job_id == job_id,
            BatchPlan.barrier == barrier,
            BatchPlan.after >= after_at_least,
        )
        .order_by(BatchPlan.after.desc())
        .limit(1)
    ).scalar_one_or_none()


def drop_plans_upto(session: Session, job_id: int, after: int) -> None:
    """Forget plans of batches that start at or before ``after`` (their batch exists)."""
    drop_plans_upto_many(session, {job_id: after})


def drop_plans_upto_many(session: Session, upto: dict[int, int]) -> None:
    """:func:`drop_plans_upto` for several jobs (job id -> after) in one statement."""
    if upto:
        session.execute(
            delete(BatchPlan).where(
                or_(*((BatchPlan.job_id == j) & (BatchPlan.after <= a) for j, a in upto.items()))
            )
        )


def add_batch_inputs(
    session: Session, job_id: int, batch_id: int, table_ids: Sequence[int]
) -> None:
    for table_id in table_ids:
        session.add(BatchInput(job_id=job_id, batch_id=batch_id, table_id=table_id))


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


def inputs_changed(session: Session, table_ids: Sequence[int], after: int, upto: int) -> bool:
    """Whether any of the tables got a snapshot with a barrier in (after, upto]."""
    if not table_ids:
        return False
    return (
        session.execute(
            select(Commit.id)
            .where(
                Commit.table_id.in_(table_ids),
                Commit.snapshot_id.is_not(None),
                Commit.barrier > after,
                Commit.barrier <= upto,
            )
            .limit(1)
        ).first()
        is not None
    )


def delete_batch_commits(session: Session, job_id: int, batch_id: int) -> None:
    session.execute(delete(Commit).where(Commit.job_id == job_id, Commit.batch_id == batch_id))


class SourceProgress(NamedTuple):
    sealed: int
    oldest_open: int | None
    offline_floor: int | None


def source_progress(session: Session, job_ids: Sequence[int]) -> dict[int, SourceProgress]:
    """(sealed frontier, oldest open barrier, offline floor) of each job, read in ONE statement.

    Two statements would let a batch commit in between under READ COMMITTED (write
    transactions, e.g. a consistent version taken with a lease): the job would look
    fully committed while its frontier still held the older value.
    """
    if not job_ids:
        return {}
    rows = session.execute(_SOURCE_PROGRESS, {"ids": list(job_ids)})
    return {job_id: SourceProgress(*rest) for job_id, *rest in rows}


def committed_barriers(session: Session, job_id: int, after: int, upto: int) -> list[int]:
    """Barriers a derived job committed in (after, upto], ascending."""
    return list(
        session.execute(
            select(Batch.barrier)
            .where(
                Batch.job_id == job_id,
                Batch.committed.is_(True),
                Batch.barrier > after,
                Batch.barrier <= upto,
            )
            .distinct()
            .order_by(Batch.barrier)
        ).scalars()
    )


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
    rows = session.execute(select(Job.id, latest).where(Job.id.in_(job_ids)))
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
    """Idle source jobs whose frontier can move up towards the last closed slot, locked in id order."""
    ids = list(job_ids)
    if not ids:
        return []
    return list(
        session.execute(
            select(Job.id)
            .where(
                Job.id.in_(ids),
                Job.kind == SOURCE,
                Job.open_batches == 0,
                Job.frontier < _sealable(closed, interval),
            )
            .order_by(Job.id)
            .with_for_update()
        ).scalars()
    )


def seal(session: Session, job_ids: Sequence[int], closed: int, interval: int) -> dict[int, int]:
    """Move the jobs' frontiers up to their sealable slot; the new frontier of each job
    moved, returned by the UPDATE itself (no second read of the rows)."""
    limit = _sealable(closed, interval)
    rows = session.execute(
        update(Job)
        .where(Job.id.in_(job_ids), Job.open_batches == 0, Job.frontier < limit)
        .values(frontier=limit)
        .returning(Job.id, Job.frontier)
        .execution_options(synchronize_session=False)
    )
    return {job_id: frontier for job_id, frontier in rows}


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


def commits_of_batches_or_snapshots(
    session: Session, batches: Iterable[tuple[int, int]], snapshots: Iterable[tuple[int, int]]
) -> tuple[list[Commit], dict[tuple[int, int], Commit]]:
    """Every commit of the batches given by (job id, batch id), and the commits of the
    snapshots given by (table id, snapshot id), in one statement."""
    of_batches, of_snapshots = set(batches), set(snapshots)
    if of_batches and of_snapshots:
        statement = _COMMITS_OF_BATCHES_OR_SNAPSHOTS
    elif of_batches or of_snapshots:
        statement = _COMMITS_OF_BATCHES if of_batches else _COMMITS_OF_SNAPSHOTS
    else:
        return [], {}
    params = {"batches": sorted(of_batches), "snapshots": sorted(of_snapshots)}
    rows = list(session.execute(statement, params).scalars())
    return (
        [c for c in rows if (c.job_id, c.batch_id) in of_batches],
        {
            (c.table_id, c.snapshot_id): c
            for c in rows
            if c.snapshot_id is not None and (c.table_id, c.snapshot_id) in of_snapshots
        },
    )


def count_batch_commits(session: Session, job_id: int, batch_id: int) -> int:
    return session.execute(
        select(func.count()).where(Commit.job_id == job_id, Commit.batch_id == batch_id)
    ).scalar_one()


def snapshot_at(session: Session, table_id: int, barrier: int) -> int | None:
    """The latest snapshot of the table whose barrier is <= ``barrier``."""
    return session.execute(
        select(Commit.snapshot_id)
        .where(
            Commit.table_id == table_id,
            Commit.snapshot_id.is_not(None),
            Commit.barrier <= barrier,
        )
        .order_by(Commit.barrier.desc(), Commit.batch_id.desc())
        .limit(1)
    ).scalar_one_or_none()


def snapshots_at(session: Session, table_ids: Sequence[int], barrier: int) -> dict[int, int | None]:
    """:func:`snapshot_at` of many tables in one statement (still one index seek per table)."""
    return snapshots_at_barriers(session, table_ids, [barrier])[0]


def snapshots_at_barriers(
    session: Session, table_ids: Sequence[int], barriers: Sequence[int]
) -> list[dict[int, int | None]]:
    """:func:`snapshots_at` for each of several barriers, in one statement."""
    if not table_ids:
        return [{} for _ in barriers]
    rows = session.execute(
        select(Table.id, *(_snapshot_at(barrier) for barrier in barriers)).where(
            Table.id.in_(table_ids)
        )
    ).all()
    return [{row[0]: row[1 + i] for row in rows} for i in range(len(barriers))]


def _snapshot_at(barrier: int) -> ScalarSelect[int | None]:
    """SQL for the snapshot of the table of the enclosing query at ``barrier``."""
    return (
        select(Commit.snapshot_id)
        .where(
            Commit.table_id == Table.id,
            Commit.snapshot_id.is_not(None),
            Commit.barrier <= barrier,
        )
        .order_by(Commit.barrier.desc(), Commit.batch_id.desc())
        .limit(1)
        .correlate(Table)
        .scalar_subquery()
    )


class LatestSnapshot(NamedTuple):
    snapshot_id: int
    barrier: int


def latest_snapshots(session: Session, table_ids: Sequence[int]) -> dict[int, LatestSnapshot]:
    """Each table's newest snapshot and its barrier (tables with none are left out), in
    one statement: one backward index seek per table, whatever the history."""
    if not table_ids:
        return {}
    newest = (
        select(Commit.id)
        .where(Commit.table_id == Table.id, Commit.snapshot_id.is_not(None))
        .order_by(Commit.barrier.desc(), Commit.batch_id.desc())
        .limit(1)
        .correlate(Table)
        .scalar_subquery()
    )
    page = select(newest.label("commit_id")).where(Table.id.in_(table_ids)).subquery()
    rows = session.execute(
        select(Commit.table_id, Commit.snapshot_id, Commit.barrier).join(
            page, Commit.id == page.c.commit_id
        )
    )
    return {
        table_id: LatestSnapshot(snapshot, barrier)
        for table_id, snapshot, barrier in rows
        if snapshot is not None  # always, by the query: for the type checker
    }
