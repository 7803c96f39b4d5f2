"""Queries about the tables of a version and their writers, leases, and the locks that
order leases against expiry: the tables' row locks (a lease of named snapshots takes its
tables' shared, an expiry reservation its table's exclusive) and, for leases of all
tables, the pins lock (:func:`hold_pins_lock`)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from metaservice.barriers import watermark
from metaservice.barriers.repository import snapshots
from metaservice.models import Job, Lease, LeaseSnapshot, Table
from metaservice.sql import one_of
from metaservice.topology.repository import storable

_TABLES_WITH_WRITERS = (
    select(Table, Job)
    .outerjoin(Job, Job.id == Table.writer_id)
    .where(one_of(Table.name, bindparam("names", expanding=True)))
)


def tables_with_writers(session: Session, names: Sequence[str]) -> list[tuple[Table, Job | None]]:
    """The named tables that exist, each with its writing job (None if it has none), in
    one statement: a consistent-version request reads them in each of its transactions."""
    names = [n for n in names if storable(n)]
    if not names:
        return []
    return [(t, j) for t, j in session.execute(_TABLES_WITH_WRITERS, {"names": names})]


def writers_serialised(session: Session) -> bool:
    """Whether a write transaction holds every other writer off from its start (SQLite's
    BEGIN IMMEDIATE): what it read earlier is still so when it commits."""
    return session.get_bind().dialect.name == "sqlite"


def hold_pins_lock(session: Session, *, exclusive: bool) -> None:
    """G5's lock for leases of all tables, to the end of the transaction (PostgreSQL;
    SQLite's BEGIN IMMEDIATE already serialises writers).

    A lease of all tables pins a snapshot of every table, so locking their rows would
    cost a row lock per table (1,000 for a catalog session on 1,000 tables). It takes
    this one lock shared instead, and an expiry reservation takes it exclusive before
    its table's row: each sees what the other committed. Lease grants never wait for
    each other; a reservation waits for the grants in flight (each one short), and
    they for it. The holder of the shared lock takes no row lock after it, so the two
    locks never wait on each other in a circle."""
    watermark.hold_xact_lock(session, watermark.PINS_LOCK, exclusive=exclusive)


def table_ids_by_names(session: Session, names: Sequence[str]) -> dict[str, int]:
    """The named tables' ids, by name (plain rows: no ORM object per table)."""
    names = [n for n in names if storable(n)]
    if not names:
        return {}
    rows = session.execute(select(Table.name, Table.id).where(one_of(Table.name, names)))
    return {name: table_id for name, table_id in rows}


def fresh_tables_by_names(session: Session, names: Sequence[str]) -> dict[str, Table]:
    """The named tables that exist, read afresh (no lock): their horizons as this
    statement sees them, not as an earlier one of the transaction loaded them."""
    names = [n for n in names if storable(n)]
    if not names:
        return {}
    rows = session.execute(
        select(Table).where(one_of(Table.name, names)).execution_options(populate_existing=True)
    ).scalars()
    return {t.name: t for t in rows}


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
            .where(one_of(Table.id, sorted(set(table_ids))))
            .order_by(Table.id)
            .with_for_update(read=not exclusive, key_share=exclusive)
            .execution_options(populate_existing=True)
        ).scalars()
    )


def live_lease_snapshots(
    session: Session, table_id: int, now_ms: int
) -> list[tuple[str, int, int | None]]:
    """(lease id, expiry, snapshot) of every unexpired lease on the table: those naming
    its snapshot, and those of all tables, which pin its snapshot at their barrier."""
    named = session.execute(
        select(Lease.id, Lease.expires_ms, LeaseSnapshot.snapshot_id)
        .join(LeaseSnapshot, LeaseSnapshot.lease_id == Lease.id)
        .where(LeaseSnapshot.table_id == table_id, Lease.expires_ms > now_ms)
        .order_by(Lease.expires_ms, Lease.id)
    )
    pins = [(i, e, s) for i, e, s in named]
    every = session.execute(
        select(Lease.id, Lease.expires_ms, Lease.barrier)
        .where(Lease.all_tables, Lease.expires_ms > now_ms)
        .order_by(Lease.expires_ms, Lease.id)
    ).all()
    if every:
        barriers = sorted({barrier for _, _, barrier in every})
        found = snapshots.snapshots_at_barriers(session, [table_id], barriers)
        at = {b: f.get(table_id) for b, f in zip(barriers, found, strict=True)}
        pins += [(i, e, at[b]) for i, e, b in every]
    return pins
