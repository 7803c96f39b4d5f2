"""The rules of revisions, in the database: the affected set, where each mirror starts,
the refusals, the records, and what expiry needs to know.

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
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.barriers import service as barrier_service
from metaservice.context import Context
from metaservice.contract import on_grid, slot_of
from metaservice.errors import Conflict, Invalid, NotFound
from metaservice.lifecycle import repository as retention_repo
from metaservice.models import DERIVED, SOURCE, Job, Revision, Table
from metaservice.models.revisions import (
    ACTIVE,
    CANCELLED,
    CREATING,
    FOLLOWED,
    PLANNED,
    READY,
    RUNNING,
    SWAPPED,
    SWAPPING,
)
from metaservice.names import check_table_name
from metaservice.revisions import repository as repo
from metaservice.revisions.repository import Affected, Kept
from metaservice.revisions.schemas import MirrorInput, MirrorView, MustRun, RevisionView
from metaservice.schemas_common import Page
from metaservice.topology import repository as topo
from metaservice.topology import service as topo_service
from metaservice.topology.graph import job_node, table_node
from metaservice.topology.schemas import JobSpec
from metaservice.versions import repository as lease_repo
from metaservice.versions import service as versions

log = logging.getLogger(__name__)


def mirror_name(table: str, revision_id: int) -> str:
    """The mirror's identifier: ``ods.orders`` -> ``ods.orders__rev7``."""
    return f"{table}__rev{revision_id}"


def revision_job_name(job: str, revision_id: int) -> str:
    """The revision job that re-runs ``job`` into the mirrors: ``der`` -> ``der__rev7``."""
    return f"{job}__rev{revision_id}"


def _unknown(revision_id: int) -> NotFound:
    return NotFound(
        f"revision {revision_id} does not exist", field="revision_id", code="unknown_revision"
    )


# -- planning -------------------------------------------------------------------------------


def affected_tables(session: Session, ctx: Context, table: str) -> list[str]:
    """``table``, its writer's other outputs, and everything downstream of them, by name."""
    graph: nx.DiGraph = ctx.graph.get(session)
    node = table_node(table)
    roots = {node}
    if node in graph:
        for writer in graph.predecessors(node):
            roots.update(graph.successors(writer))
    found: set[str] = set()
    for root in roots:
        if root not in graph:
            continue
        for n in {root} | nx.descendants(graph, root):
            if graph.nodes[n]["kind"] == "table":
                found.add(graph.nodes[n]["name"])
    found.add(table)
    return sorted(found)


@dataclass(frozen=True)
class _Planned:
    tables: dict[str, Table]
    writers: dict[str, Job]  # by table name
    starts: dict[str, int | None]  # by table name


def _plan(session: Session, ctx: Context, table: str, from_barrier: int) -> _Planned:
    """The affected set and each table's start, with every refusal; takes the affected
    tables' row locks exclusively (a write transaction)."""
    topo.require_table(session, table)
    names = affected_tables(session, ctx, table)
    tables = topo.tables_by_names(session, names)
    for name in names:
        if tables[name].writer_id is None:
            raise Conflict(
                f"table '{name}' ("
                + ("the table revised" if name == table else f"downstream of '{table}'")
                + ") has no writing job: a revision re-runs the writer of every affected "
                "table. Register its writer first",
                field="table",
                code="no_writer",
            )
    jobs = topo.jobs_by_ids(session, [t.writer_id for t in tables.values() if t.writer_id])
    writers = {name: jobs[t.writer_id] for name, t in tables.items() if t.writer_id}
    _check_sources(table, writers)
    _check_reached(session, ctx, writers, from_barrier)
    inputs = _unaffected_inputs(session, writers, set(names))
    # The inputs are locked as the affected tables are: a concurrent expiry reservation
    # either committed first (its horizon is seen here) or sees this revision's record.
    wanted = [t.id for t in tables.values()] + [t.id for t in inputs.values()]
    every = {t.name: t for t in lease_repo.lock_tables(session, wanted, exclusive=True)}
    locked = {name: every[name] for name in names if name in every}
    if set(locked) != set(names) or set(every) != set(locked) | set(inputs):
        raise NotFound(
            f"an affected table of '{table}' or an input of its writers was deleted meanwhile",
            field="table",
        )
    _check_overlaps(session, table, locked)
    found = barrier_repo.snapshots_at(session, [t.id for t in every.values()], from_barrier)
    starts = {name: found[t.id] for name, t in every.items()}
    _check_expired(session, every, starts, from_barrier, inputs=set(inputs))
    return _Planned(locked, writers, {name: starts[name] for name in locked})


