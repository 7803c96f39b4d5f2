"""The consistent version of a set of tables: the largest barrier at which every
table is complete and exact, with each table's snapshot at that barrier.

G5: a table's ``expiry_horizon`` is the barrier below which its snapshots may have
been expired (``lifecycle.service.reserve_expiry`` raises it). A version whose
barrier is below a member's horizon would name a snapshot that may be gone, so it is
refused (409 ``expired``) rather than handed out; a table that was still empty at
the barrier names no snapshot and is no obstacle. A lease checks the horizon again
under the tables' row locks, which a reservation takes exclusively: a lease is
either in the reservation's plan, or sees the raised horizon.

**Reads that never write.** A consistent version is read in one read transaction:
the members' writers, their frontiers (an idle source's from the watermark S on the
clock row, in the statement that reads its row: no seal), the common exact barrier
and the snapshots. Idle derived jobs are advanced by the per-slot advancer, not by
readers. Why that keeps G1 (consistent, never going back, across replicas whose
clocks differ) and G2 (one slot beyond the bound of a reader that wrote, at most)
is in :mod:`metaservice.barriers.watermark`. Only where no advancer runs
(``settings.idle_advance`` ``readers``: tests on a ManualClock) does a read whose
writers could move take the write step first (:func:`seal_writers`). A lease writes
its own rows, nothing else.
"""

from __future__ import annotations

import uuid

from sqlalchemy import insert
from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.barriers import service as barrier_service
from metaservice.barriers import watermark
from metaservice.context import Context
from metaservice.contract import slot_of
from metaservice.errors import Conflict, Invalid, NotFound, TooLarge
from metaservice.models import DERIVED, Job, Lease, LeaseSnapshot, Table
from metaservice.names import check_table_name
from metaservice.topology import repository as topo
from metaservice.versions import repository as repo
from metaservice.versions.schemas import ConsistentVersion


def parse_tables(ctx: Context, tables: list[str]) -> list[str]:
    names = [t.strip() for t in tables if t.strip()]
    if not names:
        raise Invalid("name at least one table, e.g. tables=dwd.order_detail", field="tables")
    if len(names) > ctx.settings.max_tables_per_query:
        raise TooLarge(
            f"{len(names)} tables asked; at most {ctx.settings.max_tables_per_query} per query",
            field="tables",
        )
    for name in names:
        check_table_name(name, field="tables")
    return sorted(set(names))


def writers_of(session: Session, names: list[str]) -> tuple[dict[str, Table], dict[int, Job]]:
    found = repo.tables_with_writers(session, names)
    tables = {t.name: t for t, _ in found}
    for name in names:
        if name not in tables:
            raise NotFound(
                f"table '{name}' is unknown: no registered job reads or writes it", field="tables"
            )
        if tables[name].writer_id is None:
            raise Conflict(
                f"table '{name}' has no writing job, so it has no frontier",
                field="tables",
                code="no_writer",
            )
    return tables, {j.id: j for _, j in found if j is not None}


def seal_writers(session: Session, ctx: Context, names: list[str]) -> None:
    """The write step before a read, only where readers catch up (no advancer runs:
    ``ctx.readers_catch_up``): raise the watermark to this replica's closed slot, then
    advance the idle derived writers (and their idle upstream). Nothing otherwise."""
    if not ctx.readers_catch_up:
        return
    watermark.raise_to_closed_slot(session, ctx)
    _, jobs = writers_of(session, names)
    barrier_service.advance_idle_many(session, ctx, list(jobs.values()), seal=False)


def version_unless_sealing(
    session: Session, ctx: Context, names: list[str], at_or_before: int | None = None
) -> ConsistentVersion | None:
    """The consistent version, read without writing; None only where readers catch up
    (``ctx.readers_catch_up``) and one would: the watermark is behind this replica's
    closed slot and a writer is a source, or an idle derived writer could move. Then
    :func:`seal_writers` in a write transaction, and :func:`consistent_version` after it.

    Deciding and answering in one read transaction: the answer is the one a read right
    after this decision would give (its snapshot is the decision's own), so a request
    that needs no write costs one transaction."""
    tables, jobs = writers_of(session, names)
    writers = list(jobs.values())
    fronts, found = fr.frontiers_and_watermark(session, ctx, writers)
    if ctx.readers_catch_up and (
        (found is not None and watermark.is_stale(ctx, found))
        or barrier_service.could_advance(session, ctx, writers)
    ):
        return None
    return _version_of(session, ctx, names, tables, jobs, at_or_before, fronts)


def consistent_version(
    session: Session, ctx: Context, names: list[str], at_or_before: int | None = None
) -> ConsistentVersion:
    tables, jobs = writers_of(session, names)
    return _version_of(session, ctx, names, tables, jobs, at_or_before)


