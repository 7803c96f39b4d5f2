"""The rules of tags, in the database: names, the version a tag names, its records.

A tag is recorded before its Iceberg tags are made (``record_tag``), in the transaction
that picks its consistent version: under the tables' shared locks a lease grant takes
(``versions.service.lock_version``), so a concurrent expiry reservation either sees the
tag, and keeps its snapshots, or has raised the horizon and the tag is refused (409
``expired``). The Iceberg side is ``tags.publish``.

A tag keeps exactly the snapshots it names, as an Iceberg tag does in Iceberg's own
expiry: it holds no other snapshot back (see ``lifecycle.service``). A retained tag
ends at ``expires_ms``: from then on it is not listed and keeps nothing; the next expiry
of each of its tables drops its Iceberg tag there, and the record with the last one.
"""

from __future__ import annotations

import re

from sqlalchemy.orm import Session

from metaservice.context import Context
from metaservice.errors import Conflict, Invalid, NotFound
from metaservice.models import VersionTag
from metaservice.models.tags import CREATING, PUBLISHED
from metaservice.schemas_common import Page
from metaservice.topology import repository as topo
from metaservice.versions import service as versions
from metaservice.versions.schemas import ConsistentVersion
from metaservice.versions.tags import repository as repo
from metaservice.versions.tags.repository import TaggedSnapshot, TagKey
from metaservice.versions.tags.schemas import TAG_PATTERN, TagView

_TAG = re.compile(TAG_PATTERN)


def check_tag_name(name: str, field: str = "name") -> str:
    """422 ``invalid_tag_name`` unless ``name`` is a safe Iceberg ref name for a tag."""
    if not _TAG.fullmatch(name):
        raise Invalid(
            f"{name[:120]!r} is not a tag name: 1-100 letters, digits, '_', '.', '-', "
            "starting with a letter or digit, e.g. daily-2026-12-01",
            field=field,
            code="invalid_tag_name",
        )
    if name.lower() == "main":
        raise Invalid(
            "'main' is the name of every Iceberg table's main branch: choose another tag name",
            field=field,
            code="invalid_tag_name",
        )
    return name


def view(session: Session, tag: VersionTag) -> TagView:
    return _views(session, [tag])[0]


def _views(session: Session, tags: list[VersionTag]) -> list[TagView]:
    snapshots = repo.snapshots_of(session, [t.id for t in tags])
    return [
        TagView(
            name=t.name,
            barrier=t.barrier,
            snapshots=snapshots[t.id],
            state=PUBLISHED if t.state == PUBLISHED else CREATING,
            created_ms=t.created_ms,
            expires_ms=t.expires_ms,
        )
        for t in tags
    ]


def _ended(ctx: Context, tag: VersionTag) -> bool:
    return tag.expires_ms is not None and tag.expires_ms <= ctx.now_ms()


def _taken(tag: VersionTag) -> Conflict:
    return Conflict(
        f"tag '{tag.name}' exists already (barrier {tag.barrier}): a name names one version. "
        "Choose another name, or delete the tag first",
        field="name",
        code="tag_exists",
    )


def precheck(session: Session, ctx: Context, name: str, tables: list[str]) -> VersionTag | None:
    """The refusals a tag request meets before anything is done: 409 ``tag_exists`` for a
    name in use, 404 for an unknown table, 409 ``no_writer``. Returns the ended tag that
    still holds the name, if any (it is dropped before the name is used again)."""
    existing = repo.by_name(session, name)
    if existing is not None and not _ended(ctx, existing):
        raise _taken(existing)
    versions.writers_of(session, tables)
    return existing


def record_tag(
    session: Session,
    ctx: Context,
    name: str,
    tables: list[str],
    at_or_before: int | None,
    retain_seconds: int | None,
) -> tuple[int, ConsistentVersion]:
    """Take the name for the consistent version of ``tables`` (a write transaction):
    returns the new tag's id and its version. 409 ``tag_exists``, ``no_consistent_version``
    or ``expired`` change nothing."""
    existing = repo.by_name(session, name)
    if existing is not None:
        raise _taken(existing)
    versions.seal_writers(session, ctx, tables)
    version = versions.consistent_version(session, ctx, tables, at_or_before)
    locked = versions.lock_version(session, version)
    now = ctx.now_ms()
    expires = None if retain_seconds is None else now + retain_seconds * 1000
    tag = repo.insert(
        session,
        name,
        version.barrier,
        CREATING,
        now,
        expires,
        {locked[t].id: snapshot for t, snapshot in version.snapshots.items()},
    )
    return tag.id, version


