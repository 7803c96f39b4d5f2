"""Every query of the Iceberg REST catalog: its sessions and the tables they read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from metaservice.models import (
    DERIVED,
    CatalogSession,
    CatalogSessionTable,
    Job,
    Lease,
    LeaseSnapshot,
    Revision,
    RevisionTable,
    Table,
)
from metaservice.models.revisions import ACTIVE, SWAPPED


@dataclass(frozen=True)
class SessionRow:
    lease_id: str
    warehouse: str
    barrier: int
    expires_ms: int


@dataclass(frozen=True)
class SessionTable:
    """A table of a session: the name it is read under, the table it is (``current``
    is that table's name now: another after a swap), and its snapshot at the version
    (None: the table was still empty there)."""

    name: str
    table_id: int
    current: str
    snapshot_id: int | None
    expiry_horizon: int | None


def readable_tables(session: Session) -> list[str]:
    """Names of the tables a ``consistent`` or ``at:`` session reads: every table with a
    writer, but those of derived jobs that never committed (they have no exact barrier
    yet, so no version could hold them), the mirrors of revisions not yet swapped in
    (they are being rewritten) and the tables swapped out (their writers have stopped,
    so their frontiers would hold every version back)."""
    mirrors = (
        select(RevisionTable.mirror)
        .join(Revision, Revision.id == RevisionTable.revision_id)
        .where(Revision.state.in_(ACTIVE))
    )
    replaced = (
        select(RevisionTable.table_id)
        .join(Revision, Revision.id == RevisionTable.revision_id)
        .where(Revision.state == SWAPPED)
    )
    rows = session.execute(
        select(Table.name)
        .join(Job, Job.id == Table.writer_id)
        .where(
            (Job.kind != DERIVED) | Job.last_barrier.is_not(None),
            Table.name.not_in(mirrors),
            Table.id.not_in(replaced),
        )
        .order_by(Table.name)
    )
    return list(rows.scalars())


def add_session(
    session: Session, lease_id: str, warehouse: str, tables: Mapping[str, int], now_ms: int
) -> None:
    session.add(CatalogSession(lease_id=lease_id, warehouse=warehouse, created_ms=now_ms))
    session.flush()
    rows = [{"lease_id": lease_id, "name": n, "table_id": t} for n, t in tables.items()]
    if rows:  # one statement for all the session's tables
        session.execute(insert(CatalogSessionTable), rows)


def session_row(session: Session, lease_id: str) -> SessionRow | None:
    row = session.execute(
        select(CatalogSession.lease_id, CatalogSession.warehouse, Lease.barrier, Lease.expires_ms)
        .join(Lease, Lease.id == CatalogSession.lease_id)
        .where(CatalogSession.lease_id == lease_id)
    ).one_or_none()
    return None if row is None else SessionRow(*row)


def session_tables(session: Session, lease_id: str, name: str | None = None) -> list[SessionTable]:
    """The session's tables (or the one read as ``name``), by name."""
    query = (
        select(
            CatalogSessionTable.name,
            CatalogSessionTable.table_id,
            Table.name,
            LeaseSnapshot.snapshot_id,
            Table.expiry_horizon,
        )
        .join(Table, Table.id == CatalogSessionTable.table_id)
        .join(
            LeaseSnapshot,
            (LeaseSnapshot.lease_id == CatalogSessionTable.lease_id)
            & (LeaseSnapshot.table_id == CatalogSessionTable.table_id),
        )
        .where(CatalogSessionTable.lease_id == lease_id)
        .order_by(CatalogSessionTable.name)
    )
    if name is not None:
        query = query.where(CatalogSessionTable.name == name)
    return [SessionTable(*row) for row in session.execute(query)]


def extend_lease(session: Session, lease_id: str, now_ms: int, expires_ms: int) -> bool:
    """Move a live lease's end to ``expires_ms``; False when it had ended already."""
    result = session.execute(
        update(Lease)
        .where(Lease.id == lease_id, Lease.expires_ms > now_ms)
        .values(expires_ms=expires_ms)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]
