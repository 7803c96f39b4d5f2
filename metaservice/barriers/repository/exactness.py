"""Where a table is exact: its writer's committed barriers, the barriers its former
derived writers committed while they wrote it, and every barrier up to where source
jobs wrote it (DESIGN.md, "Exactness"; a table's exactness outlives its writer)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import insert, literal, select
from sqlalchemy.orm import Session

from metaservice.models import Batch, Table, TableExactBarrier
from metaservice.sql import one_of


def latest_exact_at_or_before(
    session: Session, table_ids: Sequence[int], barrier: int
) -> dict[int, int]:
    """The largest barrier at or below ``barrier`` each table is exact at, as its writer
    is a derived job (tables exact at none are left out), in one statement: a backward
    index seek per table into its writer's committed batches and one into its former
    writers' barriers, so the cost does not grow with the history.

    A table taken over keeps what its former writers answered for: the new derived
    writer starts above their history (``topology.service._take_over``), so the barriers
    at or below the hand-over are the former writers', and those above are its own."""
    if not table_ids:
        return {}
    by_writer = (
        select(Batch.barrier)
        .where(Batch.job_id == Table.writer_id, Batch.committed.is_(True), Batch.barrier <= barrier)
        .order_by(Batch.barrier.desc())
        .limit(1)
        .correlate(Table)
        .scalar_subquery()
    )
    by_former = (
        select(TableExactBarrier.barrier)
        .where(TableExactBarrier.table_id == Table.id, TableExactBarrier.barrier <= barrier)
        .order_by(TableExactBarrier.barrier.desc())
        .limit(1)
        .correlate(Table)
        .scalar_subquery()
    )
    rows = session.execute(
        select(Table.id, by_writer, by_former, Table.source_until).where(
            one_of(Table.id, list(table_ids))
        )
    )
    found: dict[int, int] = {}
    for table_id, own, former, source_until in rows:
        sourced = min(source_until, barrier) if source_until is not None else None
        candidates = [b for b in (own, former, sourced) if b is not None]
        if candidates:
            found[table_id] = max(candidates)
    return found


def keep_exact_barriers(
    session: Session, job_id: int, table_ids: Sequence[int], above: int, up_to: int
) -> None:
    """The derived job hands the tables over: the barriers it committed in
    (``above``, ``up_to``] become theirs (one statement per table). ``above``: the
    tables' former hand-over (the job's batches at or below it were not theirs)."""
    for table_id in table_ids:
        committed = select(literal(table_id), Batch.barrier).where(
            Batch.job_id == job_id,
            Batch.committed.is_(True),
            Batch.barrier > above,
            Batch.barrier <= up_to,
        )
        session.execute(
            insert(TableExactBarrier).from_select(["table_id", "barrier"], committed.distinct())
        )
