"""The set-based read and writes of a commit report request (``barriers.reports``),
on plain rows rather than ORM objects, and on PostgreSQL with array parameters so
their statements do not grow with the number of reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    null,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session
from sqlalchemy.sql.selectable import TableValuedAlias

from metaservice.barriers.repository._common import _JOBS, _table_of
from metaservice.models import Batch, Commit, Job

_INSERT_COMMITS = insert(_table_of(Commit))
_COMMIT_COLUMNS = ("job_id", "batch_id", "table_id", "barrier", "snapshot_id", "created_ms")
_BATCHES = _table_of(Batch)
_COMMITS = _table_of(Commit)
_BATCH_COMMITTED = (
    update(_BATCHES)
    .where(_BATCHES.c.id == bindparam("row", type_=Integer))
    .values(committed=True, committed_ms=bindparam("when", type_=BigInteger))
)
# What completing a batch moves on its job's row (barriers.reports.mark_complete).
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