def _version_of(
    session: Session,
    ctx: Context,
    names: list[str],
    tables: dict[str, Table],
    jobs: dict[int, Job],
    at_or_before: int | None,
    fronts: dict[int, int] | None = None,
) -> ConsistentVersion:
    if fronts is None:
        fronts = fr.frontiers(session, ctx, list(jobs.values()))
    limit = min(fronts.values())
    if at_or_before is not None:
        # the largest barrier at or before it: barriers lie on the clock's grid
        limit = min(limit, slot_of(at_or_before, ctx.interval))
    # the tables' exactness, which outlives a writer (every table here has one: writers_of)
    derived = sorted(
        t.id
        for t in tables.values()
        if t.writer_id is not None and jobs[t.writer_id].kind == DERIVED
    )
    barrier = _common_exact_barrier(session, derived, limit)
    if barrier is None or barrier <= 0:
        raise Conflict(
            "no consistent version of "
            + ", ".join(names)
            + (f" at or before {at_or_before}" if at_or_before is not None else "")
            + " exists yet: some table has not committed a barrier that the others reached; "
            "retry once the jobs have made progress",
            field="tables",
            code="no_consistent_version",
        )
    # One statement for all tables: a query per table made 50 tables cost 50 round trips.
    found = barrier_repo.snapshots_at(session, [t.id for t in tables.values()], barrier)
    snapshots = {name: found[tables[name].id] for name in names}
    version = ConsistentVersion(barrier=barrier, snapshots=snapshots)
    _check_horizons(version, tables, "at_or_before" if at_or_before is not None else "tables")
    return version


def may_be_expired(barrier: int, snapshot: int | None, horizon: int | None) -> bool:
    """Whether a table's ``snapshot`` at ``barrier`` may have been expired: it is below
    the table's expiry horizon (a table empty at the barrier names none, and is fine)."""
    return snapshot is not None and horizon is not None and barrier < horizon


def _check_horizons(version: ConsistentVersion, tables: dict[str, Table], field: str) -> None:
    """409 ``expired`` when the version names a snapshot below a table's expiry horizon."""
    for name, snapshot in sorted(version.snapshots.items()):
        horizon = tables[name].expiry_horizon
        if not may_be_expired(version.barrier, snapshot, horizon):
            continue
        raise Conflict(
            f"the consistent version at barrier {version.barrier} needs snapshot {snapshot} "
            f"of '{name}', which may have been expired: snapshots of '{name}' older than "
            f"its snapshot at barrier {horizon} (its expiry horizon) are not handed out. "
            f"Ask for a version at or after barrier {horizon} (the latest one gets there "
            "once every table has), and take a lease (lease_seconds) on a version you "
            "need to keep",
            field=field,
            code="expired",
        )


def _common_exact_barrier(session: Session, derived_tables: list[int], limit: int) -> int | None:
    """Largest barrier <= limit that every table a derived job writes is exact at (tables
    of source jobs are exact everywhere). Exactness is the table's, not its writer's: a
    table taken over keeps the barriers its former writers made it exact at, so the
    versions handed out for it are answered again after the hand-over.

    Each round lowers the candidate to the smallest of the tables' latest exact barriers
    at or below it; it stops when they all agree. Converges in a few indexed queries.
    """
    candidate = limit
    while derived_tables:
        latest = barrier_repo.latest_exact_at_or_before(session, derived_tables, candidate)
        if len(latest) < len(derived_tables):
            return None
        lowest = min(latest.values())
        if all(b == lowest for b in latest.values()):
            return lowest
        candidate = lowest
    return candidate


def lease_version(
    session: Session, ctx: Context, names: list[str], at_or_before: int | None, seconds: int
) -> ConsistentVersion:
    """The consistent version of the tables, pinned by a new lease (a write transaction
    that writes the lease's rows, and only where readers catch up the write step)."""
    seal_writers(session, ctx, names)
    version = consistent_version(session, ctx, names, at_or_before)
    return create_lease(session, ctx, version, seconds)


def create_lease(
    session: Session, ctx: Context, version: ConsistentVersion, seconds: int
) -> ConsistentVersion:
    """Pin ``version``'s snapshots; 409 ``expired`` if an expiry was reserved below it.

    Takes the tables' row locks (shared) before checking their horizons, so an expiry
    reserved concurrently either sees this lease or makes it fail here."""
    return create_lease_of_tables(session, ctx, version, seconds)[0]


