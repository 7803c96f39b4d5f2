"""Queries of the expiry plan: the reported snapshots of a table, and its expiry horizon."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from metaservice.models import Commit, Table


class Reported(NamedTuple):
    """A reported snapshot of the table (batches that wrote no rows have none)."""

    snapshot_id: int
    barrier: int
    batch_id: int
    created_ms: int


def reported_snapshots(session: Session, table_id: int) -> list[Reported]:
    """The table's snapshots, oldest first (by barrier, then batch)."""
    return [
        Reported(snapshot_id or 0, barrier, batch_id, created_ms)  # filtered: never null
        for snapshot_id, barrier, batch_id, created_ms in session.execute(
            select(Commit.snapshot_id, Commit.barrier, Commit.batch_id, Commit.created_ms)
            .where(Commit.table_id == table_id, Commit.snapshot_id.is_not(None))
            .order_by(Commit.barrier, Commit.batch_id)
        )
    ]


def raise_expiry_horizon(session: Session, table_id: int, barrier: int) -> None:
    """Move the table's horizon up to ``barrier``; it never moves down."""
    session.execute(
        update(Table)
        .where(
            Table.id == table_id,
            Table.expiry_horizon.is_(None) | (Table.expiry_horizon < barrier),
        )
        .values(expiry_horizon=barrier)
        .execution_options(synchronize_session="fetch")
    )
