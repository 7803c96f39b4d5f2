"""The rules of revisions, in the database: the records and their views, and what expiry
needs to know. The rest of a revision's database side has a module each:
``revisions.planning`` (the affected set, where each mirror starts, the refusals),
``revisions.swap_records`` (the swap's records) and ``revisions.swap_waits`` (what a
swapping revision waits for); ``revisions.names`` names mirrors and revision jobs.

Revising table ``T`` from barrier ``B``:

- The **affected set** is ``T``, the other outputs of ``T``'s writer (a job writes all
  its outputs in one batch, so revising one revises them all) and everything downstream
  of those in the topology graph.
- Each affected table's mirror starts at its **snapshot at B** (the latest reported
  snapshot with a barrier at or below ``B``; none: the table was empty at ``B``).
- **Refusals** (nothing is changed): an unknown table (404), an affected table with no
  writer (409 ``no_writer``), one whose frontier has not reached ``B`` (409
  ``not_reached``: its state at ``B`` is not final yet), a derived one not exact at ``B``
  (409 ``not_exact``: its batch around ``B`` also holds data after it), ``B`` below an
  affected table's expiry horizon or a start snapshot that was expired (409
  ``expired``), an affected table in an active revision already (409
  ``revision_overlaps``).

The record is made (state ``creating``) before the mirrors, in one transaction that
holds the affected tables' row locks exclusively, as an expiry reservation does: from
its commit on, expiry keeps each start snapshot (``lifecycle.service``), and a
reservation that committed first has raised the horizon the checks here see. The
Iceberg side is ``revisions.mirrors``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.context import Context
from metaservice.contract import on_grid, slot_of
from metaservice.errors import Conflict, Invalid, NotFound
from metaservice.models import Job, Revision
from metaservice.models.revisions import (
    ACTIVE,
    CANCELLED,
    CREATING,
    FOLLOWED,
    PLANNED,
    READY,
    RUNNING,
    SWAPPING,
)
from metaservice.names import check_table_name
from metaservice.revisions import repository as repo
from metaservice.revisions.names import mirror_name, revision_job_name
from metaservice.revisions.planning import plan
from metaservice.revisions.repository import Affected, Kept
from metaservice.revisions.schemas import MirrorInput, MirrorView, MustRun, RevisionView
from metaservice.revisions.swap_waits import swap_waits_for
from metaservice.schemas_common import Page
from metaservice.topology import repository as topo
from metaservice.topology import service as topo_service
from metaservice.topology.schemas import JobSpec

log = logging.getLogger(__name__)


def unknown_revision(revision_id: int) -> NotFound:
    return NotFound(
        f"revision {revision_id} does not exist", field="revision_id", code="unknown_revision"
    )


# -- records ----------------------------------------------------------------------------------


def precheck(session: Session, ctx: Context, table: str, from_barrier: int) -> None:
    """The refusals met before the catalog is opened: 422 for a bad name or a barrier off
    the clock's grid, 404 for an unknown table (``record_revision`` checks them again)."""
    check_table_name(table)
    _check_barrier(ctx, from_barrier)
    topo.require_table(session, table)


def _check_barrier(ctx: Context, from_barrier: int) -> None:
    if not on_grid(from_barrier, ctx.interval):
        raise Invalid(
            f"{from_barrier} is not a barrier: barriers lie on the {ctx.interval} ms grid "
            f"of the barrier clock, e.g. {slot_of(from_barrier, ctx.interval)}",
            field="from_barrier",
            code="off_grid",
        )


def record_revision(session: Session, ctx: Context, table: str, from_barrier: int) -> RevisionView:
    """Plan the revision and record it as ``creating`` (a write transaction); every
    refusal (see the module's docstring) changes nothing."""
    check_table_name(table)
    _check_barrier(ctx, from_barrier)
    planned = plan(session, ctx, table, from_barrier)
    now = ctx.now_ms()
    revision = repo.insert(session, planned.tables[table].id, from_barrier, CREATING, now)
    repo.add_tables(
        session,
        revision.id,
        [
            Affected(
                table_id=t.id,
                table=name,
                mirror=mirror_name(name, revision.id),
                start_snapshot_id=planned.starts[name],
                writer=planned.writers[name].name,
                frontier=from_barrier,
            )
            for name, t in sorted(planned.tables.items())
        ],
    )
    return view(session, ctx, revision)


def mark_planned(session: Session, ctx: Context, revision_id: int) -> RevisionView:
    """Every mirror is made. 409 ``revision_cancelled`` when the revision was cancelled
    meanwhile (the caller then drops the mirrors it made)."""
    if not repo.set_state(session, revision_id, PLANNED, ctx.now_ms(), only_from=[CREATING]):
        raise Conflict(
            f"revision {revision_id} was cancelled while its mirrors were being made; they "
            "are dropped again",
            field="revision_id",
            code="revision_cancelled",
        )
    revision = repo.get(session, revision_id)
    assert revision is not None  # its state was just set
    _register_revision_jobs(session, ctx, revision)
    return view(session, ctx, revision)


