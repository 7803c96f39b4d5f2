"""Prometheus metrics: what one process counted, and the state of the topology.

Two kinds, exposed together at ``/metrics`` (:func:`exposition`):

- **Counted by the process** (requests, barriers, commit reports, consistent-version
  requests): module-level metrics. Under ``metaservice start --workers N`` they are kept
  in files shared by the workers (prometheus-client's multiprocess mode, switched on by
  :func:`share_between_workers` before the workers start), so any worker answers the sum.
- **Read from the database at each scrape** (per table: frontier, delay, consistent-
  version age; per job: last batch, last barrier, last report, open batches): the same
  from every worker and every replica. Labels are table and job names only, so the
  number of series grows with the topology and nothing else.

A table that never committed has no frontier sample (not an age of 56 years); a batch
rate is ``deriv(metaservice_job_last_batch_id[5m])`` (Spark numbers batches 0, 1, 2...).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.context import Context
from metaservice.models import SOURCE
from metaservice.topology import repository as topology_repo
from metaservice.topology import views as topology

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

BARRIERS = Counter("metaservice_batch_barriers_total", "Batch barrier requests answered")
COMMITS = Counter("metaservice_commit_reports_total", "Commit reports by outcome", ["result"])
REQUESTS = Histogram(
    "metaservice_http_request_duration_seconds",
    "HTTP request latency by route",
    ["method", "route", "status"],
    buckets=LATENCY_BUCKETS,
)
VERSIONS = Histogram(
    "metaservice_consistent_version_request_duration_seconds",
    "Consistent-version requests (GET /versions/consistent, POST /leases) by outcome: "
    "ok, none_yet (409: no version exists yet), refused (other 4xx), error (5xx)",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
)
VERSION_ROUTES = frozenset({"/api/v1/versions/consistent", "/api/v1/leases"})


def observe_version_request(route: str, method: str, status: int, seconds: float) -> None:
    """Count a consistent-version request (the HTTP middleware calls this for every one)."""
    if route not in VERSION_ROUTES or method not in ("GET", "POST"):
        return
    if status < 400:
        outcome = "ok"
    elif status == 409:
        outcome = "none_yet"
    elif status < 500:
        outcome = "refused"
    else:
        outcome = "error"
    VERSIONS.labels(outcome).observe(seconds)


def share_between_workers() -> str:
    """Keep the process metrics in files the workers share (call before they start);
    the folder, made fresh unless ``PROMETHEUS_MULTIPROC_DIR`` names one."""
    folder = os.environ.get(MULTIPROC_ENV) or tempfile.mkdtemp(prefix="metaservice-metrics-")
    os.environ[MULTIPROC_ENV] = folder
    return folder


# -- the topology's state, read at each scrape ----------------------------------------------


@dataclass
class TopologyState:
    """One scrape's reading of the database: ``(labels, value)`` per gauge."""

    now_ms: int
    gauges: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

    def add(self, name: str, label: str, value: float) -> None:
        self.gauges.setdefault(name, []).append((label, value))


# name -> (help, label name)
GAUGES = {
    "metaservice_table_frontier_timestamp_seconds": (
        "Frontier of the table (it holds everything up to this barrier), as Unix time",
        "table",
    ),
    "metaservice_table_delay_seconds": ("now - frontier of the table", "table"),
    "metaservice_table_consistent_version_age_seconds": (
        "now - the newest barrier at which the table alone has a consistent version "
        "(its frontier for a source job's table, its writer's newest committed barrier "
        "at or below the frontier for a derived job's)",
        "table",
    ),
    "metaservice_job_frontier_timestamp_seconds": (
        "Frontier of the job's outputs, as Unix time",
        "job",
    ),
    "metaservice_job_last_batch_id": (
        "Spark batch id of the job's newest committed batch (deriv() of it is the batch rate)",
        "job",
    ),
    "metaservice_job_last_barrier_timestamp_seconds": (
        "Barrier of the job's newest committed batch, as Unix time",
        "job",
    ),
    "metaservice_job_last_report_timestamp_seconds": (
        "When the job's Spark listener last reported (start, progress, end), as Unix time",
        "job",
    ),
    "metaservice_job_open_batches": (
        "Batches of the job given a barrier and not committed yet",
        "job",
    ),
}


def read_state(session: Session, ctx: Context) -> TopologyState:
    """Every gauge of :data:`GAUGES`, from the database, without writing (no sealing)."""
    state = TopologyState(now_ms=ctx.now_ms())
    jobs = topology_repo.all_jobs(session)
    fronts = fr.shown_frontiers(session, ctx, jobs)
    exact: dict[str, int] = {}
    for job in jobs:
        front = fronts[job.id]
        if job.kind == SOURCE:
            exact[job.name] = front
        else:
            latest = barrier_repo.latest_committed_at_or_before(session, [job.id], front)
            exact[job.name] = latest.get(job.id, 0)
        _timestamp(state, "metaservice_job_frontier_timestamp_seconds", job.name, front)
        if job.last_batch_id is not None:
            state.add("metaservice_job_last_batch_id", job.name, job.last_batch_id)
        _timestamp(
            state, "metaservice_job_last_barrier_timestamp_seconds", job.name, job.last_barrier
        )
        _timestamp(
            state, "metaservice_job_last_report_timestamp_seconds", job.name, job.last_seen_ms
        )
        state.add("metaservice_job_open_batches", job.name, job.open_batches)
    tables = topology.list_tables(session, ctx, limit=2**31 - 1, offset=0).items
    for t in tables:
        if not t.frontier or t.writer is None:
            continue  # no writer, or nothing committed yet: no data, not an age
        _timestamp(state, "metaservice_table_frontier_timestamp_seconds", t.name, t.frontier)
        state.add("metaservice_table_delay_seconds", t.name, (state.now_ms - t.frontier) / 1000)
        version = exact.get(t.writer, 0)
        if version > 0:
            state.add(
                "metaservice_table_consistent_version_age_seconds",
                t.name,
                (state.now_ms - version) / 1000,
            )
    return state


def _timestamp(state: TopologyState, name: str, label: str, ms: int | None) -> None:
    if ms:
        state.add(name, label, ms / 1000)


class _StateCollector(Collector):
    def __init__(self, state: TopologyState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        for name, (text, label) in GAUGES.items():
            family = GaugeMetricFamily(name, text, labels=[label])
            for value_label, value in self.state.gauges.get(name, []):
                family.add_metric([value_label], value)
            yield family


def exposition(state: TopologyState | None) -> bytes:
    """The text of ``/metrics``: the process metrics (every worker's, summed, under
    ``--workers N``) and the topology's state."""
    parts: list[Iterable[bytes]] = []
    if os.environ.get(MULTIPROC_ENV):
        shared = CollectorRegistry()
        MultiProcessCollector(shared)  # type: ignore[no-untyped-call]
        parts.append([generate_latest(shared)])
    else:
        parts.append([generate_latest(REGISTRY)])
    if state is not None:
        registry = CollectorRegistry()
        registry.register(_StateCollector(state))
        parts.append([generate_latest(registry)])
    return b"".join(chunk for part in parts for chunk in part)
