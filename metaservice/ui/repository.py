"""Every query the console's own endpoint runs."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from metaservice.models import Lease, LeaseSnapshot


def count_live_leases(session: Session, table_id: int, now_ms: int) -> int:
    return session.execute(
        select(func.count())
        .select_from(LeaseSnapshot)
        .join(Lease, Lease.id == LeaseSnapshot.lease_id)
        .where(LeaseSnapshot.table_id == table_id, Lease.expires_ms > now_ms)
    ).scalar_one()


def live_leases(
    session: Session, table_id: int, now_ms: int, limit: int, offset: int
) -> list[tuple[Lease, int | None, int]]:
    """(lease, the table's pinned snapshot, tables pinned) of the table's unexpired
    leases, soonest to expire first."""
    pinned = aliased(LeaseSnapshot)
    width = (
        select(func.count())
        .select_from(pinned)
        .where(pinned.lease_id == Lease.id)
        .scalar_subquery()
    )
    rows = session.execute(
        select(Lease, LeaseSnapshot.snapshot_id, width)
        .join(LeaseSnapshot, LeaseSnapshot.lease_id == Lease.id)
        .where(LeaseSnapshot.table_id == table_id, Lease.expires_ms > now_ms)
        .order_by(Lease.expires_ms, Lease.id)
        .limit(limit)
        .offset(offset)
    )
    return [(lease, snapshot, tables) for lease, snapshot, tables in rows]