def _unaffected_inputs(
    session: Session, writers: dict[str, Job], affected: set[str]
) -> dict[str, Table]:
    """The tables the revision jobs will read from the originals (by name): their
    writers' inputs outside the affected set. Their first batch reads each from its
    snapshot at ``from_barrier``, which must therefore still exist (``kept_snapshots``
    keeps it while the revision is active)."""
    jobs = {j.id: j for j in writers.values()}
    found = topo.input_tables_of_jobs(session, sorted(jobs))
    return {t.name: t for rows in found.values() for t in rows if t.name not in affected}


def _check_sources(table: str, writers: dict[str, Job]) -> None:
    for name, job in sorted(writers.items()):
        if job.kind == SOURCE:
            raise Conflict(
                f"table '{name}' ("
                + ("the table revised" if name == table else f"downstream of '{table}'")
                + f") is written by source job '{job.name}', which ingests from outside the "
                "tables (Kafka, files...): the MetaService cannot re-run it from a barrier. "
                "Revise the tables derived from it instead, or re-ingest into a new table "
                "under a new job. Nothing was changed",
                field="table",
                code="source_job",
            )


def _check_reached(
    session: Session, ctx: Context, writers: dict[str, Job], from_barrier: int
) -> None:
    jobs = {j.id: j for j in writers.values()}
    # Not sealed (a revision that fails changes nothing): an idle source's frontier is the
    # watermark's, which no batch can get a barrier at or below any more (new batches get
    # a barrier above it, offline ones stay above the grant's floor, which ``frontiers``
    # heeds: barriers/watermark.py).
    front = fr.shown_frontiers(session, ctx, list(jobs.values()))
    for name, job in sorted(writers.items()):
        if front[job.id] < from_barrier:
            raise Conflict(
                f"table '{name}' is complete up to barrier {front[job.id]} only (its job "
                f"'{job.name}'s frontier): its state at {from_barrier} is not final yet. "
                "Revise from a barrier every affected table has reached",
                field="from_barrier",
                code="not_reached",
            )
    derived = sorted(j.id for j in jobs.values() if j.kind == DERIVED)
    exact = barrier_repo.latest_committed_at_or_before(session, derived, from_barrier)
    for name, job in sorted(writers.items()):
        if job.kind == DERIVED and exact.get(job.id) != from_barrier:
            below = exact.get(job.id)
            raise Conflict(
                f"table '{name}' is not exact at barrier {from_barrier}: job '{job.name}' "
                "committed a batch that spans it"
                + (f" (its last batch at or below it ended at {below})" if below else "")
                + ", so its snapshot there holds data from after it. Revise from a barrier "
                "every affected table is exact at, e.g. the consistent version's "
                f"(GET /api/v1/versions/consistent?tables=...&at_or_before={from_barrier})",
                field="from_barrier",
                code="not_exact",
            )


def _check_overlaps(session: Session, table: str, tables: dict[str, Table]) -> None:
    overlap = repo.active_overlapping(session, [t.id for t in tables.values()])
    if overlap:
        by_revision: dict[int, list[str]] = defaultdict(list)
        for revision_id, name in overlap:
            by_revision[revision_id].append(name)
        which = "; ".join(f"revision {r}: {', '.join(n)}" for r, n in sorted(by_revision.items()))
        raise Conflict(
            f"revising '{table}' affects tables that an active revision is revising already "
            f"({which}). Cancel that revision (DELETE /api/v1/revisions/ID) or let it finish",
            field="table",
            code="revision_overlaps",
        )


