"""Planning a revision of table ``T`` from barrier ``B``: the affected set, where each
mirror starts, and every refusal (the rules are in :mod:`metaservice.revisions.service`'s
docstring); ``service.record_revision`` records what :func:`plan` finds."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

import networkx as nx
from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.context import Context
from metaservice.errors import Conflict, NotFound
from metaservice.models import DERIVED, SOURCE, Job, Table
from metaservice.revisions import repository as repo
from metaservice.topology import repository as topo
from metaservice.topology.graph import table_node
from metaservice.versions import repository as lease_repo

log = logging.getLogger(__name__)


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
class Planned:
    tables: dict[str, Table]
    writers: dict[str, Job]  # by table name
    starts: dict[str, int | None]  # by table name


def plan(session: Session, ctx: Context, table: str, from_barrier: int) -> Planned:
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
    _check_reached(session, ctx, tables, writers, from_barrier)
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
    return Planned(locked, writers, {name: starts[name] for name in locked})


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
    session: Session,
    ctx: Context,
    tables: dict[str, Table],
    writers: dict[str, Job],
    from_barrier: int,
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
    # the table's exactness, which outlives a writer (versions.service)
    derived = sorted(tables[name].id for name, j in writers.items() if j.kind == DERIVED)
    exact = barrier_repo.latest_exact_at_or_before(session, derived, from_barrier)
    for name, job in sorted(writers.items()):
        if job.kind == DERIVED and exact.get(tables[name].id) != from_barrier:
            below = exact.get(tables[name].id)
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
