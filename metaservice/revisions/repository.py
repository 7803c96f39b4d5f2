"""Queries of revisions: the records, their affected tables, the active ones on a table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import bindparam, column, delete, func, select, table, update
from sqlalchemy.orm import Session, aliased

from metaservice.models import (
    Batch,
    Commit,
    ExpiredSnapshot,
    Job,
    JobInput,
    LeaseSnapshot,
    Revision,
    RevisionTable,
    Table,
    TableExactBarrier,
    TableRetention,
    VersionTagSnapshot,
)
from metaservice.models.revisions import ACTIVE, FREEZING, SWAPPED


class Affected(NamedTuple):
    """One affected table of a revision, as recorded."""

    table_id: int
    table: str
    mirror: str
    start_snapshot_id: int | None
    writer: str
    frontier: int


class Kept(NamedTuple):
    """The start snapshot an active revision keeps in one table."""

    revision_id: int
    snapshot_id: int


def insert(
    session: Session,
    table_id: int,
    from_barrier: int,
    state: str,
    now_ms: int,
) -> Revision:
    revision = Revision(
        table_id=table_id,
        from_barrier=from_barrier,
        state=state,
        created_ms=now_ms,
        updated_ms=now_ms,
    )
    session.add(revision)
    session.flush()
    return revision


def add_tables(session: Session, revision_id: int, tables: Sequence[Affected]) -> None:
    session.add_all(
        RevisionTable(
            revision_id=revision_id,
            table_id=t.table_id,
            mirror=t.mirror,
            start_snapshot_id=t.start_snapshot_id,
            writer=t.writer,
            frontier=t.frontier,
        )
        for t in tables
    )
    session.flush()


def get(session: Session, revision_id: int) -> Revision | None:
    return session.get(Revision, revision_id)


def lock(session: Session, revision_id: int) -> Revision | None:
    """The revision's row, locked for the rest of the transaction and read afresh (two
    swaps, or a swap and a cancel, of one revision run one after the other)."""
    return session.execute(
        select(Revision)
        .where(Revision.id == revision_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def set_state(
    session: Session, revision_id: int, state: str, now_ms: int, *, only_from: Sequence[str]
) -> bool:
    """Move the revision to ``state`` if it is in one of ``only_from``; False otherwise."""
    done = session.execute(
        update(Revision)
        .where(Revision.id == revision_id, Revision.state.in_(only_from))
        .values(state=state, updated_ms=now_ms)
        .execution_options(synchronize_session=False)
    )
    return bool(done.rowcount)  # type: ignore[attr-defined]


def delete_revision(session: Session, revision_id: int) -> None:
    """The revision's record and its affected tables (spelled out rather than left to
    ON DELETE CASCADE, so it does not depend on SQLite's foreign_keys pragma)."""
    session.execute(delete(RevisionTable).where(RevisionTable.revision_id == revision_id))
    session.execute(delete(Revision).where(Revision.id == revision_id))


def tables_of(session: Session, revision_ids: Sequence[int]) -> dict[int, list[Affected]]:
    """The affected tables of each revision, by table name."""
    found: dict[int, list[Affected]] = {r: [] for r in revision_ids}
    if not revision_ids:
        return found
    rows = session.execute(
        select(
            RevisionTable.revision_id,
            RevisionTable.table_id,
            Table.name,
            RevisionTable.mirror,
            RevisionTable.start_snapshot_id,
            RevisionTable.writer,
            RevisionTable.frontier,
        )
        .join(Table, Table.id == RevisionTable.table_id)
        .where(RevisionTable.revision_id.in_(revision_ids))
        .order_by(Table.name)
    )
    for revision_id, table_id, name, mirror, start, writer, frontier in rows:
        found[revision_id].append(Affected(table_id, name, mirror, start, writer, frontier))
    return found


def table_names(session: Session, table_ids: Sequence[int]) -> dict[int, str]:
    if not table_ids:
        return {}
    return dict(session.execute(select(Table.id, Table.name).where(Table.id.in_(table_ids))).all())


def page(session: Session, limit: int, offset: int) -> tuple[list[Revision], int]:
    """Revisions, newest first."""
    total = session.execute(select(func.count()).select_from(Revision)).scalar_one()
    rows = session.execute(
        select(Revision).order_by(Revision.id.desc()).limit(limit).offset(offset)
    ).scalars()
    return list(rows), total


def active_overlapping(session: Session, table_ids: Sequence[int]) -> list[tuple[int, str]]:
    """(revision id, table name) of each active revision's affected table among
    ``table_ids``."""
    if not table_ids:
        return []
    rows = session.execute(
        select(RevisionTable.revision_id, Table.name)
        .join(Revision, Revision.id == RevisionTable.revision_id)
        .join(Table, Table.id == RevisionTable.table_id)
        .where(RevisionTable.table_id.in_(table_ids), Revision.state.in_(ACTIVE))
        .order_by(RevisionTable.revision_id, Table.name)
    )
    return [(r, name) for r, name in rows]


