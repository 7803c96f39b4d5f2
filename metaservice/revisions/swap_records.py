"""The swap of a revision in the database: superseding the original writers
(:func:`begin_swap`), moving the revision jobs on, and renaming the tables' records in one
transaction (:func:`finish_swap`). The catalog's side, and the order of the two, is
``revisions.swap``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.barriers import service as barrier_service
from metaservice.context import Context
from metaservice.errors import Conflict
from metaservice.lifecycle import repository as retention_repo
from metaservice.models import Job, Table
from metaservice.models.revisions import (
    CANCELLED,
    FOLLOWED,
    READY,
    SWAPPED,
    SWAPPING,
)
from metaservice.revisions import repository as repo
from metaservice.revisions.names import revision_job_name
from metaservice.revisions.repository import Affected
from metaservice.revisions.schemas import RevisionView
from metaservice.revisions.service import unknown_revision, view
from metaservice.revisions.swap_waits import swap_waits_for
from metaservice.topology import repository as topo
from metaservice.topology.graph import job_node
from metaservice.versions import repository as lease_repo

log = logging.getLogger(__name__)


# Where the original goes at the swap: ``dw.detail`` -> ``dw.detail__pre_rev7``.
pre_revision_name = repo.pre_revision_name


def begin_swap(session: Session, ctx: Context, revision_id: int) -> RevisionView:
    """Supersede the original writers (state ``swapping``) of a ready revision (a write
    transaction). A swapping or swapped revision is answered as it is. 409 ``not_ready``
    and ``revision_cancelled`` change nothing."""
    revision = repo.lock(session, revision_id)
    if revision is None:
        raise unknown_revision(revision_id)
    if revision.state in (SWAPPING, SWAPPED):
        return view(session, ctx, revision)
    if revision.state == CANCELLED:
        raise Conflict(
            f"revision {revision_id} is cancelled: its mirrors and jobs are gone. Create a "
            "new revision",
            field="revision_id",
            code="revision_cancelled",
        )
    # an idle revision job counts as caught up, as it does for a reader (a refusal below
    # rolls this back with the rest)
    advance_revision_jobs(session, ctx, revision_id)
    current = view(session, ctx, revision)
    if current.state != READY:
        lag = ctx.settings.revision_ready_lag_ms
        behind = ", ".join(
            f"{m.mirror} at {m.frontier}, {m.table} at {m.original_frontier}"
            for m in current.tables
            if m.lag_ms is None or m.lag_ms > lag
        )
        raise Conflict(
            f"revision {revision_id} is {current.state}, not ready: its mirrors must be "
            f"within {lag} ms of their originals first ({behind or 'its mirrors are being made'}"
            "). Run its jobs (must_run's revision_job) until GET /api/v1/revisions/"
            f"{revision_id} says ready. Nothing was changed",
            field="revision_id",
            code="not_ready",
        )
    repo.set_state(session, revision_id, SWAPPING, ctx.now_ms(), only_from=FOLLOWED)
    session.refresh(revision)
    return view(session, ctx, revision)


def advance_revision_jobs(session: Session, ctx: Context, revision_id: int) -> None:
    """Advance the revision's idle jobs (as a consistent-version read would), so that a
    mirror whose inputs did not change catches up while a swap waits."""
    affected = repo.tables_of(session, [revision_id])[revision_id]
    names = sorted({revision_job_name(a.writer, revision_id) for a in affected})
    jobs = [j for j in (topo.job_by_name(session, n) for n in names) if j is not None]
    barrier_service.advance_idle_many(session, ctx, jobs)


@dataclass(frozen=True)
class Renamed:
    """A swapped table's names in the catalog: the original goes to ``pre``, the mirror
    to ``table``."""

    table: str
    mirror: str
    pre: str


@dataclass(frozen=True)
class ReplacedLog:
    """A log service that holds rows of a swapped table's replaced lineage under the name
    ``table``: the original's (``t``) or the mirror's before the swap (``t__rev<id>``)."""

    table: str
    address: str


# The catalog's part of a swap, in the transaction that swaps the records.
CatalogSide = Callable[[Session, list[Renamed]], None]


@dataclass(frozen=True)
class Swapped:
    """A finished swap: the revision, the renames (for a catalog outside this database)
    and the logs to drop (none when the swap was finished before)."""

    view: RevisionView
    renames: list[Renamed]
    logs: list[ReplacedLog]


def finish_swap(
    session: Session, ctx: Context, revision_id: int, *, catalog_side: CatalogSide
) -> Swapped | None:
    """The swap itself, in this write transaction, once every mirror has reached its
    frozen original and no original writer has a batch open; None while they have not.

    The tables' records are renamed (original ``t`` -> ``t__pre_rev<id>``, mirror ->
    ``t``), so the revision jobs write the tables by their names from the commit on, and a
    consistent version resolves the names all before or all after it. ``catalog_side``:
    the catalog's part, in this same transaction (``revisions.swap``: the renames of a
    SQL catalog in this database, or the journal of another catalog's renames).

    The logs published for the originals and the mirrors are un-published in the same
    transaction: what they hold is the replaced lineage (or the mirror's rows under a
    name that is gone), and nothing logs the swapped tables until their writers register
    again and publish. Their addresses are returned for the caller to drop those rows
    (``revisions.replaced_logs``) once this has committed."""
    revision = repo.lock(session, revision_id)
    if revision is None:
        raise unknown_revision(revision_id)
    affected = repo.tables_of(session, [revision_id])[revision_id]
    renames = [
        Renamed(a.table, a.mirror, pre_revision_name(a.table, revision_id)) for a in affected
    ]
    if revision.state == SWAPPED:
        # the logs were un-published by the swap: any published since is a new writer's
        return Swapped(view(session, ctx, revision), renames, [])
    if revision.state != SWAPPING:
        raise Conflict(
            f"revision {revision_id} was cancelled while it was being swapped; its original "
            "writers are no longer superseded",
            field="revision_id",
            code="revision_cancelled",
        )
    originals, revised = _lock_jobs(session, ctx, revision_id, affected)
    waits = swap_waits_for(session, ctx, revision_id, affected, originals, revised)
    if waits is not None:
        log.info("revision %d waits to swap: %s", revision_id, waits)
        return None
    front = fr.frontiers(session, ctx, list(revised.values()))
    reached = {a.table_id: front[revised[a.writer].id] for a in affected}
    mirrors = topo.tables_by_names(session, [a.mirror for a in affected])
    lease_repo.lock_tables(
        session, [a.table_id for a in affected] + [t.id for t in mirrors.values()], exclusive=True
    )
    published = repo.unpublish_logs(
        session, [a.table_id for a in affected] + [t.id for t in mirrors.values()]
    )
    logs = [
        ReplacedLog(name, published[table_id])
        for a in affected
        for name, table_id in ((a.table, a.table_id), (a.mirror, mirrors[a.mirror].id))
        if table_id in published
    ]
    _retention_follows_the_name(session, ctx, affected, mirrors)
    for a, r in zip(affected, renames, strict=True):
        repo.rename_table(session, a.table_id, r.pre)
    for a in affected:
        repo.rename_table(session, mirrors[a.mirror].id, a.table)
    catalog_side(session, renames)
    repo.set_frontiers(session, revision_id, reached)
    repo.set_state(session, revision_id, SWAPPED, ctx.now_ms(), only_from=[SWAPPING])
    topo.bump_topology_version(session)  # the graph names the tables
    session.flush()
    session.refresh(revision)
    return Swapped(view(session, ctx, revision), renames, logs)


def _retention_follows_the_name(
    session: Session, ctx: Context, affected: list[Affected], mirrors: dict[str, Table]
) -> None:
    """A table's own retention policy follows its name: the mirror that becomes ``t``
    gets the original's (in place of one of its own; none: the mirror's stays), and the
    original, now ``t__pre_rev<id>``, keeps it too, so what it kept for its readers stays
    kept."""
    now = ctx.now_ms()
    for a in affected:
        own = retention_repo.retention(session, a.table_id)
        if own is not None:
            retention_repo.set_retention(
                session, mirrors[a.mirror].id, own.keep_last, own.keep_for_seconds, now
            )


def _lock_jobs(
    session: Session, ctx: Context, revision_id: int, affected: list[Affected]
) -> tuple[dict[str, Job], dict[str, Job]]:
    """The original writers and their revision jobs (by original name), locked downstream
    first as an idle job's advance locks them (no deadlock against it)."""
    writers = sorted({a.writer for a in affected})
    jobs: dict[str, Job] = {}
    for name in writers + [revision_job_name(w, revision_id) for w in writers]:
        jobs[name] = topo.require_job(session, name, field="revision_id")
    order = ctx.graph.order(session)
    for name in sorted(jobs, key=lambda n: -order.get(job_node(n), 0)):
        jobs[name] = barrier_repo.lock_job(session, jobs[name].id)
    originals = {w: jobs[w] for w in writers}
    revised = {w: jobs[revision_job_name(w, revision_id)] for w in writers}
    return originals, revised
