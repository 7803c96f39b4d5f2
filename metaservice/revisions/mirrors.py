"""Creating a revision and cancelling one: the records (``revisions.service``) and the
mirror tables (``revisions.iceberg``), all or nothing.

Creating a revision of ``table`` from ``from_barrier``:

0. Refusals that change nothing: the body (422), an unknown table (404), a catalog that cannot be opened (503).
1. Record the revision (state ``creating``) with its affected tables and their start
   snapshots (``service.record_revision``: 404, 409 ``no_writer``, ``not_reached``,
   ``not_exact``, ``expired``, ``revision_overlaps`` change nothing). From its commit on,
   expiry keeps every start snapshot.
2. Make each mirror in the catalog (a metadata file and ``register_table``).
3. Mark the revision ``planned``.

When 2 or 3 fails, the mirrors made so far are dropped (with the metadata files written
for them) and the record is deleted: nothing is left. Should that undo fail too, the
record stays ``creating`` (its start snapshots stay kept) and ``DELETE`` finishes it.

Cancelling drops the mirrors from the catalog (no data file is deleted: they are the
original's) after marking the revision ``cancelled``. Cancelling a cancelled revision
answers it again, and drops any mirror a failed cancel left.

pyiceberg is imported only here, when a catalog is opened: the service itself runs
without the ``iceberg`` extra.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from metaservice.context import Context
from metaservice.db import Database, normalise_url
from metaservice.errors import Conflict, ServiceError
from metaservice.lifecycle.expiry import CatalogLoader, CatalogUnavailable, open_catalog
from metaservice.revisions import replaced_logs, service
from metaservice.revisions.schemas import RevisionRequest, RevisionView
from metaservice.settings import Settings

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
    catalog = open_catalog(ctx.settings, load_catalog, "creating a revision")
    from metaservice.lifecycle.iceberg import close_catalog

    try:
        planned = db.write(
            lambda session: service.record_revision(session, ctx, body.table, body.from_barrier)
        )
        return _make_mirrors(db, ctx, catalog, planned)
    finally:
        close_catalog(catalog)


def _make_mirrors(
    db: Database, ctx: Context, catalog: Catalog, planned: RevisionView
) -> RevisionView:
    from metaservice.revisions import iceberg

    made: dict[str, str] = {}  # mirror -> its metadata file
    try:
        for m in planned.tables:
            made[m.mirror] = iceberg.create_mirror(
                catalog, m.table, m.mirror, m.start_snapshot, planned.id, ctx.now_ms()
            )
        return db.write(lambda session: service.mark_planned(session, ctx, planned.id))
    except Exception as exc:
        _undo(db, catalog, planned, made, exc)
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
        raise _unavailable(
            f"making the mirrors of revision {planned.id}", exc, "Nothing was changed"
        ) from exc


def _undo(
    db: Database,
    catalog: Catalog,
    planned: RevisionView,
    made: dict[str, str],
    cause: Exception,
) -> None:
    """Drop the mirrors this request made, then the record."""
    from metaservice.revisions import iceberg

    log.warning("making the mirrors of revision %d failed (%s); undoing it", planned.id, cause)
    try:
        for mirror, path in sorted(made.items()):
            iceberg.drop_mirror(catalog, mirror, planned.id, made_at=path)
        db.write(lambda session: service.forget(session, planned.id))
    except Exception as exc:
        log.exception("undoing revision %d failed", planned.id)
        raise _unavailable(
            f"making the mirrors of revision {planned.id} (it failed: {_first_line(cause)}) "
            "and then undoing it",
            exc,
            f"The revision stays recorded as 'creating' and its start snapshots stay kept: "
            f"DELETE /api/v1/revisions/{planned.id} (metaservice revision cancel "
            f"{planned.id}) removes its mirrors",
        ) from exc


def cancel_revision(
    db: Database, ctx: Context, revision_id: int, *, load_catalog: CatalogLoader | None = None
) -> RevisionView:
    """Mark the revision ``cancelled`` and drop its mirrors from the catalog, deleting no
    file; returns it. Idempotent: a cancelled revision is answered again (and any mirror
    a failed cancel left is dropped)."""
    db.read(lambda session: service.get_revision(session, ctx, revision_id))  # 404 first
    catalog = open_catalog(ctx.settings, load_catalog, "cancelling a revision")
    from metaservice.lifecycle.iceberg import close_catalog
    from metaservice.revisions import iceberg

    try:
        cancelled = db.write(lambda session: service.mark_cancelled(session, ctx, revision_id))
        try:
            for m in cancelled.tables:
                if iceberg.drop_mirror(catalog, m.mirror, revision_id):
                    log.info("revision %d: dropped mirror %s", revision_id, m.mirror)
        except Exception as exc:
            raise _unavailable(
                f"dropping the mirrors of revision {revision_id}",
                exc,
                "The revision is cancelled; DELETE it again to drop the mirrors left",
            ) from exc
        return cancelled
    finally:
        close_catalog(catalog)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _unavailable(doing: str, exc: Exception, then: str) -> CatalogUnavailable:
    log.warning("%s failed", doing, exc_info=exc)
    return CatalogUnavailable(
        f"{doing} failed: {_first_line(exc)}. {then}; try again once the catalog and its "
        "storage are reachable"
    )


# -- the swap ---------------------------------------------------------------------------------

# How often a swap looks again whether the mirrors reached the frozen originals.
SWAP_POLL_SECONDS = 0.2


def catalog_in_database(settings: Settings) -> str | None:
    """The name of the jobs' catalog when it is a pyiceberg SQL catalog in the
    MetaService's own database (the default), whose tables a swap renames in its own
    transaction; None for any other catalog."""
    from metaservice.lifecycle.iceberg import CATALOG_NAME, is_sql_catalog
    from metaservice.reconcile.iceberg import catalog_properties

    properties = catalog_properties(settings)
    if not is_sql_catalog(properties):
        return None
    uri = properties.get("uri", "")
    if not uri or normalise_url(uri) != normalise_url(settings.db_url):
        return None
    return CATALOG_NAME


def swap_revision(
    db: Database,
    ctx: Context,
    revision_id: int,
    wait_seconds: float,
    *,
    load_catalog: CatalogLoader | None = None,
) -> RevisionView:
    """Swap a ready revision's mirrors in for their originals; returns it ``swapped``, or
    ``swapping`` when the mirrors have not reached the frozen originals within
    ``wait_seconds`` (a later call continues)::

    view = swap_revision(db, ctx, 7, wait_seconds=30)
    assert view.state in ("swapping", "swapped")

    1. ``service.begin_swap``: 409 ``not_ready`` unless the revision is ready; from its
       commit on, the original writers are superseded (no new batch; their open batches'
       reports are still recorded).
    2. Wait until each mirror's frontier reaches its original's, which no longer moves
       once their open batches are reported (idle revision jobs are advanced meanwhile).
    3. ``service.finish_swap``: one transaction renames the tables' records and, when
       the catalog is a SQL catalog in this database, its tables too.
    4. Any other catalog is renamed through pyiceberg right after that commit: until it
       is, a reader loading a table by name may get the original's metadata and then a
       snapshot the MetaService no longer names for it (an error, never a mix).
    5. The log services that held the originals or the mirrors (their logs were
       un-published in 3) drop those rows and move to a new epoch
       (``revisions.replaced_logs``; best effort, one warning for a log service down).
    """
    db.read(lambda session: service.get_revision(session, ctx, revision_id))  # 404 first
    in_catalog = catalog_in_database(ctx.settings)
    catalog = None if in_catalog else open_catalog(ctx.settings, load_catalog, "swapping")
    from metaservice.lifecycle.iceberg import close_catalog

    try:
        started = db.write(lambda session: service.begin_swap(session, ctx, revision_id))
        if started.state == "swapped" and catalog is None:
            return started
        deadline = time.monotonic() + wait_seconds
        while True:
            db.write(lambda session: service.advance_revision_jobs(session, ctx, revision_id))
            done = db.write(
                lambda session: service.finish_swap(
                    session, ctx, revision_id, in_catalog=in_catalog
                )
            )
            if done is not None:
                try:
                    if catalog is not None:
                        _rename_in(catalog, revision_id, done.renames)
                finally:
                    # after the renames: a reader the reset sends to the snapshots loads
                    # the swapped-in table by its name
                    replaced_logs.drop_replaced(revision_id, done.logs)
                return done.view
            if time.monotonic() >= deadline:
                return db.read(lambda session: service.get_revision(session, ctx, revision_id))
            time.sleep(SWAP_POLL_SECONDS)
    finally:
        if catalog is not None:
            close_catalog(catalog)


def _rename_in(catalog: Catalog, revision_id: int, renames: list[service.Renamed]) -> None:
    """Rename the swapped tables in a catalog outside the MetaService's database (again
    for a swap answered before: a rename already done is skipped)."""
    from metaservice.lifecycle.iceberg import load_table

    try:
        for r in renames:
            if load_table(catalog, r.pre) is None and load_table(catalog, r.table) is not None:
                catalog.rename_table(r.table, r.pre)
        for r in renames:
            if load_table(catalog, r.mirror) is not None:
                catalog.rename_table(r.mirror, r.table)
    except Exception as exc:
        raise _unavailable(
            f"renaming the tables of revision {revision_id} in the catalog",
            exc,
            "The MetaService has swapped them; POST /swap again finishes the renames",
        ) from exc