def mark_published(session: Session, name: str, tag_id: int) -> TagView:
    """The tag's Iceberg tags are all made. 409 ``tag_deleted`` when it was deleted while
    they were being made (the caller then removes them)."""
    tag = session.get(VersionTag, tag_id)
    if tag is None or not repo.set_state(session, tag_id, PUBLISHED):
        raise Conflict(
            f"tag '{name}' was deleted while its Iceberg tags were being made; they are "
            "removed again",
            field="name",
            code="tag_deleted",
        )
    session.refresh(tag)
    return view(session, tag)


def get_tag(session: Session, ctx: Context, name: str, *, ended: bool = False) -> TagView:
    """The tag; 404 when there is none, or (unless ``ended``) when it has ended."""
    check_tag_name(name)
    tag = repo.by_name(session, name) if topo.storable(name) else None
    if tag is None or (_ended(ctx, tag) and not ended):
        raise NotFound(
            f"tag '{name}' does not exist" + ("" if tag is None else " any more (it has ended)"),
            field="name",
        )
    return view(session, tag)


def tag_key(session: Session, name: str) -> TagKey | None:
    tag = repo.by_name(session, name)
    return None if tag is None else repo.key_of(tag)


def key_of(tag: VersionTag) -> TagKey:
    return repo.key_of(tag)


def list_tags(
    session: Session, ctx: Context, limit: int, offset: int, table: str | None = None
) -> Page[TagView]:
    """The tags that have not ended, by name; on ``table`` only, if given."""
    table_id = None
    if table is not None:
        table_id = topo.require_table(session, table).id
    tags, total = repo.live_page(session, ctx.now_ms(), limit, offset, table_id)
    return Page(items=_views(session, tags), total=total, limit=limit, offset=offset)


def forget(session: Session, key: TagKey) -> None:
    """Drop the tag's record (its Iceberg tags are removed already); nothing, when the
    name was given to a new tag meanwhile."""
    repo.delete_tag(session, key)


# -- what expiry needs ----------------------------------------------------------------------


def live_on_table(session: Session, ctx: Context, table_id: int) -> list[TaggedSnapshot]:
    """The tags (not ended) naming a snapshot of the table: those snapshots are in use."""
    return repo.on_table(session, table_id, ctx.now_ms(), live=True)


def ended_on_table(session: Session, ctx: Context, table: str) -> list[TaggedSnapshot]:
    """The ended tags still naming a snapshot of the table (their Iceberg tags are still
    there unless an expiry dropped them)."""
    found = topo.table_by_name(session, table)
    if found is None:
        return []
    return repo.on_table(session, found.id, ctx.now_ms(), live=False)


def forget_table(session: Session, key: TagKey, table: str) -> None:
    """An ended tag's Iceberg tag in ``table`` is dropped: forget it there (and the tag
    with its last table)."""
    found = topo.table_by_name(session, table)
    if found is not None:
        repo.forget_table(session, key, found.id)


def still_names(session: Session, key: TagKey, table: str, snapshot_id: int) -> bool:
    """Whether the tag ``key`` still names ``snapshot_id`` in ``table`` (a write
    transaction: the row is locked while it runs), checked right before its Iceberg tag
    is removed."""
    found = topo.table_by_name(session, table)
    return found is not None and repo.names_snapshot(session, key, found.id, snapshot_id)


def live_named(session: Session, ctx: Context, name: str, table: str) -> TaggedSnapshot | None:
    """The tag ``name`` if it has not ended, with what it names in ``table``."""
    found = topo.table_by_name(session, table)
    if found is None:
        return None
    return repo.live_named(session, name, found.id, ctx.now_ms())
