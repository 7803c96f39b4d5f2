"""Every query the console's own endpoint runs."""

from __future__ import annotations

from sqlalchemy import Subquery, func, select, union_all
from sqlalchemy.orm import Session, aliased

from metaservice.barriers.repository.snapshots import snapshot_at_sql
from metaservice.models import Lease, LeaseSnapshot, Table


def _leases_on(table_id: int, now_ms: int) -> Subquery:
    """The table's unexpired leases as (id, barrier, snapshot, created, expires, tables):
    those naming its snapshot, and those of all tables (its snapshot at their barrier;
    they pin every table)."""
    pinned = aliased(LeaseSnapshot)
    width = select(func.count()).select_from(pinned).where(pinned.lease_id == Lease.id)
    named = (
        select(
            Lease.id,
            Lease.barrier,
            LeaseSnapshot.snapshot_id,
            Lease.created_ms,
            Lease.expires_ms,
            width.scalar_subquery().label("tables"),
        )
        .join(LeaseSnapshot, LeaseSnapshot.lease_id == Lease.id)
        .where(LeaseSnapshot.table_id == table_id, Lease.expires_ms > now_ms)
    )
    every = select(
        Lease.id,
        Lease.barrier,
        snapshot_at_sql(table_id, Lease.barrier).correlate(Lease).scalar_subquery(),
        Lease.created_ms,
        Lease.expires_ms,
        select(func.count()).select_from(Table).scalar_subquery(),
    ).where(Lease.all_tables, Lease.expires_ms > now_ms)
    return union_all(named, every).subquery()


def count_live_leases(session: Session, table_id: int, now_ms: int) -> int:
    leases = _leases_on(table_id, now_ms)
    return session.execute(select(func.count()).select_from(leases)).scalar_one()


def live_leases(
    session: Session, table_id: int, now_ms: int, limit: int, offset: int
) -> list[tuple[str, int, int | None, int, int, int]]:
    """(lease id, barrier, the table's pinned snapshot, created, expires, tables pinned)
    of the table's unexpired leases, soonest to expire first."""
    leases = _leases_on(table_id, now_ms)
    rows = session.execute(
        select(leases).order_by(leases.c.expires_ms, leases.c.id).limit(limit).offset(offset)
    )
    return [tuple(row) for row in rows]
