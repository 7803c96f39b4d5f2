"""Creating a revision and cancelling one: the records (``revisions.service``) and the
mirror tables (``revisions.iceberg``), all or nothing.

Creating a revision of ``table`` from ``from_barrier``:

0. Refusals that change nothing: the body (422), an unknown table (404), a catalog that cannot be opened (503).
1. Record the revision (state ``creating``) with its affected tables and their start
   snapshots (``service.record_revision``: 404, 409 ``no_writer``, ``not_reached``,
   ``not_exact``, ``expired``, ``revision_overlaps``, and ``swap_unfinished`` while a
   swap's catalog renames name an affected table, change nothing). From its commit on,
   expiry keeps every start snapshot.
2. Make each mirror in the catalog (a metadata file and ``register_table``).
3. Mark the revision ``planned``.

When 2 or 3 fails, the mirrors made so far are dropped (with the metadata files written
for them) and the record is deleted (``catalog_steps.all_or_nothing``): nothing is left.
Should that undo fail too, the record stays ``creating`` (its start snapshots stay kept)
and ``DELETE`` finishes it.

Cancelling drops the mirrors from the catalog (no data file is deleted: they are the
original's) after marking the revision ``cancelled``. Cancelling a cancelled revision
answers it again, and drops any mirror a failed cancel left. A swapped revision cannot be
cancelled (409 ``revision_swapped``): its mirrors are the tables now. The swap is
``revisions.swap``.

pyiceberg is imported only here, when a catalog is opened: the service itself runs
without the ``iceberg`` extra.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from metaservice.catalog_steps import UndoFailed, all_or_nothing
from metaservice.context import Context
from metaservice.db import Database
from metaservice.errors import Conflict, ServiceError
from metaservice.lifecycle.catalog import CatalogLoader, first_line, opened_catalog, unavailable
from metaservice.revisions import service, swap
from metaservice.revisions.schemas import MirrorView, RevisionRequest, RevisionView

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)


def create_revision(
    db: Database, ctx: Context, body: RevisionRequest, *, load_catalog: CatalogLoader | None = None
) -> RevisionView:
    """Plan the revision and make its mirrors (see the module's docstring for the steps)::

    revision = create_revision(db, ctx, RevisionRequest(table="dw.a", from_barrier=b))
    print(revision.id, [(m.table, m.mirror, m.start_snapshot) for m in revision.tables])
    """
    db.read(lambda session: service.precheck(session, ctx, body.table, body.from_barrier))
    with opened_catalog(ctx.settings, load_catalog, "creating a revision") as catalog:
        planned = db.write(lambda session: _record(session, ctx, body))
        return _make_mirrors(db, ctx, catalog, planned)


def _record(session: Session, ctx: Context, body: RevisionRequest) -> RevisionView:
    """Step 1, refused (409 ``swap_unfinished``, rolled back) while a swap's catalog
    renames name an affected table: a mirror would be made from whichever table the
    catalog has under that name."""
    planned = service.record_revision(session, ctx, body.table, body.from_barrier)
    swap.refuse_unfinished_swap(
        session, [t for m in planned.tables for t in (m.table, m.mirror)], "revising"
    )
    return planned


def _make_mirrors(
    db: Database, ctx: Context, catalog: Catalog, planned: RevisionView
) -> RevisionView:
    from metaservice.revisions import iceberg

    def make(m: MirrorView) -> str:
        return iceberg.create_mirror(
            catalog, m.table, m.mirror, m.start_snapshot, planned.id, ctx.now_ms()
        )

    def drop(m: MirrorView, path: str) -> None:
        # the metadata file just written (still the mirror's only one) goes too
        iceberg.drop_mirror(catalog, m.mirror, planned.id, made_at=path)

    try:
        return all_or_nothing(
            f"making the mirrors of revision {planned.id}",
            [(partial(make, m), partial(drop, m)) for m in planned.tables],
            finish=lambda: db.write(lambda session: service.mark_planned(session, ctx, planned.id)),
            forget=lambda: db.write(lambda session: service.forget(session, planned.id)),
        )
    except UndoFailed as failed:
        raise unavailable(
            f"making the mirrors of revision {planned.id} (it failed: "
            f"{first_line(failed.cause)}) and then undoing it",
            failed.error,
            f"The revision stays recorded as 'creating' and its start snapshots stay kept: "
            f"DELETE /api/v1/revisions/{planned.id} (metaservice revision cancel "
            f"{planned.id}) removes its mirrors",
        ) from failed.error
    except Exception as exc:
        if isinstance(exc, ServiceError):
            raise
        if isinstance(exc, iceberg.OriginalMissing):
            raise Conflict(
                f"cannot mirror for revision {planned.id}: {exc}. Check that the service uses "
                "the jobs' catalog (METASERVICE_CATALOG_PROPERTIES, else METASERVICE_DB_URL "
                "and METASERVICE_WAREHOUSE). Nothing was changed",
                field="table",
                code="not_in_catalog",
            ) from exc
        if isinstance(exc, iceberg.MirrorTaken):
            raise Conflict(
                f"cannot mirror for revision {planned.id}: {exc}. Nothing was changed",
                field="table",
                code="mirror_exists",
            ) from exc
        raise unavailable(
            f"making the mirrors of revision {planned.id}", exc, "Nothing was changed"
        ) from exc


def cancel_revision(
    db: Database, ctx: Context, revision_id: int, *, load_catalog: CatalogLoader | None = None
) -> RevisionView:
    """Mark the revision ``cancelled`` and drop its mirrors from the catalog, deleting no
    file; returns it. Idempotent: a cancelled revision is answered again (and any mirror
    a failed cancel left is dropped)."""
    db.read(lambda session: service.get_revision(session, ctx, revision_id))  # 404 first
    with opened_catalog(ctx.settings, load_catalog, "cancelling a revision") as catalog:
        from metaservice.revisions import iceberg

        cancelled = db.write(lambda session: _cancel(session, ctx, revision_id))
        try:
            for m in cancelled.tables:
                if iceberg.drop_mirror(catalog, m.mirror, revision_id):
                    log.info("revision %d: dropped mirror %s", revision_id, m.mirror)
        except Exception as exc:
            raise unavailable(
                f"dropping the mirrors of revision {revision_id}",
                exc,
                "The revision is cancelled; DELETE it again to drop the mirrors left",
            ) from exc
        return cancelled


def _cancel(session: Session, ctx: Context, revision_id: int) -> RevisionView:
    swap.refuse_cancel_swapped(session, revision_id)  # 409 revision_swapped
    return service.mark_cancelled(session, ctx, revision_id)
