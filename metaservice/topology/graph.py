"""An in-memory networkx view of the topology, cached per topology version.

Every change to jobs bumps ``clock.topology_version`` in the database, so each
replica can tell from one indexed read whether its cached graph is stale.
Node ids are ``job:NAME`` and ``table:NAME``; edges run table -> job for inputs
and job -> table for outputs.
"""

from __future__ import annotations

import threading

import networkx as nx
from sqlalchemy import select
from sqlalchemy.orm import Session

from metaservice.models import ClockState, Job, JobInput, Table


def job_node(name: str) -> str:
    return f"job:{name}"


def table_node(name: str) -> str:
    return f"table:{name}"


def topology_version(session: Session) -> int:
    return session.execute(
        select(ClockState.topology_version).where(ClockState.id == 1)
    ).scalar_one()


def build_graph(session: Session) -> nx.DiGraph:
    graph = nx.DiGraph()
    jobs = dict(session.execute(select(Job.id, Job.name)).all())
    tables = session.execute(select(Table.id, Table.name, Table.writer_id)).all()
    table_names = {}
    for job_name in jobs.values():
        graph.add_node(job_node(job_name), kind="job", name=job_name)
    for table_id, name, writer_id in tables:
        table_names[table_id] = name
        graph.add_node(table_node(name), kind="table", name=name)
        if writer_id is not None:
            graph.add_edge(job_node(jobs[writer_id]), table_node(name))
    for job_id, table_id in session.execute(select(JobInput.job_id, JobInput.table_id)):
        graph.add_edge(table_node(table_names[table_id]), job_node(jobs[job_id]))
    return graph


class TopologyCache:
    """Rebuilds the graph only when the database's topology version moved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = -1
        self._graph: nx.DiGraph = nx.DiGraph()
        self._order: dict[str, int] | None = None

    def get(self, session: Session, version: int | None = None) -> nx.DiGraph:
        """The graph as of ``version`` (default: the database's current one), which
        must be the state the session sees."""
        if version is None:
            version = topology_version(session)
        with self._lock:
            self._refresh(session, version)
            return self._graph

    def cached(self, version: int) -> nx.DiGraph | None:
        """The graph if it is the one of ``version`` (read by the caller), else None:
        the caller then builds it with :meth:`get` in a transaction."""
        with self._lock:
            return self._graph if version == self._version else None

    def order(self, session: Session) -> dict[str, int]:
        """Each node's place in a topological order of the current graph (upstream
        first), computed once per topology version: sorting the whole graph on every
        request that advances jobs cost seconds at 10,000 tables."""
        version = topology_version(session)
        with self._lock:
            self._refresh(session, version)
            if self._order is None:
                self._order = {n: i for i, n in enumerate(nx.topological_sort(self._graph))}
            return self._order

    def _refresh(self, session: Session, version: int) -> None:
        if version != self._version:
            self._graph = build_graph(session)
            self._order = None
            self._version = version
