"""Publishing a tag, and removing one: the records (``tags.service``) and the Iceberg tags
(``tags.iceberg``), in an order that never leaves a snapshot unprotected.

Creating ``name`` on ``tables``:

0. Refusals that change nothing: the name (422, 409 ``tag_exists``), the tables (404,
   409), a branch or tag of that name already in an Iceberg table (409 ``tag_exists``),
   a catalog that cannot be opened (503).
1. Record the tag (state ``creating``) in the transaction that picks its consistent
   version, under the tables' shared locks (409 ``no_consistent_version``, ``expired``:
   nothing changed). From its commit on, expiry keeps the tag's snapshots.
2. Tag each table's snapshot in Iceberg (with a max-ref-age when retained).
3. Mark the tag ``published``.

When 2 or 3 fails, the Iceberg tags made so far are removed and the record dropped
(``catalog_steps.all_or_nothing``): no half-published tag is left. Should that undo fail too, the record stays ``creating``
(its snapshots stay kept) and ``DELETE`` finishes it.

Removing a tag removes its Iceberg tags first, then the record: a failure in between
leaves the record (and its snapshots kept), and a second ``DELETE`` finishes. Every
removal (``DELETE``, an ended tag dropped by an expiry or before its name is used again)
acts on one record (``TagKey``): right before it removes an Iceberg tag it checks that
the record still names that snapshot, and it deletes the record only if it is still that
one. So a tag made again under the same name meanwhile keeps its record, its snapshots
and its Iceberg tags; should it be made in the moment between the check and the removal,
its Iceberg tag is made again at once.

pyiceberg is imported only here, when a catalog is opened: the service itself runs
without the ``iceberg`` extra.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from metaservice.catalog_steps import UndoFailed, all_or_nothing
from metaservice.context import Context
from metaservice.db import Database
from metaservice.errors import Conflict, ServiceError
from metaservice.lifecycle.catalog import CatalogLoader, first_line, opened_catalog, unavailable
from metaservice.models import VersionTag
from metaservice.versions import service as versions
from metaservice.versions.tags import service
from metaservice.versions.tags.repository import TagKey
from metaservice.versions.tags.schemas import TagRequest, TagView

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)


def create_tag(
    db: Database, ctx: Context, body: TagRequest, *, load_catalog: CatalogLoader | None = None
) -> TagView:
    """Publish the consistent version of ``body.tables`` as Iceberg tag ``body.name`` in
    every table (see the module's docstring for the steps)::

        view = create_tag(db, ctx, TagRequest(name="daily-2026-12-01", tables=["dw.a"]))
        print(view.barrier, view.snapshots)
    """
    name = service.check_tag_name(body.name)
    tables = versions.parse_tables(ctx, body.tables)
    ended = db.read(lambda session: service.precheck(session, ctx, name, tables))
    with opened_catalog(ctx.settings, load_catalog, "publishing a tag") as catalog:
        ended_view = (
            None if ended is None else db.read(lambda session: service.view(session, ended))
        )
        _refuse_taken(catalog, name, tables, ended_view)
        if ended is not None and ended_view is not None:
            _drop(db, ctx, catalog, service.key_of(ended), ended_view)
        tag_id, created = db.write(lambda session: _record(session, ctx, name, tables, body))
        return _publish(db, catalog, tag_id, created)


def _record(
    session: Session, ctx: Context, name: str, tables: list[str], body: TagRequest
) -> tuple[int, TagView]:
    tag_id, _ = service.record_tag(
        session, ctx, name, tables, body.at_or_before, body.retain_seconds
    )
    tag = session.get(VersionTag, tag_id)
    assert tag is not None
    return tag_id, service.view(session, tag)


def _publish(db: Database, catalog: Catalog, tag_id: int, tag: TagView) -> TagView:
    from metaservice.versions.tags import iceberg

    def make(table: str, snapshot: int) -> None:
        # Found there already (a retry of a commit that landed): ours too, since the
        # name was checked free in every table before the record took it.
        iceberg.create_tag(catalog, table, tag.name, snapshot, tag.expires_ms, tag.created_ms)

    def remove(table: str, snapshot: int, _: None) -> None:
        iceberg.remove_tag(catalog, table, tag.name, snapshot)

    key = TagKey(tag_id, tag.created_ms, tag.expires_ms)
    try:
        return all_or_nothing(
            f"publishing tag {tag.name}",
            [
                (
                    functools.partial(make, table, snapshot),
                    functools.partial(remove, table, snapshot),
                )
                for table, snapshot in sorted(tag.snapshots.items())
                if snapshot is not None  # empty at the barrier: nothing to point at
            ],
            finish=lambda: db.write(
                lambda session: service.mark_published(session, tag.name, tag_id)
            ),
            forget=lambda: db.write(lambda session: service.forget(session, key)),
        )
    except UndoFailed as failed:
        raise unavailable(
            f"publishing tag '{tag.name}' (it failed: {first_line(failed.cause)}) and then "
            "undoing it",
            failed.error,
            f"The tag stays recorded as 'creating' and its snapshots stay kept: DELETE "
            f"/api/v1/versions/tags/{tag.name} (metaservice untag {tag.name}) removes it",
        ) from failed.error
    except Exception as exc:
        if isinstance(exc, ServiceError):
            raise
        if isinstance(exc, iceberg.RefTaken):
            raise _taken(exc) from exc
        if isinstance(exc, iceberg.SnapshotMissing):
            raise Conflict(
                f"cannot tag '{tag.name}': {exc}. Check that the service uses the jobs' "
                "catalog (METASERVICE_CATALOG_PROPERTIES, else METASERVICE_DB_URL and "
                "METASERVICE_WAREHOUSE). Nothing was published",
                field="tables",
                code="not_in_catalog",
            ) from exc
        raise unavailable(f"publishing tag '{tag.name}'", exc, "Nothing was published") from exc


def delete_tag(
    db: Database, ctx: Context, name: str, *, load_catalog: CatalogLoader | None = None
) -> TagView:
    """Remove the tag's Iceberg tags, then its record (an ended tag too); returns it."""
    key, tag = db.read(lambda session: _find(session, ctx, name))
    if all(snapshot is None for snapshot in tag.snapshots.values()):
        db.write(lambda session: service.forget(session, key))
        return tag
    with opened_catalog(ctx.settings, load_catalog, "removing a tag") as catalog:
        _drop(db, ctx, catalog, key, tag)
    return tag


def _find(session: Session, ctx: Context, name: str) -> tuple[TagKey, TagView]:
    tag = service.get_tag(session, ctx, name, ended=True)
    found = service.tag_key(session, name)
    assert found is not None
    return found, tag


def _drop(db: Database, ctx: Context, catalog: Catalog, key: TagKey, tag: TagView) -> None:
    try:
        for table, snapshot in sorted(tag.snapshots.items()):
            if snapshot is not None:
                _remove_ref(db, ctx, catalog, key, tag.name, table, snapshot)
    except Exception as exc:
        raise unavailable(
            f"removing the Iceberg tags of '{tag.name}'",
            exc,
            "The tag stays recorded (its snapshots stay kept); remove it again",
        ) from exc
    db.write(lambda session: service.forget(session, key))


def drop_ended(db: Database, ctx: Context, catalog: Catalog, table: str) -> list[str]:
    """Remove the Iceberg tags that ended tags still have in ``table``, and forget them
    there (a tag's record goes with its last table); returns their names. An expiry runs
    this before it reserves, so that the snapshots they kept may go."""
    ended = db.read(lambda session: service.ended_on_table(session, ctx, table))
    for tagged in ended:
        if tagged.snapshot_id is not None:
            _remove_ref(db, ctx, catalog, tagged.key, tagged.name, table, tagged.snapshot_id)
        db.write(functools.partial(service.forget_table, key=tagged.key, table=table))
    if ended:
        log.info("dropped ended tags %s of %s", [t.name for t in ended], table)
    return [t.name for t in ended]


def _remove_ref(
    db: Database, ctx: Context, catalog: Catalog, key: TagKey, name: str, table: str, snapshot: int
) -> None:
    """Remove the Iceberg tag ``name`` on ``snapshot`` in ``table`` that the record ``key``
    made, if that record still names it: a tag made again under the name meanwhile is
    another record, and its Iceberg tag stays (made again, should it have been made in
    the moment between this check and the removal)."""
    from metaservice.versions.tags import iceberg

    if not db.write(lambda session: service.still_names(session, key, table, snapshot)):
        log.info("tag %s of %s was removed or made again meanwhile: left as it is", name, table)
        return
    iceberg.remove_tag(catalog, table, name, snapshot)
    again = db.read(lambda session: service.live_named(session, ctx, name, table))
    if again is not None and again.key != key and again.snapshot_id == snapshot:
        log.warning(
            "tag %s was made again on snapshot %d of %s while its former tag's Iceberg tag "
            "was being removed: its Iceberg tag is made again",
            name,
            snapshot,
            table,
        )
        iceberg.create_tag(catalog, table, name, snapshot, again.expires_ms, again.created_ms)


def _refuse_taken(catalog: Catalog, name: str, tables: list[str], ended: TagView | None) -> None:
    """409 ``tag_exists`` when an Iceberg table has a branch or tag ``name`` already
    (other than the Iceberg tag of the ended tag that still holds the name)."""
    from metaservice.lifecycle.iceberg import load_table
    from metaservice.versions.tags import iceberg

    for table in tables:
        try:
            found = load_table(catalog, table)
        except Exception as exc:
            raise unavailable(
                f"loading '{table}' from the catalog", exc, "Nothing was changed"
            ) from exc
        ref = None if found is None else iceberg.ref_named(found, name)
        if ref is None:
            continue
        if ended is not None and ref == iceberg.Ref("tag", ended.snapshots.get(table) or -1):
            continue
        raise _taken(iceberg.RefTaken(table, name, ref))


def _taken(exc: Exception) -> Conflict:
    return Conflict(
        f"{exc}: a tag name is used once, for the same version in every table. Choose "
        "another name (or remove that ref). Nothing was changed",
        field="name",
        code="tag_exists",
    )