def _check_expired(
    session: Session,
    tables: dict[str, Table],
    starts: dict[str, int | None],
    from_barrier: int,
    *,
    inputs: set[str],
) -> None:
    """409 ``expired`` when an affected table (its mirror starts there) or an unaffected
    input of a revision job (its first batch reads from there) may have lost its snapshot
    at ``from_barrier``. The message names the oldest barrier still possible: no table's
    snapshots are expired at or above its expiry horizon."""
    oldest = max((t.expiry_horizon or 0 for t in tables.values()), default=0)
    for name, t in sorted(tables.items()):
        start = starts[name]
        below = t.expiry_horizon is not None and from_barrier < t.expiry_horizon
        if below or (start is not None and repo.expired_ids(session, t.id, [start])):
            horizon = t.expiry_horizon
            role = (
                "an input the revision jobs read from the original, from its snapshot at "
                "the barrier"
                if name in inputs
                else "an affected table, whose mirror starts at its snapshot at the barrier"
            )
            raise Conflict(
                f"table '{name}' ({role}) has no snapshot at barrier {from_barrier} any "
                "more: "
                + (
                    f"its snapshots older than the one at barrier {horizon} (its expiry "
                    "horizon) may have been expired"
                    if horizon is not None
                    else f"snapshot {start} was expired"
                )
                + ". Revise from a later barrier"
                + (
                    f": the oldest still possible is {oldest} (the highest expiry horizon "
                    "among the tables the revision reads), at a barrier every affected "
                    "table is exact at (GET /api/v1/versions/consistent?tables=..."
                    f"&at_or_before=B with B >= {oldest})"
                    if oldest > from_barrier
                    else ""
                )
                + ". Nothing was changed",
                field="from_barrier",
                code="expired",
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
    planned = _plan(session, ctx, table, from_barrier)
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
        raise _unknown(revision_id)
    if revision.state != CANCELLED:
        if repo.set_state(session, revision_id, CANCELLED, ctx.now_ms(), only_from=ACTIVE):
            _drop_revision_jobs(session, revision_id)
        session.refresh(revision)
    return view(session, ctx, revision)


def get_revision(session: Session, ctx: Context, revision_id: int) -> RevisionView:
    revision = repo.get(session, revision_id)
    if revision is None:
        raise _unknown(revision_id)
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
    return _swap_waits_for(session, ctx, revision.id, affected, originals, revised)


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


# -- the swap ---------------------------------------------------------------------------------


# Where the original goes at the swap: ``dw.detail`` -> ``dw.detail__pre_rev7``.
pre_revision_name = repo.pre_revision_name


def begin_swap(session: Session, ctx: Context, revision_id: int) -> RevisionView:
    """Supersede the original writers (state ``swapping``) of a ready revision (a write
    transaction). A swapping or swapped revision is answered as it is. 409 ``not_ready``
    and ``revision_cancelled`` change nothing."""
    revision = repo.lock(session, revision_id)
    if revision is None:
        raise _unknown(revision_id)
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
        raise _unknown(revision_id)
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
    waits = _swap_waits_for(session, ctx, revision_id, affected, originals, revised)
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


def _swap_waits_for(
    session: Session,
    ctx: Context,
    revision_id: int,
    affected: list[Affected],
    originals: dict[str, Job],
    revised: dict[str, Job],
) -> str | None:
    """What a swapping revision waits for before its records can be swapped; None when
    nothing. ``originals`` and ``revised``: the original writers and their revision jobs,
    by original name."""
    still_open = sorted(
        j.name for j in originals.values() if barrier_repo.open_batch(session, j.id) is not None
    )
    if still_open:
        # their reports will raise the originals' frontiers
        return f"the batch open in original job(s) {', '.join(still_open)} to be reported"
    front = fr.frontiers(session, ctx, [*originals.values(), *revised.values()])
    behind = [
        f"{a.mirror} at {front[revised[a.writer].id]}, {a.table} at {front[originals[a.writer].id]}"
        for a in affected
        if front[revised[a.writer].id] < front[originals[a.writer].id]
    ]
    if behind:
        return "the mirrors to reach their frozen originals (" + "; ".join(behind) + ")"
    frozen = {a.table: front[originals[a.writer].id] for a in affected}
    return _version_going_back(session, ctx, revision_id, affected, frozen)


def _version_going_back(
    session: Session,
    ctx: Context,
    revision_id: int,
    affected: list[Affected],
    frozen: dict[str, int],
) -> str | None:
    """Why a consistent version would go back if the swap happened now; None when none
    would. ``frozen``: each original's frontier, which no longer moves (its writer is
    superseded and has no batch open), so every version handed out for a set holding an
    affected table is at or below it.

    1. The mirrors must be exact together at a barrier at or above every frozen frontier:
       then no set of affected tables goes back, nor any set with other tables that are
       exact there too.
    2. Any other table of the pipeline (one per writer) that is not exact there: a set of
       it with an affected table, or with all of them, must have a version after the swap
       at least as new as the one it has now. Otherwise the swap waits for that writer to
       commit a barrier the mirrors are exact at (or for the mirrors to reach one of its)."""
    mirrors = {a.table: a.mirror for a in affected}
    highest = max(frozen.values())
    together = _version_barrier(session, ctx, sorted(mirrors.values()))
    if together is None or together < highest:
        return (
            f"the mirrors are exact together at barrier {together} only, below {highest} "
            "(the frontier their originals stopped at): the revision jobs must commit a "
            "common barrier at or above it"
        )
    for other in _not_exact_at(
        session, ctx, _other_tables(session, ctx, revision_id, affected), together
    ):
        for chosen in [[t] for t in sorted(mirrors)] + [sorted(mirrors)]:
            before = _version_barrier(session, ctx, sorted([*chosen, other]))
            if before is None:
                continue
            renamed = sorted([*(mirrors[t] for t in chosen), other])
            after = _version_barrier(session, ctx, renamed)
            if after is None or after < before:
                return (
                    f"the consistent version of {', '.join(sorted([*chosen, other]))} is at "
                    f"barrier {before}; swapped now, it would be at {after}: waiting for "
                    f"'{other}' to be exact at a barrier the mirrors are exact at"
                )
    return None


def _version_barrier(session: Session, ctx: Context, names: list[str]) -> int | None:
    """The barrier of the tables' consistent version now; None when there is none."""
    try:
        return versions.consistent_version(session, ctx, names).barrier
    except (Conflict, NotFound):
        return None


def _other_tables(
    session: Session, ctx: Context, revision_id: int, affected: list[Affected]
) -> dict[str, Job]:
    """One table per writer (the writers' exactness and frontiers are what versions
    compare) of the topology around the affected tables, outside them: the tables a
    consistent version may pair with them. Left out: the tables of writers that a
    revision supersedes (frozen, replaced) and the mirrors of other active revisions."""
    graph: nx.DiGraph = ctx.graph.get(session)
    undirected = graph.to_undirected(as_view=True)
    own = {a.table for a in affected} | {a.mirror for a in affected}
    writers = {a.writer for a in affected} | {
        revision_job_name(a.writer, revision_id) for a in affected
    }
    around: set[str] = set()
    for name in sorted(own):
        if table_node(name) in graph and table_node(name) not in around:
            around |= nx.node_connected_component(undirected, table_node(name))
    found: dict[str, str] = {}  # writer -> one of its tables
    for node in sorted(around):
        if graph.nodes[node]["kind"] != "table" or graph.nodes[node]["name"] in own:
            continue
        for writer in graph.predecessors(node):
            found.setdefault(graph.nodes[writer]["name"], graph.nodes[node]["name"])
    others: dict[str, Job] = {}
    for writer, table in sorted(found.items()):
        if writer in writers or repo.superseding(session, writer) is not None:
            continue
        if repo.active_by_mirror(session, table) is not None:
            continue
        job = topo.job_by_name(session, writer)
        if job is not None:
            others[table] = job
    return others


def _not_exact_at(
    session: Session, ctx: Context, tables: dict[str, Job], barrier: int
) -> list[str]:
    """Those of ``tables`` (by name, with their writers) that are not complete and exact
    at ``barrier``."""
    jobs = list({j.id: j for j in tables.values()}.values())
    front = fr.frontiers(session, ctx, jobs)
    derived = [j.id for j in jobs if j.kind == DERIVED]
    exact = barrier_repo.latest_committed_at_or_before(session, derived, barrier)
    return [
        name
        for name, job in sorted(tables.items())
        if front[job.id] < barrier or (job.kind == DERIVED and exact.get(job.id) != barrier)
    ]


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
