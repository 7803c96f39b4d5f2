"""Every query about jobs' batches and the barrier-to-snapshot mapping."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    ScalarSelect,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    inspect,
    literal_column,
    null,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy import Table as SqlTable
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql.selectable import TableValuedAlias

from metaservice.errors import NotFound
from metaservice.models import (
    DERIVED,
    SOURCE,
    Batch,
    BatchInput,
    BatchPlan,
    ClockState,
    Commit,
    Job,
    JobInput,
    Table,
)
from metaservice.revisions.repository import SUPERSEDING
from metaservice.topology.repository import COUNT_OUTPUTS, storable


def _table_of(model: type[Any]) -> SqlTable:
    """A mapped class's table, for plain statements (Core rather than the ORM)."""
    return cast(SqlTable, model.__table__)


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
_BATCH_COLUMNS = [c for c in _table_of(Batch).columns if c.key != "id"]
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
_OLDEST_OPEN = (
    select(func.min(Batch.barrier)).where(Batch.job_id == Job.id, _OPEN).correlate(Job)
).scalar_subquery()
_SOURCE_PROGRESS = select(Job.id, Job.frontier, _OLDEST_OPEN, Job.offline_floor).where(
    Job.id.in_(bindparam("ids", expanding=True))
)


# What a new batch's barrier needs besides the job and its batches, in one statement
# read after the job's lock is held: the revision superseding the job, the job's output
# count, the last barrier issued.
_NEW_BATCH_FACTS = select(
    SUPERSEDING.scalar_subquery(),
    COUNT_OUTPUTS.scalar_subquery(),
    select(ClockState.last_issued).where(ClockState.id == 1).scalar_subquery(),
)
# On the tables, not the mapped classes: the ORM's bulk paths cost more than the statements.
_JOBS = _table_of(Job)
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


def try_lock_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, Job]:
    """The jobs' rows, locked in one statement, by id: work that may just be left to a
    later call, so a row another transaction holds locked (``SKIP LOCKED``), or a
    deleted job, is left out. Never waits, so the order rows are taken in cannot
    deadlock."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Job)
        .where(Job.id.in_(sorted(job_ids)))
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
    start = select(Job.id).where(Job.id.in_(sorted(job_ids)), Job.kind == DERIVED)
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
        .where(JobInput.job_id.in_(sorted(job_ids)))
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
            Batch.job_id.in_(sorted(jobs)),
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
        rows = [{c.key: getattr(b, c.key) for c in _BATCH_COLUMNS} for b in batches]
        session.connection().execute(_INSERT_BATCH, rows)


_ADVANCE_JOB = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("advanced_id", type_=Integer))
    .values(frontier=bindparam("advanced_to", type_=BigInteger), pending_target=None)
)


def write_advances(session: Session, batches: Sequence[Batch], moved: dict[Job, int]) -> None:
    """Write what advancing idle jobs recorded: the batches (kept out of the session) in
    one statement, the jobs' new frontiers (``moved``: job -> frontier) in one more; the
    jobs' rows in the session take the values written without being marked changed."""
    insert_batches(session, batches)
    if not moved:
        return
    rows = [{"advanced_id": job.id, "advanced_to": f} for job, f in moved.items()]
    session.connection().execute(_ADVANCE_JOB, rows)
    for job, frontier in moved.items():
        set_committed_value(job, "frontier", frontier)
        set_committed_value(job, "pending_target", None)


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


_INSERT_COMMITS = insert(_table_of(Commit))
_COMMIT_COLUMNS = ("job_id", "batch_id", "table_id", "barrier", "snapshot_id", "created_ms")
_BATCHES = _table_of(Batch)
_COMMITS = _table_of(Commit)
_BATCH_COMMITTED = (
    update(_BATCHES)
    .where(_BATCHES.c.id == bindparam("row", type_=Integer))
    .values(committed=True, committed_ms=bindparam("when", type_=BigInteger))
)
# What completing a batch moves on its job's row (barriers.service.mark_complete).
_PROGRESS_COLUMNS = (
    "frontier",
    "open_batches",
    "pending_target",
    "last_barrier",
    "last_batch_id",
    "last_seen_ms",
)
_JOB_PROGRESS = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("row", type_=Integer))
    .values({name: bindparam(f"new_{name}") for name in _PROGRESS_COLUMNS})
)


# A report request's rows, read and written as plain rows rather than ORM objects: a
# request of 500 reports spent most of its time building, tracking and flushing them.
@dataclass(slots=True)
class BatchRow:
    """A batch as a report request reads it; ``committed``/``committed_ms`` change in
    memory when the request completes it (written by :func:`write_reports`)."""

    id: int
    job_id: int
    batch_id: int
    barrier: int
    start_barrier: int | None
    committed: bool
    abandoned: bool
    outputs: int | None
    committed_ms: int | None = None


