"""Queries of tags: the records, the snapshots they name per table, live and ended ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from sqlalchemy import ColumnElement, delete, exists, func, select, update
from sqlalchemy.orm import Session

from metaservice.models import Table, VersionTag, VersionTagSnapshot


class TagKey(NamedTuple):
    """Which record a tag is: its row id, with when it was made and ends (a row id alone
    may be given again once its row is deleted, as SQLite does; a name is used again once
    its tag ended). Removals compare it, so they never take a tag made again meanwhile."""

    tag_id: int
    created_ms: int
    expires_ms: int | None


class TaggedSnapshot(NamedTuple):
    """One table's snapshot named by a tag."""

    tag_id: int
    name: str
    snapshot_id: int | None
    expires_ms: int | None
    created_ms: int

    @property
    def key(self) -> TagKey:
        return TagKey(self.tag_id, self.created_ms, self.expires_ms)


def key_of(tag: VersionTag) -> TagKey:
    return TagKey(tag.id, tag.created_ms, tag.expires_ms)


def _live(now_ms: int) -> ColumnElement[bool]:
    return VersionTag.expires_ms.is_(None) | (VersionTag.expires_ms > now_ms)


def _is(key: TagKey) -> list[ColumnElement[bool]]:
    ends = (
        VersionTag.expires_ms.is_(None)
        if key.expires_ms is None
        else VersionTag.expires_ms == key.expires_ms
    )
    return [VersionTag.id == key.tag_id, VersionTag.created_ms == key.created_ms, ends]


def by_name(session: Session, name: str) -> VersionTag | None:
    return session.execute(select(VersionTag).where(VersionTag.name == name)).scalar_one_or_none()


def insert(
    session: Session,
    name: str,
    barrier: int,
    state: str,
    created_ms: int,
    expires_ms: int | None,
    snapshots: Mapping[int, int | None],
) -> VersionTag:
    """A new tag naming ``snapshots`` (table id -> snapshot id)."""
    tag = VersionTag(
        name=name, barrier=barrier, state=state, created_ms=created_ms, expires_ms=expires_ms
    )
    session.add(tag)
    session.flush()
    session.add_all(
        VersionTagSnapshot(tag_id=tag.id, table_id=table_id, snapshot_id=snapshot)
        for table_id, snapshot in snapshots.items()
    )
    session.flush()
    return tag


def set_state(session: Session, tag_id: int, state: str) -> bool:
    """False when the tag is gone (deleted meanwhile)."""
    done = session.execute(
        update(VersionTag)
        .where(VersionTag.id == tag_id)
        .values(state=state)
        .execution_options(synchronize_session=False)
    )
    return bool(done.rowcount)  # type: ignore[attr-defined]


def delete_tag(session: Session, key: TagKey) -> None:
    """Delete the record ``key`` (none, if the row is another tag's by now)."""
    session.execute(delete(VersionTag).where(*_is(key)))


def names_snapshot(session: Session, key: TagKey, table_id: int, snapshot_id: int) -> bool:
    """Whether the record ``key`` still names ``snapshot_id`` in the table; its row stays
    locked to the end of the transaction (PostgreSQL), so no removal of it runs meanwhile."""
    found = session.execute(
        select(VersionTag.id)
        .join(VersionTagSnapshot, VersionTagSnapshot.tag_id == VersionTag.id)
        .where(
            *_is(key),
            VersionTagSnapshot.table_id == table_id,
            VersionTagSnapshot.snapshot_id == snapshot_id,
        )
        .with_for_update(of=VersionTag)
    ).first()
    return found is not None


def live_named(session: Session, name: str, table_id: int, now_ms: int) -> TaggedSnapshot | None:
    """The tag ``name``, if it has not ended, with the snapshot it names in the table."""
    row = session.execute(
        select(
            VersionTag.id,
            VersionTag.name,
            VersionTagSnapshot.snapshot_id,
            VersionTag.expires_ms,
            VersionTag.created_ms,
        )
        .join(VersionTagSnapshot, VersionTagSnapshot.tag_id == VersionTag.id)
        .where(VersionTag.name == name, VersionTagSnapshot.table_id == table_id, _live(now_ms))
    ).first()
    return None if row is None else TaggedSnapshot(*row)


def snapshots_of(session: Session, tag_ids: Sequence[int]) -> dict[int, dict[str, int | None]]:
    """Per tag, the snapshot it names in each table, by table name."""
    found: dict[int, dict[str, int | None]] = {tag_id: {} for tag_id in tag_ids}
    if not tag_ids:
        return found
    rows = session.execute(
        select(VersionTagSnapshot.tag_id, Table.name, VersionTagSnapshot.snapshot_id)
        .join(Table, Table.id == VersionTagSnapshot.table_id)
        .where(VersionTagSnapshot.tag_id.in_(tag_ids))
        .order_by(Table.name)
    )
    for tag_id, table, snapshot in rows:
        found[tag_id][table] = snapshot
    return found


def live_page(
    session: Session, now_ms: int, limit: int, offset: int, table_id: int | None = None
) -> tuple[list[VersionTag], int]:
    """The tags that have not ended (on ``table_id`` only, if given), by name; and their
    number."""
    conditions = [_live(now_ms)]
    if table_id is not None:
        conditions.append(
            exists().where(
                VersionTagSnapshot.tag_id == VersionTag.id, VersionTagSnapshot.table_id == table_id
            )
        )
    total = session.execute(
        select(func.count()).select_from(VersionTag).where(*conditions)
    ).scalar_one()
    tags = session.execute(
        select(VersionTag).where(*conditions).order_by(VersionTag.name).limit(limit).offset(offset)
    ).scalars()
    return list(tags), total


def on_table(session: Session, table_id: int, now_ms: int, *, live: bool) -> list[TaggedSnapshot]:
    """The tags naming a snapshot of the table: those that have not ended (``live``), or
    those that have."""
    ended = _live(now_ms)
    rows = session.execute(
        select(
            VersionTag.id,
            VersionTag.name,
            VersionTagSnapshot.snapshot_id,
            VersionTag.expires_ms,
            VersionTag.created_ms,
        )
        .join(VersionTagSnapshot, VersionTagSnapshot.tag_id == VersionTag.id)
        .where(VersionTagSnapshot.table_id == table_id, ended if live else ~ended)
        .order_by(VersionTag.name)
    )
    return [TaggedSnapshot(*row) for row in rows]


def forget_table(session: Session, key: TagKey, table_id: int) -> None:
    """Drop what the tag ``key`` names in the table (and in the tables where it names
    nothing); the tag itself goes with its last table. Nothing, if the row is another
    tag's by now."""
    tag_id = key.tag_id
    if session.execute(select(VersionTag.id).where(*_is(key))).first() is None:
        return
    session.execute(
        delete(VersionTagSnapshot).where(
            VersionTagSnapshot.tag_id == tag_id,
            (VersionTagSnapshot.table_id == table_id) | VersionTagSnapshot.snapshot_id.is_(None),
        )
    )
    left = session.execute(
        select(func.count())
        .select_from(VersionTagSnapshot)
        .where(VersionTagSnapshot.tag_id == tag_id)
    ).scalar_one()
    if not left:
        delete_tag(session, key)
