"""Queries about the tables of a version and their writers, leases, and the table
locks that order leases against expiry."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from metaservice.models import Job, Lease, LeaseSnapshot, Table
from metaservice.topology.repository import storable

_TABLES_WITH_WRITERS = (
    select(Table, Job)
    .outerjoin(Job, Job.id == Table.writer_id)
    .where(Table.name.in_(bindparam("names", expanding=True)))
)


def tables_with_writers(session: Session, names: Sequence[str]) -> list[tuple[Table, Job | None]]:
    """The named tables that exist, each with its writing job (None if it has none), in
    one statement: a consistent-version request reads them in each of its transactions."""
    names = [n for n in names if storable(n)]
    if not names:
        return []
    return [(t, j) for t, j in session.execute(_TABLES_WITH_WRITERS, {"names": names})]


def lock_tables(session: Session, table_ids: Sequence[int], *, exclusive: bool) -> list[Table]:
    """The table rows, locked for the rest of the transaction and read afresh.

    G5's lock: granting a lease takes them shared (leases never wait for each other),
    reserving an expiry takes its table exclusive, so each sees what the other committed
    (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers). Exclusive is
    FOR NO KEY UPDATE: commit reports, whose foreign keys take FOR KEY SHARE on the
    table, never wait for a reservation. Id order: two requests locking overlapping
    sets never deadlock.
    """
    if not table_ids:
        return []
    return list(
        session.execute(
            select(Table)
            .where(Table.id.in_(sorted(set(table_ids))))
            .order_by(Table.id)
            .with_for_update(read=not exclusive, key_share=exclusive)
            .execution_options(populate_existing=True)
        ).scalars()
    )


def live_lease_snapshots(
    session: Session, table_id: int, now_ms: int
) -> list[tuple[str, int, int | None]]:
    """(lease id, expiry, snapshot) of every unexpired lease on the table."""
    rows = session.execute(
        select(Lease.id, Lease.expires_ms, LeaseSnapshot.snapshot_id)
        .join(LeaseSnapshot, LeaseSnapshot.lease_id == Lease.id)
        .where(LeaseSnapshot.table_id == table_id, Lease.expires_ms > now_ms)
        .order_by(Lease.expires_ms, Lease.id)
    )
    return list(rows)