def active_start_snapshots(session: Session, table_id: int) -> list[Kept]:
    """The start snapshots active and swapped revisions keep in the table (none for an
    empty start): after a swap, the table that was swapped in still reads its start
    snapshot's files, which are this table's."""
    rows = session.execute(
        select(RevisionTable.revision_id, RevisionTable.start_snapshot_id)
        .join(Revision, Revision.id == RevisionTable.revision_id)
        .where(
            RevisionTable.table_id == table_id,
            RevisionTable.start_snapshot_id.is_not(None),
            Revision.state.in_((*ACTIVE, SWAPPED)),
        )
        .order_by(RevisionTable.revision_id)
    )
    return [Kept(r, s or 0) for r, s in rows]  # filtered: never null


def active_reading(session: Session, table_id: int) -> list[tuple[int, int]]:
    """(revision id, from barrier) of each active revision whose jobs read the table from
    the original (an input of an affected table's writer, not itself affected): the
    revision jobs' first batch reads it from its snapshot at the barrier."""
    own = aliased(RevisionTable)
    affected = (
        select(own.table_id)
        .where(own.revision_id == Revision.id, own.table_id == table_id)
        .correlate(Revision)
        .exists()
    )
    rows = session.execute(
        select(Revision.id, Revision.from_barrier)
        .join(RevisionTable, RevisionTable.revision_id == Revision.id)
        .join(Job, Job.name == RevisionTable.writer)
        .join(JobInput, JobInput.job_id == Job.id)
        .where(JobInput.table_id == table_id, Revision.state.in_(ACTIVE), ~affected)
        .distinct()
        .order_by(Revision.id)
    )
    return [(r, b) for r, b in rows]


def active_by_mirror(session: Session, mirror: str) -> int | None:
    """The active revision whose mirror is ``mirror``, if any."""
    return session.execute(
        select(RevisionTable.revision_id)
        .join(Revision, Revision.id == RevisionTable.revision_id)
        .where(RevisionTable.mirror == mirror, Revision.state.in_(ACTIVE))
    ).scalar_one_or_none()


def expired_ids(session: Session, table_id: int, snapshot_ids: Sequence[int]) -> set[int]:
    """Those of ``snapshot_ids`` an expiry removed from the table."""
    if not snapshot_ids:
        return set()
    return set(
        session.scalars(
            select(ExpiredSnapshot.snapshot_id).where(
                ExpiredSnapshot.table_id == table_id,
                ExpiredSnapshot.snapshot_id.in_(snapshot_ids),
            )
        )
    )


# -- revision jobs ----------------------------------------------------------------------------


def seed_batch(
    session: Session,
    job_id: int,
    barrier: int,
    now_ms: int,
    starts: Sequence[tuple[int, int | None]],
) -> None:
    """A revision job's position at ``barrier``: a committed batch of the MetaService's own
    (``batch_id = -barrier``, as an idle job's advance is recorded) with each mirror's start
    snapshot reported at it, as (table id, snapshot id or None when empty)."""
    session.add(
        Batch(
            job_id=job_id,
            batch_id=-barrier,
            barrier=barrier,
            start_barrier=None,
            committed=True,
            advanced=True,
            created_ms=now_ms,
            committed_ms=now_ms,
            outputs=len(starts),
        )
    )
    session.add_all(
        Commit(
            job_id=job_id,
            batch_id=-barrier,
            table_id=table_id,
            barrier=barrier,
            snapshot_id=snapshot_id,
            created_ms=now_ms,
        )
        for table_id, snapshot_id in starts
    )
    session.flush()


def unread_tables(session: Session, table_ids: Sequence[int]) -> list[int]:
    """Those of ``table_ids`` no job reads."""
    if not table_ids:
        return []
    read = set(session.scalars(select(JobInput.table_id).where(JobInput.table_id.in_(table_ids))))
    return sorted(set(table_ids) - read)


def delete_tables(session: Session, table_ids: Sequence[int]) -> None:
    """The records of tables no job reads or writes any more (a cancelled revision's
    mirrors): leases', tags' and expiries' rows on them, then the tables."""
    if not table_ids:
        return
    models = (
        LeaseSnapshot,
        VersionTagSnapshot,
        ExpiredSnapshot,
        TableRetention,
        TableExactBarrier,
        Commit,
    )
    for model in models:
        session.execute(delete(model).where(model.table_id.in_(table_ids)))
    session.execute(delete(Table).where(Table.id.in_(table_ids)))


# Asked by every new batch's barrier and every next-barrier: built once, with a bound
# parameter (see barriers.repository).
SUPERSEDING = (
    select(RevisionTable.revision_id)
    .join(Revision, Revision.id == RevisionTable.revision_id)
    .where(RevisionTable.writer == bindparam("writer"), Revision.state.in_(FREEZING))
    .order_by(RevisionTable.revision_id.desc())
    .limit(1)
)


