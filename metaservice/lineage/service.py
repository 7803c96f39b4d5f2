"""Lineage queries over the cached topology graph and the recorded batches."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import networkx as nx
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from metaservice.barriers import repository as barrier_repo
from metaservice.barriers import service as barrier_service
from metaservice.context import Context
from metaservice.errors import Invalid, NotFound, TooLarge
from metaservice.lineage import repository as repo
from metaservice.lineage.schemas import LineageGraph, SnapshotLineage
from metaservice.names import check_table_name
from metaservice.openlineage.service import with_observed
from metaservice.topology import repository as topo
from metaservice.topology.graph import table_node

DIRECTIONS = ("upstream", "downstream", "both")


def check_query(ctx: Context, table: str, direction: str, depth: int | None) -> None:
    """422 or 413 for a lineage query the service will not answer, before any read."""
    check_table_name(table)
    if direction not in DIRECTIONS:
        raise Invalid(f"direction must be one of {', '.join(DIRECTIONS)}", field="direction")
    if depth is not None and depth > ctx.settings.max_lineage_depth:
        raise TooLarge(
            f"depth {depth} is over the limit of {ctx.settings.max_lineage_depth}", field="depth"
        )


def cached_lineage(
    conn: Connection, ctx: Context, table: str, direction: str, depth: int | None
) -> LineageGraph | None:
    """The answer from the cached graph after one statement (run it with
    ``Database.read_single``): None when the topology moved since the graph was built,
    or when observed lineage must be added; :func:`table_lineage` answers then.

    The statement is the cross-replica check: it reads the database's topology version,
    and the cached graph is used only if it was built at that version."""
    version, observed = repo.topology_state(conn)
    graph = None if observed else ctx.graph.cached(version)
    return None if graph is None else lineage_of(graph, table, direction, depth)


def table_lineage(
    session: Session, ctx: Context, table: str, direction: str, depth: int | None
) -> LineageGraph:
    """The jobs and tables around ``table``; ``depth`` counts jobs away from it."""
    check_query(ctx, table, direction, depth)
    version, observed = repo.topology_state(session)
    graph = ctx.graph.get(session, version)
    if observed:
        graph = with_observed(session, graph)
    return lineage_of(graph, table, direction, depth)


def lineage_of(graph: nx.DiGraph, table: str, direction: str, depth: int | None) -> LineageGraph:
    """The part of ``graph`` around ``table`` (404 if the graph has no such table)."""
    root = table_node(table)
    if root not in graph:
        raise NotFound(
            f"table '{table}' is unknown: no registered job reads or writes it, and no "
            "OpenLineage event named it",
            field="table",
        )
    hops = None if depth is None else 2 * depth  # table -> job -> table is two edges
    reached = {root}
    if direction in ("upstream", "both"):
        reached |= _walk(graph.predecessors, root, hops)
    if direction in ("downstream", "both"):
        reached |= _walk(graph.successors, root, hops)
    attributes = graph.nodes
    nodes = [_node(n, attributes[n]) for n in sorted(reached)]
    # The edges among the nodes reached, read off the adjacency: a networkx subgraph
    # view (and its per-node views) cost more than the rest of the answer.
    pairs = sorted((u, v) for u in reached for v in graph.successors(u) if v in reached)
    edge_data = graph.get_edge_data
    edges = [
        {"source": u, "target": v, "observed": edge_data(u, v).get("observed", False)}
        for u, v in pairs
    ]
    # Validated as one document: a model per node and edge cost a quarter of the answer.
    return LineageGraph.model_validate(
        {"root": root, "direction": direction, "depth": depth, "nodes": nodes, "edges": edges}
    )


def _node(node_id: str, data: dict[str, Any]) -> dict[str, Any]:
    if not data.get("observed"):
        return {"id": node_id, "kind": data["kind"], "name": data["name"]}
    return {
        "id": node_id,
        "kind": data["kind"],
        "name": data["name"],
        "observed": True,
        "source": "openlineage",
        "namespace": data.get("namespace"),
    }


def _walk(step: Callable[[str], Iterator[str]], root: str, hops: int | None) -> set[str]:
    """The nodes ``step`` (the graph's predecessors or successors) reaches from ``root``
    in at most ``hops`` steps (all when None)."""
    seen = {root}
    queue = deque([(root, 0)])
    while queue:
        node, dist = queue.popleft()
        if hops is not None and dist >= hops:
            continue
        for nxt in step(node):
            if nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, dist + 1))
    return seen


def snapshot_lineage(session: Session, table: str, snapshot_id: int) -> SnapshotLineage:
    """Which job, batch and barrier made the snapshot, and what the batch read: per input
    it was opened with (the job's current inputs for batches recorded before that was
    kept), the snapshot range (from, to] by the barrier-to-snapshot mapping."""
    t = topo.require_table(session, table)
    commit = barrier_repo.commit_with_snapshot(session, t.id, snapshot_id)
    if commit is None:
        raise NotFound(
            f"snapshot {snapshot_id} of '{table}' was never reported to the MetaService",
            field="snapshot_id",
        )
    if commit.job_id is None:
        raise NotFound(
            f"snapshot {snapshot_id} of '{table}' was written at barrier {commit.barrier} by "
            "a job since deleted: the table keeps the snapshot's barrier, but the batch and "
            "what it read were forgotten with the job",
            field="snapshot_id",
            code="writer_deleted",
        )
    job = topo.jobs_by_ids(session, [commit.job_id])[commit.job_id]
    batch = barrier_repo.get_batch(session, commit.job_id, commit.batch_id)
    inputs = barrier_service.batch_view(session, job, batch).inputs if batch is not None else []
    return SnapshotLineage(
        table=table,
        snapshot_id=snapshot_id,
        job=job.name,
        batch_id=commit.batch_id,
        barrier=commit.barrier,
        inputs=inputs,
    )