class CommitRow(NamedTuple):
    job_id: int
    batch_id: int
    table_id: int
    barrier: int
    snapshot_id: int | None
    created_ms: int


_BATCH_ROW = [
    _BATCHES.c[k]
    for k in (
        "id",
        "job_id",
        "batch_id",
        "barrier",
        "start_barrier",
        "committed",
        "abandoned",
        "outputs",
    )
]
_COMMIT_ROW = [_COMMITS.c[k] for k in _COMMIT_COLUMNS]


def _unnest(**arrays: Any) -> TableValuedAlias:
    """PostgreSQL: ``unnest(CAST(:a AS T[]), ...) AS name(a, ...)``, rows zipped from one
    array parameter per column (an array literal, see :func:`_columns`). A statement
    with a fixed text whatever the number of rows: no expanding IN rendered per call,
    and psycopg prepares it once."""
    return (
        func.unnest(
            *(sql_cast(bindparam(name, type_=String), ARRAY(t)) for name, t in arrays.items())
        )
        .table_valued(*arrays)
        .render_derived()
    )


def _report_rows(batches: Any, snapshots: Any, on_batches: Any, on_snapshots: Any) -> Any:
    """The one read of a report request (:func:`report_rows`): rows tagged 0, a batch
    given by (job id, batch id) with one of its commits (or none), and rows tagged 1,
    a commit of a snapshot given by (table id, snapshot id); ``batches`` and
    ``snapshots`` are the FROM clauses picking them, ``on_*`` their WHERE clauses
    (None: the FROM clauses pick them)."""
    no_batch = [sql_cast(null(), c.type) for c in _BATCH_ROW]
    its_commits = and_(
        _COMMITS.c.job_id == _BATCHES.c.job_id, _COMMITS.c.batch_id == _BATCHES.c.batch_id
    )
    of_batches = select(literal_column("0"), *_BATCH_ROW, *_COMMIT_ROW).select_from(
        batches.outerjoin(_COMMITS, its_commits)
    )
    of_snapshots = select(literal_column("1"), *no_batch, *_COMMIT_ROW).select_from(snapshots)
    if on_batches is not None:
        of_batches, of_snapshots = of_batches.where(on_batches), of_snapshots.where(on_snapshots)
    return union_all(of_batches, of_snapshots)


_PG_KEYS = _unnest(job_id=Integer, batch_id=BigInteger)
_PG_SNAPSHOT_KEYS = _unnest(s_table_id=Integer, s_snapshot_id=BigInteger)
_PG_REPORT_ROWS = _report_rows(
    _BATCHES.join(
        _PG_KEYS,
        and_(_BATCHES.c.job_id == _PG_KEYS.c.job_id, _BATCHES.c.batch_id == _PG_KEYS.c.batch_id),
    ),
    _COMMITS.join(
        _PG_SNAPSHOT_KEYS,
        and_(
            _COMMITS.c.table_id == _PG_SNAPSHOT_KEYS.c.s_table_id,
            _COMMITS.c.snapshot_id == _PG_SNAPSHOT_KEYS.c.s_snapshot_id,
        ),
    ),
    None,
    None,
)
_SQLITE_REPORT_ROWS = _report_rows(
    _BATCHES,
    _COMMITS,
    tuple_(_BATCHES.c.job_id, _BATCHES.c.batch_id).in_(bindparam("keys", expanding=True)),
    tuple_(_COMMITS.c.table_id, _COMMITS.c.snapshot_id).in_(bindparam("snapshots", expanding=True)),
)
_PG_NEW_COMMITS = _unnest(
    n_job_id=Integer,
    n_batch_id=BigInteger,
    n_table_id=Integer,
    n_barrier=BigInteger,
    n_snapshot_id=BigInteger,
    n_created_ms=BigInteger,
)
_PG_INSERT_COMMITS = insert(_COMMITS).from_select(
    list(_COMMIT_COLUMNS), select(*(_PG_NEW_COMMITS.c[f"n_{k}"] for k in _COMMIT_COLUMNS))
)
_PG_PROGRESS = _unnest(
    p_id=Integer,
    p_frontier=BigInteger,
    p_open_batches=Integer,
    p_pending_target=BigInteger,
    p_last_barrier=BigInteger,
    p_last_batch_id=BigInteger,
    p_last_seen_ms=BigInteger,
)
_PG_JOBS_PROGRESS = (
    update(_JOBS)
    .where(_JOBS.c.id == _PG_PROGRESS.c.p_id)
    .values({name: _PG_PROGRESS.c[f"p_{name}"] for name in _PROGRESS_COLUMNS})
)
_PG_DONE = _unnest(done_id=Integer, done_ms=BigInteger)
_PG_BATCHES_COMMITTED = (
    update(_BATCHES)
    .where(_BATCHES.c.id == _PG_DONE.c.done_id)
    .values(committed=True, committed_ms=_PG_DONE.c.done_ms)
)


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _columns(rows: Sequence[tuple[int | None, ...]], names: Sequence[str]) -> dict[str, str]:
    """Integer rows as one PostgreSQL array literal per column (``{1,2,NULL}``), the
    parameters of :func:`_unnest`: psycopg adapts a list element by element in Python,
    several times the cost of this join for a request of 500 reports."""
    return {
        name: "{" + ",".join(_array_item(row[i]) for row in rows) + "}"
        for i, name in enumerate(names)
    }


