"""Executing an expiry (G5): reserve, remove the snapshots through pyiceberg, record them,
delete the files only they referenced.

0. Read the plan; when it lists something, open the catalog and find the table there
   (errors here change nothing).
1. Drop the Iceberg tags of the table's ended (retained) tags, so that their snapshots
   may go (``tags.publish.drop_ended``: each removal re-checks its tag's record, and a
   tag made again under the name meanwhile stays).
2. Reserve (``service.reserve_expiry``, its own transaction): under the table's lock the
   plan is recomputed and the table's expiry horizon raised above everything it lists,
   so from its commit on no version or lease names those snapshots. A lease granted
   before it is in the plan; one asked for while the rest runs sees the horizon. The
   expiry acts on nothing else than what the reservation returned.
3. Remove the reserved snapshots from the Iceberg table in one commit (branch and tag
   heads are left in: whatever a ref uses stays). Tagged snapshots are not even
   reserved (``service``'s plan keeps them).
4. Record them (``expired_snapshots``), so no plan lists them again.
5. Delete the files only they reached that the service owns: under the table's location
   or a configured log spill location (``lifecycle.iceberg``); any other path a
   snapshot's metadata names is logged and left, and listed in ``refused_files``.

A dry run and a run decide through one function (:func:`_decide`): which listed
snapshots the table still has, which a ref holds (not counting the Iceberg tags of ended
tags, which a run drops first), which files only they reach and which of those are
owned. A dry run reserves nothing and changes nothing: it shows what a run would remove
now (a lease taken before the real run still keeps its snapshot, and the real run then
leaves it).

A crash between 3 and 4 leaves snapshots removed but unrecorded: the next run finds
them gone from the table and records them (``already_gone``). A crash between 3 and 5
leaves their files behind as orphans.

pyiceberg is imported only when there is something to remove: the service itself runs
without the ``iceberg`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from metaservice.context import Context
from metaservice.db import Database
from metaservice.errors import Conflict
from metaservice.lifecycle import service
from metaservice.lifecycle.catalog import CatalogLoader, CatalogUnavailable, open_catalog
from metaservice.lifecycle.schemas import (
    ExpiryPlan,
    ExpiryResult,
    PlannedSnapshot,
    RefusedFile,
    RemovedFile,
)
from metaservice.versions.tags import publish as tags_publish
from metaservice.versions.tags import service as tags

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from sqlalchemy.orm import Session

    from metaservice.lifecycle.iceberg import Snapshots, TableFile

__all__ = ["CatalogLoader", "CatalogUnavailable", "expire_table", "open_catalog"]

log = logging.getLogger(__name__)


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
        return _result(plan, dry_run, Decision())
    catalog = open_catalog(ctx.settings, load_catalog, "expiring snapshots")
    from metaservice.lifecycle import iceberg

    try:
        found = iceberg.Snapshots(_load_table(catalog, plan))
        if dry_run:
            ending = db.read(lambda session: _ended_tags(session, ctx, table))
            return _result(plan, True, _decide(ctx, plan, found, found, ending))
        _drop_ended_tags(db, ctx, catalog, plan)
        reserved = db.write(lambda session: service.reserve_expiry(session, ctx, table))
        if not reserved.expirable:
            return _result(reserved, False, Decision())
        return _execute(db, ctx, catalog, reserved)
    finally:
        iceberg.close_catalog(catalog)


@dataclass
class Decision:
    """What an expiry does with the snapshots its plan lists, and with their files."""

    removed: list[PlannedSnapshot] = field(default_factory=list)  # dry run: to remove
    gone: list[PlannedSnapshot] = field(default_factory=list)  # no longer in the table
    held: list[int] = field(default_factory=list)  # a branch or tag points at them
    files: list[TableFile] = field(default_factory=list)  # only they reached: deleted
    # Only they reached, but not the service's: left (with the snapshot that names it).
    refused: list[tuple[TableFile, int]] = field(default_factory=list)


def _decide(
    ctx: Context,
    plan: ExpiryPlan,
    before: Snapshots,
    after: Snapshots,
    ending: Collection[tuple[str, int]] = (),
    removed_now: Collection[int] | None = None,
) -> Decision:
    """The one rule for a dry run and a run: the snapshots as :func:`_sort` sorts them,
    and the files only the removed ones reached in ``before``: deleted if the service
    owns them, refused otherwise. A dry run decides on the table as it is (``before`` is
    ``after``); a run, on the table before and after its removal commit."""
    from metaservice.lifecycle import iceberg

    decision = _sort(plan, after, ending, removed_now)
    roots = iceberg.owned_roots(after.table, plan.table, ctx.settings.log_spill_locations)
    doomed = iceberg.unused_files(
        before, [s.snapshot_id for s in decision.removed], after, iceberg.owned_by(roots)
    )
    decision.files, decision.refused = doomed.files, doomed.refused
    return decision


def _sort(
    plan: ExpiryPlan,
    now: Snapshots,
    ending: Collection[tuple[str, int]] = (),
    removed_now: Collection[int] | None = None,
) -> Decision:
    """Of the listed snapshots, those the table ``now`` no longer has are gone, those a
    ref points at (the Iceberg tags in ``ending``, which a run drops first, not
    counted) are held, the rest are removed. After a removal commit, ``removed_now``
    are the ones it removed (it leaves those that became a ref's head meanwhile)."""
    if removed_now is None:
        heads = now.ref_heads(ending)
        removed = [
            s for s in plan.expirable if s.snapshot_id in now.ids and s.snapshot_id not in heads
        ]
        gone = [s for s in plan.expirable if s.snapshot_id not in now.ids]
    else:
        # Neither in the table nor removed here: gone before, or an overlapping run
        # removed them (and deletes their files).
        mine = set(removed_now)
        removed = [s for s in plan.expirable if s.snapshot_id in mine]
        gone = [s for s in plan.expirable if s.snapshot_id not in now.ids | mine]
    taken = {s.snapshot_id for s in removed}
    held = [s.snapshot_id for s in plan.expirable if s.snapshot_id in now.ids - taken]
    return Decision(removed, gone, held)


def _ended_tags(session: Session, ctx: Context, table: str) -> set[tuple[str, int]]:
    """The Iceberg tags (name, snapshot) a run drops before it reserves."""
    ended = tags.ended_on_table(session, ctx, table)
    return {(t.name, t.snapshot_id) for t in ended if t.snapshot_id is not None}


def _drop_ended_tags(db: Database, ctx: Context, catalog: Catalog, plan: ExpiryPlan) -> None:
    """Remove the Iceberg tags of the table's ended tags (retained ones past their time):
    the plan keeps their snapshots no more, and their refs would keep them in Iceberg."""
    try:
        tags_publish.drop_ended(db, ctx, catalog, plan.table)
    except Exception as exc:
        raise _unavailable(
            plan, "removing the Iceberg tags of its ended tags", exc, reserved=False
        ) from exc


def _execute(db: Database, ctx: Context, catalog: Catalog, plan: ExpiryPlan) -> ExpiryResult:
    from metaservice.lifecycle import iceberg

    # Loaded after the reservation: a snapshot reported meanwhile is in the table here.
    before = iceberg.Snapshots(_load_table(catalog, plan, reserved=True))
    listed = _sort(plan, before)
    try:
        table, ids = iceberg.remove_snapshots(
            catalog, plan.table, [s.snapshot_id for s in listed.removed]
        )
    except Exception as exc:
        raise _unavailable(plan, "removing its snapshots from the catalog", exc) from exc
    done = _decide(ctx, plan, before, iceberg.Snapshots(table), removed_now=ids)
    db.write(
        lambda session: service.record_expired(session, ctx, plan.table, done.removed + done.gone)
    )
    try:
        done.files = iceberg.delete_files(table.io, done.files)
    except Exception as exc:
        raise _unavailable(
            plan,
            f"deleting the files of its {len(done.removed)} expired snapshots (they are "
            "removed and recorded; files not deleted stay as orphans)",
            exc,
        ) from exc
    result = _result(plan, False, done)
    _log(result)
    return result


def _result(plan: ExpiryPlan, dry_run: bool, d: Decision) -> ExpiryResult:
    return ExpiryResult(
        table=plan.table,
        dry_run=dry_run,
        snapshots=d.removed,
        already_gone=[s.snapshot_id for s in d.gone],
        held_by_refs=d.held,
        files=[RemovedFile(path=f.path, kind=f.kind, bytes=f.bytes) for f in d.files],
        refused_files=[
            RefusedFile(path=f.path, kind=f.kind, snapshot_id=snapshot) for f, snapshot in d.refused
        ],
        snapshots_removed=len(d.removed),
        files_removed=len(d.files),
        bytes_freed=sum(f.bytes for f in d.files),
        expiry_horizon=plan.expiry_horizon,
    )


def _log(result: ExpiryResult) -> None:
    if result.snapshots_removed or result.already_gone:
        log.info(
            "expired %d snapshots of %s (%d already gone), %d files, %d bytes freed",
            result.snapshots_removed,
            result.table,
            len(result.already_gone),
            result.files_removed,
            result.bytes_freed,
        )
    if result.held_by_refs:
        log.info(
            "kept snapshots %s of %s: a branch or tag points at them",
            result.held_by_refs,
            result.table,
        )
    for f in result.refused_files:
        log.warning(
            "expiry of %s left %s file %r that its expired snapshot %d names: it is neither "
            "under the table's location nor under a log spill location "
            "(METASERVICE_LOG_SPILL_LOCATIONS), so the service does not own it",
            result.table,
            f.kind,
            f.path,
            f.snapshot_id,
        )


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