def create_lease_of_tables(
    session: Session, ctx: Context, version: ConsistentVersion, seconds: int
) -> tuple[ConsistentVersion, dict[str, Table]]:
    """:func:`create_lease`, and the version's tables by name as it locked them (a
    catalog session records their ids without looking 1,000 names up again)."""
    _check_lease_seconds(ctx, seconds)
    tables = lock_version(session, version)
    lease = _add_lease(session, ctx, version, seconds, all_tables=False)
    rows = [
        {"lease_id": lease.id, "table_id": tables[name].id, "snapshot_id": snapshot}
        for name, snapshot in version.snapshots.items()
    ]
    if rows:  # one statement for all tables
        session.execute(insert(LeaseSnapshot), rows)
    return _leased(version, lease), tables


def create_lease_of_all_tables(
    session: Session, ctx: Context, version: ConsistentVersion, seconds: int
) -> tuple[ConsistentVersion, dict[str, int]]:
    """Pin ``version`` with one lease row whatever its table count: a lease of all tables,
    which keeps on every table the snapshot at its barrier. So ``version`` must be a
    consistent version (each snapshot its table's at the barrier, as
    :func:`consistent_version` answers), not a tag's, read in this transaction;
    :func:`check_version` refuses one a swap changed or an expiry passed meanwhile. Takes
    the pins lock shared, not the tables' rows (see ``repository.hold_pins_lock``);
    returns the tables' ids by name."""
    _check_lease_seconds(ctx, seconds)
    if repo.writers_serialised(session):
        # No swap or expiry reservation has committed since this transaction read the
        # version, and that read checked the horizons: only the ids are wanted.
        ids = repo.table_ids_by_names(session, list(version.snapshots))
    else:
        repo.hold_pins_lock(session, exclusive=False)
        checked = check_version(session, version, lock_rows=False)
        ids = {name: t.id for name, t in checked.items()}
    lease = _add_lease(session, ctx, version, seconds, all_tables=True)
    return _leased(version, lease), ids


def _check_lease_seconds(ctx: Context, seconds: int) -> None:
    if seconds > ctx.settings.max_lease_seconds:
        raise Invalid(
            f"lease of {seconds} s is longer than the {ctx.settings.max_lease_seconds} s allowed",
            field="lease_seconds",
        )


def _add_lease(
    session: Session, ctx: Context, version: ConsistentVersion, seconds: int, *, all_tables: bool
) -> Lease:
    now = ctx.now_ms()
    lease = Lease(
        id=str(uuid.uuid4()),
        barrier=version.barrier,
        created_ms=now,
        expires_ms=now + seconds * 1000,
        all_tables=all_tables,
    )
    session.add(lease)
    session.flush()
    return lease


def _leased(version: ConsistentVersion, lease: Lease) -> ConsistentVersion:
    return version.model_copy(update={"lease_id": lease.id, "lease_expires_ms": lease.expires_ms})


def lock_version(session: Session, version: ConsistentVersion) -> dict[str, Table]:
    """Lock ``version``'s tables (shared, as every lease grant of named snapshots does)
    and check it (:func:`check_version`); returns the locked tables by name.

    Whatever pins the version in the same transaction (a lease, a tag) is then either in
    a concurrent expiry reservation's plan, or refused here."""
    return check_version(session, version, lock_rows=True)


def check_version(
    session: Session, version: ConsistentVersion, *, lock_rows: bool
) -> dict[str, Table]:
    """``version``'s tables by name, read afresh (and locked shared with ``lock_rows``),
    checked against a swap since the version was found (409 ``version_changed``) and
    against their expiry horizons (409 ``expired``). Without ``lock_rows`` the caller
    holds the pins lock, which orders it against expiry reservations instead."""
    if lock_rows:
        names = topo.tables_by_names(session, list(version.snapshots))
        locked = repo.lock_tables(session, [t.id for t in names.values()], exclusive=False)
        tables = {t.name: t for t in locked}
    else:
        tables = repo.fresh_tables_by_names(session, list(version.snapshots))
    for name in version.snapshots:
        if name not in tables:
            raise NotFound(f"table '{name}' was deleted while this request ran", field="tables")
    # A revision's swap gives names to other tables: one that committed between finding
    # the version and here would pin the old tables' snapshots in the new ones.
    found = barrier_repo.snapshots_at(session, [t.id for t in tables.values()], version.barrier)
    for name, snapshot in version.snapshots.items():
        if found[tables[name].id] != snapshot:
            raise Conflict(
                f"table '{name}' changed while this request ran (a revision was swapped "
                "in): nothing was pinned. Ask again",
                field="tables",
                code="version_changed",
            )
    _check_horizons(version, tables, "tables")
    return tables


def delete_lease(session: Session, lease_id: str) -> None:
    lease = session.get(Lease, lease_id) if topo.storable(lease_id) else None
    if lease is None:
        raise NotFound(
            f"lease '{lease_id}' does not exist (it may have ended already)", field="lease_id"
        )
    session.delete(lease)
    session.flush()
