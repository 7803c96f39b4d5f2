"""delay(t) = now - frontier(t); per job, frontier(slowest input) - frontier(output).

A derived job that never committed has frontier 0: its table's delay and its own
contribution are None (no data yet), never the age of the epoch.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx
from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.context import Context
from metaservice.delay.schemas import Delay, JobLag
from metaservice.errors import Conflict
from metaservice.models import Job
from metaservice.names import check_table_name
from metaservice.topology import repository as topo
from metaservice.topology.graph import table_node


def delay(session: Session, ctx: Context, table: str) -> Delay:
    check_table_name(table)
    target = topo.require_table(session, table)
    if target.writer_id is None:
        raise Conflict(
            f"table '{table}' has no writing job, so it has no frontier",
            field="table",
            code="no_writer",
        )
    graph = ctx.graph.get(session)
    upstream_tables = [
        graph.nodes[n]["name"]
        for n in nx.ancestors(graph, table_node(table)) | {table_node(table)}
        if graph.nodes[n]["kind"] == "table"
    ]
    tables = topo.tables_by_names(session, upstream_tables)
    jobs = topo.jobs_by_ids(session, sorted({t.writer_id for t in tables.values() if t.writer_id}))
    fronts = fr.shown_frontiers(session, ctx, list(jobs.values()))
    now = ctx.now_ms()

    def table_frontier(name: str) -> int | None:
        writer = tables[name].writer_id
        return fronts[writer] if writer is not None else None

    inputs, outputs = topo.edges_of_jobs(session, sorted(jobs))
    upstream = set(upstream_tables)
    lags = {
        job.id: _job_lag(
            job, inputs[job.id], outputs[job.id], upstream, now, table_frontier, fronts[job.id]
        )
        for job in jobs.values()
    }
    path = []
    current = target
    while current.writer_id is not None:
        # a job with several outputs holds this path back through the one on it
        lag = lags[current.writer_id].model_copy(update={"output": current.name})
        path.append(lag)
        if lag.slowest_input is None or tables[lag.slowest_input].writer_id is None:
            break
        current = tables[lag.slowest_input]
    frontier = fronts[target.writer_id]
    return Delay(
        table=table,
        now_ms=now,
        frontier=frontier if frontier > 0 else None,
        delay_ms=now - frontier if frontier > 0 else None,
        critical_path=path,
        jobs=sorted(lags.values(), key=_largest_first),
    )


def _largest_first(lag: JobLag) -> tuple[bool, int, str]:
    return (lag.contribution_ms is not None, -(lag.contribution_ms or 0), lag.job)


def _job_lag(
    job: Job,
    inputs: list[str],
    outputs: list[str],
    upstream: set[str],
    now: int,
    table_frontier: Callable[[str], int | None],
    output_frontier: int,
) -> JobLag:
    """The job's own lag; ``output`` is its first output upstream of the table asked
    about (every output shares the job's frontier, so the lag is the same for each)."""
    known = [(front, name) for name in inputs if (front := table_frontier(name)) is not None]
    if known:
        input_frontier, slowest = min(known)
    else:
        input_frontier, slowest = now, None
    on_path = [name for name in outputs if name in upstream]
    return JobLag(
        job=job.name,
        output=(on_path or outputs or [""])[0],
        outputs=outputs,
        slowest_input=slowest,
        input_frontier=input_frontier,
        output_frontier=output_frontier,
        contribution_ms=input_frontier - output_frontier if output_frontier > 0 else None,
    )
