"""Every query about jobs, tables and their edges."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import Integer, bindparam, delete, func, select, update
from sqlalchemy.orm import Session

from metaservice.errors import NotFound
from metaservice.models import (
    Batch,
    BatchInput,
    BatchPlan,
    ClockState,
    Commit,
    Job,
    JobInput,
    Table,
)
from metaservice.sql import one_of

# Statements of the hot requests, built once (see barriers.repository).
_TABLES_BY_NAMES = select(Table).where(one_of(Table.name, bindparam("names", expanding=True)))
_JOBS_BY_IDS = select(Job).where(one_of(Job.id, bindparam("ids", expanding=True)))
_INPUT_TABLES = (
    select(Table)
    .join(JobInput, JobInput.table_id == Table.id)
    .where(JobInput.job_id == bindparam("job_id", type_=Integer))
    .order_by(Table.name)
)
COUNT_OUTPUTS = (
    select(func.count())
    .select_from(Table)
    .where(Table.writer_id == bindparam("job_id", type_=Integer))
)


def storable(name: str) -> bool:
    """Text a database can hold: PostgreSQL refuses NUL, so such a name never exists."""
    return "\x00" not in name


def job_by_name(session: Session, name: str) -> Job | None:
    if not storable(name):
        return None
    return session.execute(select(Job).where(Job.name == name)).scalar_one_or_none()


def require_job(session: Session, name: str, field: str = "job") -> Job:
    job = job_by_name(session, name)
    if job is None:
        raise unknown_job(name, field)
    return job


def unknown_job(name: str, field: str = "job") -> NotFound:
    return NotFound(
        f"job '{name}' is not registered; register it with PUT /api/v1/jobs/{name}", field=field
    )


def table_by_name(session: Session, name: str) -> Table | None:
    if not storable(name):
        return None
    return session.execute(select(Table).where(Table.name == name)).scalar_one_or_none()


def require_table(session: Session, name: str, field: str = "table") -> Table:
    table = table_by_name(session, name)
    if table is None:
        raise NotFound(
            f"table '{name}' is unknown: no registered job reads or writes it", field=field
        )
    return table


def tables_by_names(session: Session, names: Sequence[str]) -> dict[str, Table]:
    names = [n for n in names if storable(n)]
    if not names:
        return {}
    rows = session.execute(_TABLES_BY_NAMES, {"names": names}).scalars()
    return {t.name: t for t in rows}


def all_jobs(session: Session) -> list[Job]:
    return list(session.execute(select(Job).order_by(Job.name)).scalars())


def jobs_by_ids(session: Session, ids: Sequence[int]) -> dict[int, Job]:
    if not ids:
        return {}
    return {j.id: j for j in session.execute(_JOBS_BY_IDS, {"ids": list(ids)}).scalars()}


def input_tables(session: Session, job_id: int) -> list[Table]:
    return list(session.execute(_INPUT_TABLES, {"job_id": job_id}).scalars())


def input_tables_of_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, list[Table]]:
    """Each job's input tables (one statement for all; jobs without inputs are absent)."""
    inputs: dict[int, list[Table]] = defaultdict(list)
    if job_ids:
        for job_id, table in session.execute(
            select(JobInput.job_id, Table)
            .join(Table, Table.id == JobInput.table_id)
            .where(one_of(JobInput.job_id, list(job_ids)))
            .order_by(Table.name)
        ):
            inputs[job_id].append(table)
    return inputs


def input_writers_of_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, list[int | None]]:
    """Each job's input tables' writer ids (None: an input nobody writes), in one
    statement for all; jobs without inputs are absent. :func:`input_tables_of_jobs`
    without building a ``Table`` per input (the per-slot advancer reads every derived
    job's)."""
    writers: dict[int, list[int | None]] = defaultdict(list)
    if job_ids:
        rows = session.execute(
            select(JobInput.job_id, Table.writer_id)
            .join(Table, Table.id == JobInput.table_id)
            .where(one_of(JobInput.job_id, list(job_ids)))
        )
        for job_id, writer_id in rows:
            writers[job_id].append(writer_id)
    return writers


