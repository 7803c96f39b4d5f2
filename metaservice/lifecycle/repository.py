"""Queries of snapshot lifecycle: the reported snapshots of a table not yet expired, its
expiry horizon, the record of what was expired, and its retention policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from metaservice.models import Commit, ExpiredSnapshot, Table, TableRetention


class Reported(NamedTuple):
    """A reported snapshot of the table (batches that wrote no rows have none)."""

    snapshot_id: int
    barrier: int
    batch_id: int
    created_ms: int


def reported_snapshots(session: Session, table_id: int) -> list[Reported]:
    """The table's snapshots that no expiry removed, oldest first (by barrier, then batch)."""
    expired = exists().where(
        ExpiredSnapshot.table_id == Commit.table_id,
        ExpiredSnapshot.snapshot_id == Commit.snapshot_id,
    )
    return [
        Reported(snapshot_id or 0, barrier, batch_id, created_ms)  # filtered: never null
        for snapshot_id, barrier, batch_id, created_ms in session.execute(
            select(Commit.snapshot_id, Commit.barrier, Commit.batch_id, Commit.created_ms)
            .where(Commit.table_id == table_id, Commit.snapshot_id.is_not(None), ~expired)
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


def record_expired(
    session: Session, table_id: int, snapshots: Sequence[Reported], now_ms: int
) -> None:
    """Record ``snapshots`` as expired; those recorded already (by an overlapping run)
    keep their first record."""
    ids = [s.snapshot_id for s in snapshots]
    known = set(
        session.scalars(
            select(ExpiredSnapshot.snapshot_id).where(
                ExpiredSnapshot.table_id == table_id, ExpiredSnapshot.snapshot_id.in_(ids)
            )
        )
    )
    session.add_all(
        ExpiredSnapshot(
            table_id=table_id,
            snapshot_id=s.snapshot_id,
            barrier=s.barrier,
            batch_id=s.batch_id,
            expired_ms=now_ms,
        )
        for s in snapshots
        if s.snapshot_id not in known
    )
    session.flush()


def tables_with_snapshots(session: Session) -> list[str]:
    """Names of the tables with at least one reported snapshot, sorted."""
    return list(
        session.scalars(
            select(Table.name)
            .where(exists().where(Commit.table_id == Table.id, Commit.snapshot_id.is_not(None)))
            .order_by(Table.name)
        )
    )


def retention(session: Session, table_id: int) -> TableRetention | None:
    return session.get(TableRetention, table_id)


def set_retention(
    session: Session,
    table_id: int,
    keep_last: int | None,
    keep_for_seconds: int | None,
    now_ms: int,
) -> None:
    row = session.get(TableRetention, table_id)
    if row is None:
        row = TableRetention(table_id=table_id)
        session.add(row)
    row.keep_last = keep_last
    row.keep_for_seconds = keep_for_seconds
    row.updated_ms = now_ms
    session.flush()


def delete_retention(session: Session, table_id: int) -> bool:
    """Remove the table's own policy; False when it had none."""
    row = session.get(TableRetention, table_id)
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True
