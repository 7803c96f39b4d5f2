"""Every query of OpenLineage ingest and emit."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, exists, select, update
from sqlalchemy.orm import Session

from metaservice.models import (
    Commit,
    Job,
    JobInput,
    ObservedDataset,
    ObservedEdge,
    ObservedJob,
    OpenLineageEvent,
    OpenLineageOutbox,
    Table,
)

# -- received events and observed lineage ---------------------------------------------------


def event_recorded(session: Session, key: str) -> bool:
    return session.execute(select(exists().where(OpenLineageEvent.event_key == key))).scalar_one()


def observed_job(session: Session, key: str) -> ObservedJob | None:
    return session.execute(select(ObservedJob).where(ObservedJob.key == key)).scalar_one_or_none()


def observed_dataset(session: Session, key: str) -> ObservedDataset | None:
    return session.execute(
        select(ObservedDataset).where(ObservedDataset.key == key)
    ).scalar_one_or_none()


def edge_exists(session: Session, job_id: int, dataset_id: int, direction: str) -> bool:
    return session.get(ObservedEdge, (job_id, dataset_id, direction)) is not None


def all_observed(
    session: Session,
) -> tuple[Sequence[ObservedJob], Sequence[ObservedDataset], Sequence[ObservedEdge]]:
    jobs = session.execute(select(ObservedJob)).scalars().all()
    datasets = session.execute(select(ObservedDataset)).scalars().all()
    edges = session.execute(select(ObservedEdge)).scalars().all()
    return jobs, datasets, edges


# -- emitting: what an event about a barrier job says ---------------------------------------


def job_tables(session: Session, job_id: int) -> tuple[list[str], list[str]]:
    """The job's input and output table names, sorted."""
    inputs = session.execute(
        select(Table.name)
        .join(JobInput, JobInput.table_id == Table.id)
        .where(JobInput.job_id == job_id)
    ).scalars()
    outputs = session.execute(select(Table.name).where(Table.writer_id == job_id)).scalars()
    return sorted(inputs), sorted(outputs)


def batch_snapshots(session: Session, job_id: int, batch_id: int) -> list[tuple[str, int | None]]:
    """(table, snapshot id) of each commit of a batch, by table name."""
    rows = session.execute(
        select(Table.name, Commit.snapshot_id)
        .join(Table, Table.id == Commit.table_id)
        .where(Commit.job_id == job_id, Commit.batch_id == batch_id)
        .order_by(Table.name)
    ).all()
    return [(name, snapshot) for name, snapshot in rows]


def job_name(session: Session, job_id: int) -> str | None:
    return session.execute(select(Job.name).where(Job.id == job_id)).scalar_one_or_none()


# -- the emit queue -------------------------------------------------------------------------


# An event the backend refused (4xx): kept with its error for an operator, never sent
# again by itself, and no longer holding back the events after it.
REFUSED_DUE_MS = 2**62


def oldest_events(session: Session, limit: int) -> Sequence[OpenLineageOutbox]:
    """The oldest queued events (refused ones aside), locked: a second sender waits here,
    then finds them held."""
    query = (
        select(OpenLineageOutbox)
        .where(OpenLineageOutbox.due_ms < REFUSED_DUE_MS)
        .order_by(OpenLineageOutbox.id)
        .limit(limit)
        .with_for_update()
    )
    return session.execute(query).scalars().all()


def hold(session: Session, ids: Sequence[int], until_ms: int) -> None:
    session.execute(
        update(OpenLineageOutbox).where(OpenLineageOutbox.id.in_(ids)).values(due_ms=until_ms)
    )


def delivered(session: Session, event_id: int) -> None:
    session.execute(delete(OpenLineageOutbox).where(OpenLineageOutbox.id == event_id))


def failed(session: Session, ids: Sequence[int], error: str, due_ms: int) -> None:
    session.execute(
        update(OpenLineageOutbox)
        .where(OpenLineageOutbox.id.in_(ids))
        .values(attempts=OpenLineageOutbox.attempts + 1, last_error=error[:2000], due_ms=due_ms)
    )


def pending(session: Session) -> Sequence[OpenLineageOutbox]:
    return session.execute(select(OpenLineageOutbox).order_by(OpenLineageOutbox.id)).scalars().all()
