"""The barrier-to-snapshot mapping: a table's snapshot at a barrier, many tables' at
several barriers in one statement, and each table's newest snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import ColumnElement, ScalarSelect, Select, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from metaservice.models import Commit, Table
from metaservice.sql import one_of


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
            one_of(Table.id, table_ids)
        )
    ).all()
    return [{row[0]: row[1 + i] for row in rows} for i in range(len(barriers))]


def _snapshot_at(barrier: int) -> ScalarSelect[int | None]:
    """SQL for the snapshot of the table of the enclosing query at ``barrier``."""
    return snapshot_at_sql(Table.id, barrier).correlate(Table).scalar_subquery()


def snapshot_at_sql(
    table_id: int | ColumnElement[int] | InstrumentedAttribute[int],
    barrier: int | ColumnElement[int] | InstrumentedAttribute[int],
) -> Select[int | None]:
    """The query for a table's snapshot at a barrier (each may be a column of the
    enclosing query: correlate and make it a scalar subquery there)."""
    return (
        select(Commit.snapshot_id)
        .where(
            Commit.table_id == table_id,
            Commit.snapshot_id.is_not(None),
            Commit.barrier <= barrier,
        )
        .order_by(Commit.barrier.desc(), Commit.batch_id.desc())
        .limit(1)
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
    page = select(newest.label("commit_id")).where(one_of(Table.id, table_ids)).subquery()
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