def superseding(session: Session, writer: str) -> int | None:
    """The revision, swapping or swapped, whose jobs replace the job named ``writer``."""
    return session.execute(SUPERSEDING, {"writer": writer}).scalar_one_or_none()


# -- the swap ---------------------------------------------------------------------------------


def superseded_writers(session: Session) -> set[str]:
    """The jobs a revision, swapping or swapped, replaces (see :func:`superseding`)."""
    return set(
        session.scalars(
            select(RevisionTable.writer)
            .join(Revision, Revision.id == RevisionTable.revision_id)
            .where(Revision.state.in_(FREEZING))
        )
    )


def active_mirrors(session: Session) -> set[str]:
    """The mirrors of the active revisions, by name (see :func:`active_by_mirror`)."""
    return set(
        session.scalars(
            select(RevisionTable.mirror)
            .join(Revision, Revision.id == RevisionTable.revision_id)
            .where(Revision.state.in_(ACTIVE))
        )
    )


def written_tables(session: Session) -> list[tuple[Table, Job]]:
    """Every table that has a writer, with it, by table name."""
    rows = session.execute(
        select(Table, Job).join(Job, Job.id == Table.writer_id).order_by(Table.name)
    )
    return [(t, j) for t, j in rows]


def pre_revision_name(table: str, revision_id: int) -> str:
    """Where the original goes at the swap: ``dw.detail`` -> ``dw.detail__pre_rev7``."""
    return f"{table}__pre_rev{revision_id}"


def swapped_mirrors(session: Session, names: Sequence[str]) -> dict[str, Table]:
    """The tables that swapped revisions' mirrors became, by the mirror's old name
    (``dw.detail__rev7`` -> the table now named ``dw.detail``), for those of ``names``
    that are one: a revision job's report queued before the swap names its output so.
    The mirror took its original's name, which the original left for
    ``<name>__pre_rev<id>``."""
    if not names:
        return {}
    rows = session.execute(
        select(RevisionTable.mirror, RevisionTable.revision_id, Table.name)
        .join(Revision, Revision.id == RevisionTable.revision_id)
        .join(Table, Table.id == RevisionTable.table_id)
        .where(RevisionTable.mirror.in_(list(names)), Revision.state == SWAPPED)
    )
    became = {
        mirror: original.removesuffix(pre_revision_name("", revision_id))
        for mirror, revision_id, original in rows
        if original.endswith(pre_revision_name("", revision_id))
    }
    if not became:
        return {}
    tables = {
        t.name: t
        for t in session.scalars(select(Table).where(Table.name.in_(set(became.values()))))
    }
    return {mirror: tables[name] for mirror, name in became.items() if name in tables}


def rename_table(session: Session, table_id: int, name: str) -> None:
    session.execute(
        update(Table)
        .where(Table.id == table_id)
        .values(name=name)
        .execution_options(synchronize_session=False)
    )
    session.flush()


def unpublish_logs(session: Session, table_ids: Sequence[int]) -> dict[int, str]:
    """Take the tables' published logs off them; returns the addresses they had (by table
    id, only those that had one)."""
    found = {
        table_id: address
        for table_id, address in session.execute(
            select(Table.id, Table.log_address).where(
                Table.id.in_(table_ids), Table.log_address.is_not(None)
            )
        )
        if address is not None
    }
    if found:
        session.execute(
            update(Table)
            .where(Table.id.in_(sorted(found)))
            .values(log_mode=None, log_address=None, log_updated_ms=None)
            .execution_options(synchronize_session=False)
        )
    return found


def set_frontiers(session: Session, revision_id: int, frontiers: dict[int, int]) -> None:
    """Record each mirror's frontier (by its original's table id) at the swap."""
    for table_id, frontier in frontiers.items():
        session.execute(
            update(RevisionTable)
            .where(RevisionTable.revision_id == revision_id, RevisionTable.table_id == table_id)
            .values(frontier=frontier)
            .execution_options(synchronize_session=False)
        )


# pyiceberg's SQL catalog's table of tables (the Iceberg JDBC catalog's layout), when the
# catalog lives in the MetaService's database.
_ICEBERG_TABLES = table(
    "iceberg_tables",
    column("catalog_name"),
    column("table_namespace"),
    column("table_name"),
)


def rename_catalog_table(
    session: Session, catalog: str, source: tuple[str, str], target: tuple[str, str]
) -> bool:
    """Rename a table of the SQL catalog ``catalog`` in this transaction: (namespace, name)
    ``source`` -> ``target``; False when the catalog has no such table."""
    done = session.execute(
        update(_ICEBERG_TABLES)
        .where(
            _ICEBERG_TABLES.c.catalog_name == catalog,
            _ICEBERG_TABLES.c.table_namespace == source[0],
            _ICEBERG_TABLES.c.table_name == source[1],
        )
        .values(table_namespace=target[0], table_name=target[1])
        .execution_options(synchronize_session=False)
    )
    return bool(done.rowcount)  # type: ignore[attr-defined]