def _array_item(value: int | None) -> str:
    return "NULL" if value is None else str(int(value))  # int(): only numbers in the text


def report_rows(
    session: Session, batches: Iterable[tuple[int, int]], snapshots: Iterable[tuple[int, int]]
) -> tuple[dict[tuple[int, int], BatchRow], list[CommitRow], dict[tuple[int, int], CommitRow]]:
    """What a report request reads about its batches, in one statement whatever their
    number: the batches given by (job id, batch id), every commit of them, and the
    commits of the snapshots given by (table id, snapshot id), by that key."""
    keys, snaps = sorted(set(batches)), sorted(set(snapshots))
    if not keys and not snaps:
        return {}, [], {}
    if _postgres(session):
        params: dict[str, Any] = {
            **_columns(keys, ("job_id", "batch_id")),
            **_columns(snaps, ("s_table_id", "s_snapshot_id")),
        }
        rows = session.connection().execute(_PG_REPORT_ROWS, params)
    else:
        params = {"keys": keys, "snapshots": snaps}
        rows = session.connection().execute(_SQLITE_REPORT_ROWS, params)
    found: dict[tuple[int, int], BatchRow] = {}
    of_batches: list[CommitRow] = []
    by_snapshot: dict[tuple[int, int], CommitRow] = {}
    for row in rows:
        commit = CommitRow(*row[9:]) if row[9] is not None else None
        if row[0] == 0:
            if (row[2], row[3]) not in found:
                found[(row[2], row[3])] = BatchRow(*row[1:9])
            if commit is not None:
                of_batches.append(commit)
        elif commit is not None and commit.snapshot_id is not None:
            by_snapshot[(commit.table_id, commit.snapshot_id)] = commit
    for b in found.values():
        b.committed, b.abandoned = bool(b.committed), bool(b.abandoned)  # SQLite: 0 / 1
    return found, of_batches, by_snapshot


def write_reports(
    session: Session,
    commits: Sequence[CommitRow],
    completed: Sequence[BatchRow],
    jobs: Sequence[Job],
) -> None:
    """Write what a report request recorded: new commits, the batches they completed
    and their jobs' progress (the jobs taken out of the session once written), as one
    statement each rather than through the unit of work; on PostgreSQL each is one
    statement of array parameters whatever the number of rows (psycopg's executemany
    still sends a statement per row)."""
    # On the session's connection: session.execute would first flush the changed rows
    # through the unit of work, the work these statements replace.
    connection = session.connection()
    done = [(b.id, b.committed_ms) for b in completed]
    progress = [(j.id, *(getattr(j, k) for k in _PROGRESS_COLUMNS)) for j in jobs]
    written: list[tuple[Any, list[dict[str, Any]]]] = []
    if _postgres(session):
        if commits:
            new = _columns(commits, [f"n_{k}" for k in _COMMIT_COLUMNS])
            connection.execute(_PG_INSERT_COMMITS, new)
        if done:
            written.append((_PG_BATCHES_COMMITTED, [_columns(done, ("done_id", "done_ms"))]))
        if progress:
            names = ["p_id", *(f"p_{k}" for k in _PROGRESS_COLUMNS)]
            written.append((_PG_JOBS_PROGRESS, [_columns(progress, names)]))
    else:
        rows = [c._asdict() for c in commits]
        if rows:
            connection.execute(_INSERT_COMMITS, rows[0] if len(rows) == 1 else rows)
        written.append((_BATCH_COMMITTED, [{"row": i, "when": ms} for i, ms in done]))
        names = ["row", *(f"new_{k}" for k in _PROGRESS_COLUMNS)]
        written.append((_JOB_PROGRESS, [dict(zip(names, p, strict=True)) for p in progress]))
    if session.dispatch.after_flush:
        # Something watches flushes (the OpenLineage emitter: a batch becoming committed
        # is an event), so the unit of work writes the batches and jobs, and it sees them.
        for row in completed:
            batch = session.get(Batch, row.id)
            assert batch is not None  # read and locked (its job's row) by this request
            batch.committed, batch.committed_ms = True, row.committed_ms
        return
    for statement, params in written:
        if params:
            connection.execute(statement, params[0] if len(params) == 1 else params)
    for job in jobs:
        session.expunge(job)  # written above: nothing left for the session's flush


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
            select(Batch.job_id).where(Batch.job_id.in_(list(job_ids)), _OPEN).distinct()
        ).scalars()
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
                Job.id.in_(ids),
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
