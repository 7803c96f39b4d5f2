"""Lineage queries over the cached topology graph and the recorded batches."""

from __future__ import annotations

from collections import deque

import networkx as nx
from sqlalchemy import select
from sqlalchemy.orm import Session

from metaservice.barriers import repository as barrier_repo
from metaservice.context import Context
from metaservice.errors import Invalid, NotFound, TooLarge
from metaservice.lineage.schemas import ConsumedRange, Edge, LineageGraph, Node, SnapshotLineage
from metaservice.models import Batch, Commit, Job
from metaservice.names import check_table_name
from metaservice.topology import repository as topo
from metaservice.topology.graph import table_node

DIRECTIONS = ("upstream", "downstream", "both")


def table_lineage(
    session: Session, ctx: Context, table: str, direction: str, depth: int | None
) -> LineageGraph:
    """The jobs and tables around ``table``; ``depth`` counts jobs away from it."""
    check_table_name(table)
    if direction not in DIRECTIONS:
        raise Invalid(f"direction must be one of {', '.join(DIRECTIONS)}", field="direction")
    if depth is not None and depth > ctx.settings.max_lineage_depth:
        raise TooLarge(
            f"depth {depth} is over the limit of {ctx.settings.max_lineage_depth}", field="depth"
        )
    graph = ctx.graph.get(session)
    root = table_node(table)
    if root not in graph:
        raise NotFound(
            f"table '{table}' is unknown: no registered job reads or writes it", field="table"
        )
    hops = None if depth is None else 2 * depth  # table -> job -> table is two edges
    reached = {root}
    if direction in ("upstream", "both"):
        reached |= _walk(graph, root, hops, upstream=True)
    if direction in ("downstream", "both"):
        reached |= _walk(graph, root, hops, upstream=False)
    nodes = [
        Node(id=n, kind=graph.nodes[n]["kind"], name=graph.nodes[n]["name"])
        for n in sorted(reached)
    ]
    edges = [Edge(source=u, target=v) for u, v in sorted(graph.subgraph(reached).edges())]
    return LineageGraph(root=root, direction=direction, depth=depth, nodes=nodes, edges=edges)


def _walk(graph: nx.DiGraph, root: str, hops: int | None, *, upstream: bool) -> set[str]:
    step = graph.predecessors if upstream else graph.successors
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
    t = topo.require_table(session, table)
    row = session.execute(
        select(Commit, Job.name)
        .join(Job, Job.id == Commit.job_id)
        .where(Commit.table_id == t.id, Commit.snapshot_id == snapshot_id)
    ).one_or_none()
    if row is None:
        raise NotFound(
            f"snapshot {snapshot_id} of '{table}' was never reported to the MetaService",
            field="snapshot_id",
        )
    commit, job_name = row
    batch = session.execute(
        select(Batch).where(Batch.job_id == commit.job_id, Batch.batch_id == commit.batch_id)
    ).scalar_one()
    inputs = []
    if batch.start_barrier is not None:
        for source in topo.input_tables(session, commit.job_id):
            inputs.append(
                ConsumedRange(
                    table=source.name,
                    from_barrier=batch.start_barrier,
                    to_barrier=batch.barrier,
                    from_snapshot=barrier_repo.snapshot_at(session, source.id, batch.start_barrier),
                    to_snapshot=barrier_repo.snapshot_at(session, source.id, batch.barrier),
                )
            )
    return SnapshotLineage(
        table=table,
        snapshot_id=snapshot_id,
        job=job_name,
        batch_id=commit.batch_id,
        barrier=commit.barrier,
        inputs=inputs,
    )
