"""Swapping a ready revision's mirrors in for their originals: the records and the catalog.

``swap_revision``:

1. ``swap_records.begin_swap``: 409 ``not_ready`` unless the revision is ready; from its commit
   on, the original writers are superseded (no new batch; their open batches' reports are
   still recorded).
2. Wait until each mirror's frontier reaches its original's, which no longer moves once
   their open batches are reported (idle revision jobs are advanced meanwhile).
3. ``swap_records.finish_swap``: one transaction renames the tables' records (original ``t``
   -> ``t__pre_rev<id>``, mirror ``t__rev<id>`` -> ``t``) and the catalog's side:

   - a pyiceberg SQL catalog in the MetaService's own database (the default) has its
     tables renamed in that same transaction: records and catalog go from all-old to
     all-new in one commit;
   - any other catalog cannot share it, so the transaction writes the catalog's renames
     as a **journal** (``revision_swap_steps``): every original to its ``__pre_rev`` name
     first, then every mirror to its original's name.

4. The journal's steps are done in order (``catalog_steps.resume``). Each asks the
   catalog first: a step whose table is at its target already (the revision's mirror,
   told by its ``metaservice.revision`` property, or the original, which is not) is only
   recorded done; so a retry after any failure, even one whose reply was lost, finishes
   the same renames, and a swap of a swapped revision changes nothing. Until the last step
   is done, expiry and new revisions of the tables the journal names are refused (409
   ``swap_unfinished``): the catalog's table of a name is not yet the one the records
   name. A swapped revision cannot be cancelled (409 ``revision_swapped``).
5. The log services that held the originals or the mirrors (their logs were un-published
   in 3) drop those rows and move to a new epoch (``revisions.replaced_logs``; best
   effort, one warning for a log service down).

While the journal is unfinished, a reader loading a swapped table by name from the
catalog may get the original's metadata or no table, and then a snapshot the MetaService
no longer names for it: an error, never a mix. No version goes back.

pyiceberg is imported only when the catalog is used.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from metaservice.auth.log_services import log_service_check
from metaservice.catalog_steps import Step, StepBlocked, resume
from metaservice.context import Context
from metaservice.db import Database, normalise_url
from metaservice.errors import Conflict, ServiceError
from metaservice.lifecycle.catalog import (
    CatalogLoader,
    CatalogUnavailable,
    first_line,
    open_catalog,
)
from metaservice.models.revisions import SWAPPED
from metaservice.revisions import replaced_logs, service, swap_records
from metaservice.revisions import repository as repo
from metaservice.revisions import swap_repository as journal
from metaservice.revisions.schemas import RevisionView
from metaservice.revisions.swap_repository import MOVES_MIRROR, MOVES_ORIGINAL, Journaled
from metaservice.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

# How often a swap looks again whether the mirrors reached the frozen originals.
SWAP_POLL_SECONDS = 0.2


def catalog_in_database(settings: Settings) -> str | None:
    """The name of the jobs' catalog when it is a pyiceberg SQL catalog in the
    MetaService's own database (the default), whose tables a swap renames in its own
    transaction; None for any other catalog."""
    from metaservice.catalog_loading import CATALOG_NAME, is_sql_catalog
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
    """Swap a ready revision (see the module's docstring); returns it ``swapped``, or
    ``swapping`` when the mirrors have not reached the frozen originals within
    ``wait_seconds`` (a later call continues). A swapped revision is answered as it is,
    once any catalog step left is done::

        view = swap_revision(db, ctx, 7, wait_seconds=30)
        assert view.state in ("swapping", "swapped")
    """
    db.read(lambda session: service.get_revision(session, ctx, revision_id))  # 404 first
    in_catalog = catalog_in_database(ctx.settings)
    catalog = None if in_catalog else open_catalog(ctx.settings, load_catalog, "swapping")
    from metaservice.lifecycle.iceberg import close_catalog

    try:
        started = db.write(lambda session: swap_records.begin_swap(session, ctx, revision_id))
        logs: list[swap_records.ReplacedLog] = []
        if started.state != SWAPPED:
            if catalog is not None:
                _check_catalog_or_unavailable(catalog, started)
            done = _swap_records(db, ctx, revision_id, wait_seconds, in_catalog)
            if done is None:
                return db.read(lambda session: service.get_revision(session, ctx, revision_id))
            started, logs = done.view, done.logs
        try:
            if catalog is not None:
                finish_steps(db, ctx, catalog, revision_id)
        finally:
            # after the renames: a reader the reset sends to the snapshots loads the
            # swapped-in table by its name
            replaced_logs.drop_replaced(revision_id, logs, log_service_check(db, ctx))
        return started
    finally:
        if catalog is not None:
            close_catalog(catalog)


def _swap_records(
    db: Database, ctx: Context, revision_id: int, wait_seconds: float, in_catalog: str | None
) -> swap_records.Swapped | None:
    """Steps 2 and 3: the swapped revision, or None when the mirrors have not reached the
    frozen originals within ``wait_seconds``."""

    def catalog_side(session: Session, renames: list[swap_records.Renamed]) -> None:
        if in_catalog is not None:
            rename_in_database_catalog(session, in_catalog, renames)
        else:
            journal.add_steps(session, revision_id, journal_of(renames))

    deadline = time.monotonic() + wait_seconds
    while True:
        db.write(lambda session: swap_records.advance_revision_jobs(session, ctx, revision_id))
        done = db.write(
            lambda session: swap_records.finish_swap(
                session, ctx, revision_id, catalog_side=catalog_side
            )
        )
        if done is not None or time.monotonic() >= deadline:
            return done
        time.sleep(SWAP_POLL_SECONDS)


# -- a catalog in the MetaService's database -------------------------------------------------


def _split(identifier: str) -> tuple[str, str]:
    namespace, _, name = identifier.rpartition(".")
    return namespace, name


def rename_in_database_catalog(
    session: Session, catalog: str, renames: list[swap_records.Renamed]
) -> None:
    """Rename the tables of the SQL catalog ``catalog`` in this database, in this
    transaction; 409 ``not_in_catalog`` (rolling it back) when one is missing."""
    for step in ("pre", "mirror"):
        for r in renames:
            source, target = (r.table, r.pre) if step == "pre" else (r.mirror, r.table)
            if not repo.rename_catalog_table(session, catalog, _split(source), _split(target)):
                raise Conflict(
                    f"the Iceberg table '{source}' is not in the catalog '{catalog}' in the "
                    "MetaService's database, so it cannot be renamed to "
                    f"'{target}'. Nothing was changed",
                    field="revision_id",
                    code="not_in_catalog",
                )


# -- a catalog outside it: the journal ---------------------------------------------------------


def journal_of(renames: list[swap_records.Renamed]) -> list[Journaled]:
    """The catalog's renames in order: every original away first, so that no name ever
    holds two tables, then every mirror to its original's name."""
    away = [(r.table, r.pre, MOVES_ORIGINAL) for r in renames]
    into = [(r.mirror, r.table, MOVES_MIRROR) for r in renames]
    return [
        Journaled(position, source, target, moves, False)
        for position, (source, target, moves) in enumerate([*away, *into])
    ]


def _check_catalog_or_unavailable(catalog: Catalog, revision: RevisionView) -> None:
    try:
        _check_catalog(catalog, revision)
    except ServiceError:
        raise
    except Exception as exc:
        log.warning("looking up the tables of revision %d failed", revision.id, exc_info=exc)
        raise CatalogUnavailable(
            f"looking up the tables of revision {revision.id} in the catalog failed: "
            f"{first_line(exc)}. Nothing was swapped yet (the original writers stay "
            f"stopped); POST /api/v1/revisions/{revision.id}/swap again once the catalog is "
            "reachable"
        ) from exc


def _check_catalog(catalog: Catalog, revision: RevisionView) -> None:
    """Before the records are swapped (which cannot be undone): every original and mirror
    is in the catalog, and no table has an original's ``__pre_rev`` name. 409
    ``not_in_catalog`` / ``swap_blocked`` otherwise, with nothing swapped yet."""
    from metaservice.lifecycle.iceberg import load_table

    for m in revision.tables:
        pre = swap_records.pre_revision_name(m.table, revision.id)
        original, mirror = load_table(catalog, m.table), load_table(catalog, m.mirror)
        if original is None or _is_mirror(original, revision.id) or mirror is None:
            missing = m.mirror if original is not None and mirror is None else m.table
            raise Conflict(
                f"the Iceberg table '{missing}' is not in the catalog (or is not what revision "
                f"{revision.id} made), so revision {revision.id} cannot be swapped. Check "
                "that the service uses the jobs' catalog; the revision stays swapping (its "
                "original writers stay stopped): fix the catalog and POST /swap again, or "
                f"DELETE /api/v1/revisions/{revision.id} to cancel it",
                field="revision_id",
                code="not_in_catalog",
            )
        if load_table(catalog, pre) is not None:
            raise Conflict(
                f"the catalog has a table '{pre}' already: the swap moves '{m.table}' "
                f"there. Rename or drop it, then POST /api/v1/revisions/{revision.id}/swap "
                "again. Nothing was swapped yet",
                field="revision_id",
                code="swap_blocked",
            )


def finish_steps(db: Database, ctx: Context, catalog: Catalog, revision_id: int) -> None:
    """Do the journal's steps not done yet (none: nothing happens). 503
    ``catalog_unavailable`` when the catalog fails, 409 ``swap_blocked`` when it holds
    something a step cannot move on from; either way the steps done stay recorded and a
    later swap carries on."""
    steps = db.read(lambda session: journal.steps_of(session, revision_id))
    left = [s for s in steps if not s.done]
    if not left:
        return

    def record_done(step: Step) -> None:
        db.write(
            lambda session: journal.mark_done(session, revision_id, step.position, ctx.now_ms())
        )

    try:
        for step in resume([_rename_step(catalog, revision_id, s) for s in left], record_done):
            log.info("revision %d: %s", revision_id, step.what)
    except StepBlocked as exc:
        raise Conflict(
            f"revision {revision_id} is swapped in the MetaService, but its catalog renames "
            f"cannot be finished: {exc}. Fix the catalog, then POST /api/v1/revisions/"
            f"{revision_id}/swap again; {_left(db, revision_id)}",
            field="revision_id",
            code="swap_blocked",
        ) from exc
    except Exception as exc:
        log.warning("renaming the tables of revision %d failed", revision_id, exc_info=exc)
        raise CatalogUnavailable(
            f"renaming the tables of revision {revision_id} in the catalog failed: "
            f"{first_line(exc)}. The MetaService has swapped them; POST /api/v1/revisions/"
            f"{revision_id}/swap again (metaservice revision swap {revision_id}) finishes "
            f"the same renames once the catalog is reachable; {_left(db, revision_id)}"
        ) from exc


def _left(db: Database, revision_id: int) -> str:
    steps = db.read(lambda session: journal.steps_of(session, revision_id))
    todo = ", ".join(f"{s.source} -> {s.target}" for s in steps if not s.done)
    return (
        f"renames left: {todo}. Until they are done, expiring or revising these tables is refused"
    )


def _rename_step(catalog: Catalog, revision_id: int, step: Journaled) -> Step:
    """A journaled rename as a step that asks the catalog first."""
    from metaservice.lifecycle.iceberg import load_table

    def moved(table: Table) -> bool:
        return _is_mirror(table, revision_id) == (step.moves == MOVES_MIRROR)

    which = f"revision {revision_id}'s mirror" if step.moves == MOVES_MIRROR else "the original"

    def done() -> bool:
        at_target = load_table(catalog, step.target)
        if at_target is not None:
            if moved(at_target):
                return True
            raise StepBlocked(
                f"the catalog's table '{step.target}' is not {which}; rename or drop it"
            )
        at_source = load_table(catalog, step.source)
        if at_source is None or not moved(at_source):
            raise StepBlocked(
                f"{which} is neither at '{step.source}' nor at '{step.target}' in the catalog"
            )
        return False

    return Step(
        position=step.position,
        what=f"renamed {step.source} -> {step.target}",
        done=done,
        act=lambda: catalog.rename_table(step.source, step.target),
    )


def _is_mirror(table: Table, revision_id: int) -> bool:
    from metaservice.revisions.iceberg import REVISION_PROPERTY

    return table.metadata.properties.get(REVISION_PROPERTY) == str(revision_id)


# -- what the swap's tables refuse until it is done ----------------------------------------------


def refuse_unfinished_swap(session: Session, tables: list[str], doing: str) -> None:
    """409 ``swap_unfinished`` when one of ``tables`` is named by a swap whose catalog
    renames are not all done yet: the catalog's table of that name may not be the one the
    MetaService names. ``doing``: what is refused (``expiring``, ``revising``)."""
    pending = journal.unfinished_naming(session, tables)
    if pending:
        name, revision_id = sorted(pending.items())[0]
        raise Conflict(
            f"{doing} '{name}' is refused until revision {revision_id}'s swap has finished "
            "renaming its tables in the catalog (until then the catalog's table of that "
            "name is not the one the MetaService names). POST /api/v1/revisions/"
            f"{revision_id}/swap (metaservice revision swap {revision_id}) finishes it",
            field="table",
            code="swap_unfinished",
        )


def refuse_cancel_swapped(session: Session, revision_id: int) -> None:
    """409 ``revision_swapped``: a swapped revision's tables are the tables now, and the
    originals' writers are stopped; cancelling would drop what readers read. Locks the
    revision's row, so a swap finishing meanwhile is seen."""
    revision = repo.lock(session, revision_id)
    if revision is not None and revision.state == SWAPPED:
        unfinished = any(not s.done for s in journal.steps_of(session, revision_id))
        raise Conflict(
            f"revision {revision_id} is swapped: its tables have replaced the originals, so "
            "it cannot be cancelled. To change them again, revise them"
            + (
                f"; its catalog renames are unfinished: POST /api/v1/revisions/{revision_id}"
                "/swap finishes them"
                if unfinished
                else ""
            ),
            field="revision_id",
            code="revision_swapped",
        )
