"""Every query reconciliation makes of its own (the batches and commits it records go
through ``barriers.repository``)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from metaservice.models import Batch, Commit, Table


def written_table_names(session: Session) -> list[str]:
    """Registered tables that have a writing job, by name."""
    return list(
        session.execute(
            select(Table.name).where(Table.writer_id.is_not(None)).order_by(Table.name)
        ).scalars()
    )


def commits_of_table(
    session: Session, table_id: int
) -> Sequence[Row[int | None, int, int | None, int]]:
    """Every commit recorded for the table: (job id, batch id, snapshot id, barrier); the
    job id is None for a commit of a job since deleted."""
    rows = session.execute(
        select(Commit.job_id, Commit.batch_id, Commit.snapshot_id, Commit.barrier).where(
            Commit.table_id == table_id
        )
    )
    return rows.all()


def previous_committed_barrier(session: Session, job_id: int, batch_id: int) -> int:
    """The largest barrier the job committed with a batch before ``batch_id``, or 0."""
    return session.execute(
        select(func.coalesce(func.max(Batch.barrier), 0)).where(
            Batch.job_id == job_id, Batch.committed.is_(True), Batch.batch_id < batch_id
        )
    ).scalar_one()
