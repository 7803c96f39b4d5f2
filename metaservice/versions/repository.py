"""Queries about leases."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from metaservice.models import Lease, LeaseSnapshot


def live_lease_snapshots(
    session: Session, table_id: int, now_ms: int
) -> list[tuple[str, int, int | None]]:
    """(lease id, expiry, snapshot) of every unexpired lease on the table."""
    rows = session.execute(
        select(Lease.id, Lease.expires_ms, LeaseSnapshot.snapshot_id)
        .join(LeaseSnapshot, LeaseSnapshot.lease_id == Lease.id)
        .where(LeaseSnapshot.table_id == table_id, Lease.expires_ms > now_ms)
    )
    return list(rows)