def _register_revision_jobs(session: Session, ctx: Context, revision: Revision) -> None:
    """Register each writer's revision job (its affected inputs replaced by their mirrors,
    the mirrors as outputs) and seed it at ``from_barrier``: a committed batch of the
    MetaService's own there, with each mirror's start snapshot, so the mirrors' history
    starts at their start snapshots and the job's first batch reads only what its inputs
    changed after ``from_barrier``."""
    affected = repo.tables_of(session, [revision.id])[revision.id]
    mirrors = {a.table: a.mirror for a in affected}
    outputs: dict[str, list[Affected]] = defaultdict(list)
    for a in affected:
        outputs[a.writer].append(a)
    now = ctx.now_ms()
    for writer, written in sorted(outputs.items()):
        original = topo.require_job(session, writer, field="table")
        name = revision_job_name(writer, revision.id)
        if topo.job_by_name(session, name) is not None:
            raise Conflict(
                f"a job named '{name}' is registered already: it is the name of revision "
                f"{revision.id}'s job for '{writer}'. Nothing was changed",
                field="table",
                code="revision_job_exists",
            )
        inputs = [mirrors.get(t.name, t.name) for t in topo.input_tables(session, original.id)]
        spec = JobSpec(
            inputs=inputs,
            outputs=[a.mirror for a in written],
            description=f"revision {revision.id} of job '{writer}'",
        )
        topo_service.put_job(session, ctx, name, spec)
        job = topo.require_job(session, name)
        tables = topo.tables_by_names(session, [a.mirror for a in written])
        repo.seed_batch(
            session,
            job.id,
            revision.from_barrier,
            now,
            [(tables[a.mirror].id, a.start_snapshot_id) for a in written],
        )
        job.frontier = revision.from_barrier
        job.last_barrier = revision.from_barrier
    session.flush()


def _drop_revision_jobs(session: Session, revision_id: int) -> None:
    """A cancelled revision's jobs and their mirrors' records (the mirrors no other job
    reads)."""
    affected = repo.tables_of(session, [revision_id])[revision_id]
    names = sorted({revision_job_name(a.writer, revision_id) for a in affected})
    jobs = [j for j in (topo.job_by_name(session, n) for n in names) if j is not None]
    if not jobs:
        return
    topo.bump_topology_version(session)  # serialises topology changes from here on
    for job in jobs:
        barrier_repo.lock_job(session, job.id)
        topo.delete_job(session, job.id)
    mirrors = topo.tables_by_names(session, [a.mirror for a in affected])
    repo.delete_tables(session, repo.unread_tables(session, [t.id for t in mirrors.values()]))
    session.flush()


def forget(session: Session, revision_id: int) -> None:
    """Drop the record of a revision whose mirrors could not all be made."""
    revision = repo.get(session, revision_id)
    if revision is not None and revision.state == CREATING:
        repo.delete_revision(session, revision_id)


def mark_cancelled(session: Session, ctx: Context, revision_id: int) -> RevisionView:
    """Cancel the revision (a write transaction); a cancelled one stays cancelled."""
    revision = repo.get(session, revision_id)
    if revision is None:
        raise unknown_revision(revision_id)
    if revision.state != CANCELLED:
        if repo.set_state(session, revision_id, CANCELLED, ctx.now_ms(), only_from=ACTIVE):
            _drop_revision_jobs(session, revision_id)
        session.refresh(revision)
    return view(session, ctx, revision)


def get_revision(session: Session, ctx: Context, revision_id: int) -> RevisionView:
    revision = repo.get(session, revision_id)
    if revision is None:
        raise unknown_revision(revision_id)
    return view(session, ctx, revision)


def list_revisions(session: Session, ctx: Context, limit: int, offset: int) -> Page[RevisionView]:
    """Every revision, newest first (cancelled ones too)."""
    revisions, total = repo.page(session, limit, offset)
    return Page(items=_views(session, ctx, revisions), total=total, limit=limit, offset=offset)


def view(session: Session, ctx: Context, revision: Revision) -> RevisionView:
    return _views(session, ctx, [revision])[0]


def _views(session: Session, ctx: Context, revisions: list[Revision]) -> list[RevisionView]:
    affected = repo.tables_of(session, [r.id for r in revisions])
    names = repo.table_names(session, sorted({r.table_id for r in revisions}))
    wanted = {a.writer for rows in affected.values() for a in rows}
    wanted |= {revision_job_name(a.writer, r) for r, rows in affected.items() for a in rows}
    jobs = {name: topo.job_by_name(session, name) for name in sorted(wanted)}
    known = [j for j in jobs.values() if j is not None]
    front = fr.shown_frontiers(session, ctx, known)
    inputs = {j.name: [t.name for t in topo.input_tables(session, j.id)] for j in known}
    views = []
    for r in revisions:
        follow = _Follow(r, jobs, front)
        tables = [follow.mirror_view(a) for a in affected[r.id]]
        views.append(
            RevisionView(
                id=r.id,
                table=names[r.table_id],
                from_barrier=r.from_barrier,
                state=_state(ctx, r, tables),
                created_ms=r.created_ms,
                updated_ms=r.updated_ms,
                tables=tables,
                must_run=_must_run(r.id, affected[r.id], inputs),
                swap_waits_for=_waits_in_view(session, ctx, r, affected[r.id], jobs),
            )
        )
    return views


