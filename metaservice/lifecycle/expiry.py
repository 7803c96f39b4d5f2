"""Executing an expiry (G5): reserve, remove the snapshots through pyiceberg, record them,
delete the files only they referenced.

0. Read the plan; when it lists something, open the catalog and find the table there
   (errors here change nothing).
1. Reserve (``service.reserve_expiry``, its own transaction): under the table's lock the
   plan is recomputed and the table's expiry horizon raised above everything it lists,
   so from its commit on no version or lease names those snapshots. A lease granted
   before it is in the plan; one asked for while the rest runs sees the horizon. The
   expiry acts on nothing else than what the reservation returned.
2. Remove the reserved snapshots from the Iceberg table in one commit (branch and tag
   heads are left in: whatever a ref uses stays). Tagged snapshots are not even
   reserved (``service``'s plan keeps them); before the reservation, the Iceberg tags
   of ended (retained) tags are removed, so that their snapshots may go.
3. Record them (``expired_snapshots``), so no plan lists them again.
4. Delete the files only they reached (see ``lifecycle.iceberg``).

A crash between 2 and 3 leaves snapshots removed but unrecorded: the next run finds
them gone from the table and records them (``already_gone``). A crash between 2 and 4
leaves their files behind as orphans. A dry run reserves nothing and changes nothing:
it shows what a run would remove now (a lease taken before the real run still keeps
its snapshot, and the real run then leaves it).

pyiceberg is imported only when there is something to remove: the service itself runs
without the ``iceberg`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from metaservice.context import Context
from metaservice.db import Database
from metaservice.errors import Conflict, ServiceError
from metaservice.lifecycle import service
from metaservice.lifecycle.schemas import ExpiryPlan, ExpiryResult, PlannedSnapshot, RemovedFile
from metaservice.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from metaservice.lifecycle.iceberg import Snapshots, TableFile

log = logging.getLogger(__name__)

CatalogLoader = Callable[[Settings], "Catalog"]


class CatalogUnavailable(ServiceError):
    """The Iceberg catalog or its storage cannot be used right now (or pyiceberg is not
    installed); the message says what to check."""

    status = 503
    code = "catalog_unavailable"


def expire_table(
    db: Database,
    ctx: Context,
    table: str,
    *,
    dry_run: bool = False,
    load_catalog: CatalogLoader | None = None,
) -> ExpiryResult:
    """Expire the snapshots of ``table`` that are not in use (or, ``dry_run``, list them).

    ``load_catalog`` opens the tables' catalog (default: ``lifecycle.iceberg.load_catalog``),
    only when the plan lists something; a catalog that cannot be opened, or that lacks the
    table, is an error before anything changes::

        result = expire_table(db, ctx, "ods.orders")
        print(result.snapshots_removed, result.files_removed, result.bytes_freed)
    """
    plan = db.read(lambda session: service.expiry_plan(session, ctx, table, for_expiry=True))
    if not plan.expirable:
        return _result(plan, dry_run, [], [], [], [])
    catalog = open_catalog(ctx.settings, load_catalog, "expiring snapshots")
    from metaservice.lifecycle import iceberg

    try:
        found = _load_table(catalog, plan)
        if dry_run:
            return _preview(iceberg.Snapshots(found), plan)
        _drop_ended_tags(db, ctx, catalog, plan)
        reserved = db.write(lambda session: service.reserve_expiry(session, ctx, table))
        if not reserved.expirable:
            return _result(reserved, False, [], [], [], [])
        return _execute(db, ctx, catalog, reserved)
    finally:
        iceberg.close_catalog(catalog)


def _drop_ended_tags(db: Database, ctx: Context, catalog: Catalog, plan: ExpiryPlan) -> None:
    """Remove the Iceberg tags of the table's ended tags (retained ones past their time):
    the plan keeps their snapshots no more, and their refs would keep them in Iceberg."""
    from metaservice.versions.tags.publish import drop_ended

    try:
        drop_ended(db, ctx, catalog, plan.table)
    except Exception as exc:
        raise _unavailable(
            plan, "removing the Iceberg tags of its ended tags", exc, reserved=False
        ) from exc


def _preview(now: Snapshots, plan: ExpiryPlan) -> ExpiryResult:
    from metaservice.lifecycle import iceberg

    heads = now.ref_heads()
    gone = [s for s in plan.expirable if s.snapshot_id not in now.ids]
    held = [s.snapshot_id for s in plan.expirable if s.snapshot_id in heads]
    removable = [
        s for s in plan.expirable if s.snapshot_id in now.ids and s.snapshot_id not in heads
    ]
    files = iceberg.unused_files(now, [s.snapshot_id for s in removable], now)
    return _result(plan, True, removable, gone, held, files)


def _execute(db: Database, ctx: Context, catalog: Catalog, plan: ExpiryPlan) -> ExpiryResult:
    from metaservice.lifecycle import iceberg

    # Loaded after the reservation: a snapshot reported meanwhile is in the table here.
    before = iceberg.Snapshots(_load_table(catalog, plan, reserved=True))
    reserved = [s.snapshot_id for s in plan.expirable]
    try:
        table, ids = iceberg.remove_snapshots(catalog, plan.table, reserved)
    except Exception as exc:
        raise _unavailable(plan, "removing its snapshots from the catalog", exc) from exc
    after, mine = iceberg.Snapshots(table), set(ids)
    removed = [s for s in plan.expirable if s.snapshot_id in mine]
    # Neither in the table nor removed here: gone before, or an overlapping run removed
    # them (and deletes their files).
    gone = [s for s in plan.expirable if s.snapshot_id not in after.ids | mine]
    held = [s.snapshot_id for s in plan.expirable if s.snapshot_id in after.ids]
    db.write(lambda session: service.record_expired(session, ctx, plan.table, removed + gone))
    unused = iceberg.unused_files(before, [s.snapshot_id for s in removed], after)
    try:
        deleted = iceberg.delete_files(after.io, unused)
    except Exception as exc:
        raise _unavailable(
            plan,
            f"deleting the files of its {len(removed)} expired snapshots (they are removed "
            "and recorded; files not deleted stay as orphans)",
            exc,
        ) from exc
    result = _result(plan, False, removed, gone, held, deleted)
    _log(result, held)
    return result


def _result(
    plan: ExpiryPlan,
    dry_run: bool,
    removed: list[PlannedSnapshot],
    gone: list[PlannedSnapshot],
    held: list[int],
    files: list[TableFile],
) -> ExpiryResult:
    return ExpiryResult(
        table=plan.table,
        dry_run=dry_run,
        snapshots=removed,
        already_gone=[s.snapshot_id for s in gone],
        held_by_refs=held,
        files=[RemovedFile(path=f.path, kind=f.kind, bytes=f.bytes) for f in files],
        snapshots_removed=len(removed),
        files_removed=len(files),
        bytes_freed=sum(f.bytes for f in files),
        expiry_horizon=plan.expiry_horizon,
    )


def _log(result: ExpiryResult, held: list[int]) -> None:
    if result.snapshots_removed or result.already_gone:
        log.info(
            "expired %d snapshots of %s (%d already gone), %d files, %d bytes freed",
            result.snapshots_removed,
            result.table,
            len(result.already_gone),
            result.files_removed,
            result.bytes_freed,
        )
    if held:
        log.info("kept snapshots %s of %s: a branch or tag points at them", held, result.table)


def open_catalog(
    settings: Settings, load_catalog: CatalogLoader | None = None, doing: str = "this"
) -> Catalog:
    """The jobs' catalog, opened by ``load_catalog`` (default:
    ``lifecycle.iceberg.load_catalog``); 503 ``catalog_unavailable`` when it cannot be
    opened, or when pyiceberg is not installed (``doing`` names what needed it)."""
    try:
        from metaservice.lifecycle import iceberg
    except ModuleNotFoundError as exc:
        raise CatalogUnavailable(
            f"{doing} needs pyiceberg ({exc.name!r} is not installed): install "
            "the service with pip install 'metaservice[server,iceberg]'"
        ) from exc
    try:
        return (load_catalog or iceberg.load_catalog)(settings)
    except Exception as exc:
        raise CatalogUnavailable(
            f"cannot open the Iceberg catalog: {exc}. The service uses the jobs' catalog: "
            "METASERVICE_CATALOG_PROPERTIES, else a SQL catalog in METASERVICE_DB_URL with "
            "tables under METASERVICE_WAREHOUSE"
        ) from exc


def _load_table(catalog: Catalog, plan: ExpiryPlan, *, reserved: bool = False) -> Table:
    from metaservice.lifecycle import iceberg

    try:
        found = iceberg.load_table(catalog, plan.table)
    except Exception as exc:
        raise _unavailable(plan, "loading it from the catalog", exc, reserved=reserved) from exc
    if found is None:
        raise Conflict(
            f"table '{plan.table}' has {len(plan.expirable)} reported snapshots to expire "
            f"but is not in the Iceberg catalog '{catalog.name}': check that the service "
            "uses the jobs' catalog (METASERVICE_CATALOG_PROPERTIES, else METASERVICE_DB_URL "
            "and METASERVICE_WAREHOUSE)",
            field="table",
            code="not_in_catalog",
        )
    return found


def _unavailable(
    plan: ExpiryPlan, doing: str, exc: Exception, *, reserved: bool = True
) -> CatalogUnavailable:
    log.warning("expiry of %s failed while %s", plan.table, doing, exc_info=exc)
    reason = (str(exc).strip().splitlines() or [""])[0][:300]
    then = (
        "The reservation stands (no version below its horizon is handed out); run the expiry again"
        if reserved
        else "Nothing was changed; try again"
    )
    return CatalogUnavailable(
        f"expiry of '{plan.table}' failed while {doing}: {type(exc).__name__}: {reason}. "
        f"{then} once the catalog and its storage are reachable"
    )