def output_tables(session: Session, job_id: int) -> list[Table]:
    return list(
        session.execute(
            select(Table).where(Table.writer_id == job_id).order_by(Table.name)
        ).scalars()
    )


def count_outputs(session: Session, job_id: int) -> int:
    return session.execute(COUNT_OUTPUTS, {"job_id": job_id}).scalar_one()


def count_outputs_of(session: Session, job_ids: Sequence[int]) -> dict[int, int]:
    """:func:`count_outputs` of several jobs in one statement (0 for a job with none)."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Table.writer_id, func.count())
        .where(one_of(Table.writer_id, job_ids))
        .group_by(Table.writer_id)
    )
    counts = {job_id: 0 for job_id in job_ids}
    counts.update({job_id: n for job_id, n in rows if job_id is not None})
    return counts


def edges_of_jobs(
    session: Session, job_ids: Sequence[int]
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Inputs and outputs (table names) of each job."""
    inputs: dict[int, list[str]] = defaultdict(list)
    outputs: dict[int, list[str]] = defaultdict(list)
    if job_ids:
        for job_id, name in session.execute(
            select(JobInput.job_id, Table.name)
            .join(Table, Table.id == JobInput.table_id)
            .where(one_of(JobInput.job_id, job_ids))
            .order_by(Table.name)
        ):
            inputs[job_id].append(name)
        for writer_id, name in session.execute(
            select(Table.writer_id, Table.name)
            .where(one_of(Table.writer_id, job_ids))
            .order_by(Table.name)
        ):
            if writer_id is not None:
                outputs[writer_id].append(name)
    return inputs, outputs


def readers_of_tables(session: Session, table_ids: Sequence[int]) -> dict[int, list[str]]:
    readers: dict[int, list[str]] = defaultdict(list)
    if table_ids:
        for table_id, name in session.execute(
            select(JobInput.table_id, Job.name)
            .join(Job, Job.id == JobInput.job_id)
            .where(one_of(JobInput.table_id, table_ids))
            .order_by(Job.name)
        ):
            readers[table_id].append(name)
    return readers


def reader_jobs(session: Session, table_id: int) -> list[Job]:
    return list(
        session.execute(
            select(Job)
            .join(JobInput, JobInput.job_id == Job.id)
            .where(JobInput.table_id == table_id)
        ).scalars()
    )


def bump_topology_version(session: Session) -> None:
    """Takes the clock row's lock too, which serialises topology changes."""
    session.execute(
        update(ClockState)
        .where(ClockState.id == 1)
        .values(topology_version=ClockState.topology_version + 1)
    )


def delete_job(session: Session, job_id: int) -> None:
    """The job's row, its input edges and its barrier history (batches, their plans and
    inputs); its commit reports stay, without their job, as the tables' history.

    Spelled out rather than left to ON DELETE CASCADE, so it does not depend on
    SQLite's foreign_keys pragma."""
    session.execute(delete(JobInput).where(JobInput.job_id == job_id))
    drop_plans(session, job_id)
    session.execute(delete(BatchInput).where(BatchInput.job_id == job_id))
    # The commits stay as their tables' history: each is the table's snapshot at a
    # barrier that versions already handed out named. Only the batch is forgotten.
    session.execute(update(Commit).where(Commit.job_id == job_id).values(job_id=None))
    session.execute(delete(Batch).where(Batch.job_id == job_id))
    session.execute(update(Table).where(Table.writer_id == job_id).values(writer_id=None))
    session.execute(delete(Job).where(Job.id == job_id))


def drop_plans(session: Session, job_id: int) -> None:
    """Every plan made for the job's batches (they were made for its inputs then)."""
    session.execute(delete(BatchPlan).where(BatchPlan.job_id == job_id))


def last_commit_barriers(session: Session, table_ids: Sequence[int]) -> dict[int, int]:
    """The largest barrier each table was stamped at, by any writer it had (tables
    without a commit are absent)."""
    if not table_ids:
        return {}
    rows = session.execute(
        select(Commit.table_id, func.max(Commit.barrier))
        .where(one_of(Commit.table_id, list(table_ids)))
        .group_by(Commit.table_id)
    )
    return {table_id: barrier for table_id, barrier in rows}