def _waits_in_view(
    session: Session,
    ctx: Context,
    revision: Revision,
    affected: list[Affected],
    jobs: dict[str, Job | None],
) -> str | None:
    """What a swapping revision waits for, as a read (nothing locked); None otherwise."""
    if revision.state != SWAPPING:
        return None
    originals: dict[str, Job] = {}
    revised: dict[str, Job] = {}
    for a in affected:
        original, job = jobs.get(a.writer), jobs.get(revision_job_name(a.writer, revision.id))
        if original is None or job is None:
            return None  # a job deleted meanwhile: the swap itself says so
        originals[a.writer], revised[a.writer] = original, job
    return swap_waits_for(session, ctx, revision.id, affected, originals, revised)


@dataclass(frozen=True)
class _Follow:
    """The frontiers of one revision's original writers and revision jobs."""

    revision: Revision
    jobs: dict[str, Job | None]
    front: dict[int, int]

    def frontier_of(self, name: str) -> int | None:
        job = self.jobs.get(name)
        return None if job is None else self.front[job.id]

    def mirror_view(self, a: Affected) -> MirrorView:
        original = self.frontier_of(a.writer)
        mirror = self.frontier_of(revision_job_name(a.writer, self.revision.id))
        frontier = a.frontier if mirror is None else mirror
        return MirrorView(
            table=a.table,
            mirror=a.mirror,
            start_snapshot=a.start_snapshot_id,
            writer=a.writer,
            revision_job=revision_job_name(a.writer, self.revision.id),
            frontier=frontier,
            original_frontier=original,
            lag_ms=None if original is None else max(0, original - frontier),
        )


def _state(ctx: Context, revision: Revision, tables: list[MirrorView]) -> str:
    """``planned``, ``running`` or ``ready`` from the mirrors' frontiers (the other states
    are recorded): running once a revision job committed past ``from_barrier``, ready once
    every mirror is within ``revision_ready_lag_ms`` of its original (and has moved, unless
    no original has either)."""
    if revision.state not in FOLLOWED:
        return revision.state
    moved = any(m.frontier > revision.from_barrier for m in tables)
    still = all(
        m.original_frontier is not None and m.original_frontier <= revision.from_barrier
        for m in tables
    )
    lag = ctx.settings.revision_ready_lag_ms
    caught_up = all(m.lag_ms is not None and m.lag_ms <= lag for m in tables)
    if caught_up and (moved or still):
        return READY
    return RUNNING if moved else PLANNED


def _must_run(
    revision_id: int, affected: list[Affected], inputs: dict[str, list[str]]
) -> list[MustRun]:
    mirrors = {a.table: a.mirror for a in affected}
    outputs: dict[str, list[MirrorInput]] = defaultdict(list)
    for a in affected:
        outputs[a.writer].append(MirrorInput(table=a.table, mirror=a.mirror))
    return [
        MustRun(
            job=job,
            revision_job=revision_job_name(job, revision_id),
            outputs=outs,
            mirror_inputs=[
                MirrorInput(table=t, mirror=mirrors[t]) for t in inputs.get(job, []) if t in mirrors
            ],
        )
        for job, outs in sorted(outputs.items())
    ]


# -- what expiry needs ------------------------------------------------------------------------


def kept_snapshots(session: Session, table_id: int) -> list[Kept]:
    """The snapshots revisions keep in the table: the start snapshots of their mirrors
    (a mirror reads the files they reach), and, while a revision is active, the table's
    snapshot at its barrier when its jobs read the table from the original (their first
    batch reads from there, as a lease's reader reads what it pins)."""
    kept = repo.active_start_snapshots(session, table_id)
    for revision_id, from_barrier in repo.active_reading(session, table_id):
        snapshot = barrier_repo.snapshots_at(session, [table_id], from_barrier)[table_id]
        if snapshot is not None:
            kept.append(Kept(revision_id, snapshot))
    return kept


def refuse_pending_mirror(session: Session, table: str) -> None:
    """409 ``revision_pending`` when ``table`` is the mirror of an active revision: its
    files are the original's, which the original's expiry looks after."""
    revision_id = repo.active_by_mirror(session, table)
    if revision_id is not None:
        raise Conflict(
            f"'{table}' is a mirror of revision {revision_id}, which is still active: its "
            "files belong to the original table, whose expiry keeps what the mirror reads. "
            "Expire the original instead",
            field="table",
            code="revision_pending",
        )
