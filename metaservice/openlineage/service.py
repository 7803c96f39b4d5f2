"""OpenLineage ingest: read an event, record it once, keep its jobs and datasets as
observed lineage; and the observed lineage as a graph beside the barrier topology.

Observed jobs have none of the barrier rules: several of them may write one dataset,
and nothing they report changes the barrier topology.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import networkx as nx
from pydantic import ValidationError
from sqlalchemy.orm import Session

from metaservice.context import Context
from metaservice.errors import ServiceError, TooLarge
from metaservice.models import ObservedDataset, ObservedEdge, ObservedJob, OpenLineageEvent
from metaservice.names import is_table_name
from metaservice.openlineage import repository as repo
from metaservice.openlineage.schemas import (
    EVENT_MODELS,
    DatasetEventIn,
    DatasetRef,
    IngestResult,
    JobEventIn,
    RunEventIn,
    SymlinksFacet,
)
from metaservice.topology.graph import table_node

SCHEMA_KINDS = {"RunEvent": "run", "JobEvent": "job", "DatasetEvent": "dataset"}


class BadEvent(ServiceError):
    """The body is no OpenLineage event the service can read (400), with the JSON path
    of the problem (``$`` for the whole body)."""

    status = 400
    code = "invalid_event"

    def __init__(self, message: str, path: str = "$", code: str | None = None) -> None:
        field = path[2:] if path.startswith("$.") else None
        super().__init__(f"{path}: {message}" if path != "$" else message, field=field, code=code)
        self.path = path

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "path": self.path}


@dataclass(frozen=True)
class ParsedEvent:
    kind: str  # run, job, dataset
    key: str  # SHA-256 of the canonical JSON
    canonical: str
    event: Any  # RunEventIn | JobEventIn | DatasetEventIn


# -- reading the body -----------------------------------------------------------------------


def decode_body(raw: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """The body as sent, un-gzipped when it says so; never more than ``max_bytes``."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return raw
    if encoding not in ("gzip", "x-gzip"):
        raise BadEvent(
            f"Content-Encoding '{encoding}' is not supported: send gzip or nothing",
            code="unsupported_encoding",
        )
    inflater = zlib.decompressobj(wbits=31)  # gzip framing
    try:
        body = inflater.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise BadEvent(f"the body is not valid gzip: {exc}", code="malformed_gzip") from exc
    if len(body) > max_bytes or inflater.unconsumed_tail:
        raise TooLarge(
            f"the decompressed event is over the limit of {max_bytes} bytes", field="body"
        )
    if not inflater.eof:
        raise BadEvent("the gzip body is truncated", code="malformed_gzip")
    return body


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_event(body: bytes) -> ParsedEvent | None:
    """The event in ``body``; None for an event type the service does not know (to be
    acknowledged and ignored, as Marquez does)."""
    try:
        doc = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadEvent(f"the body is not valid JSON: {exc}", code="malformed_json") from exc
    if not isinstance(doc, dict):
        raise BadEvent("an OpenLineage event is a JSON object")
    kind = event_kind(doc)
    if kind is None:
        return None
    try:
        event = EVENT_MODELS[kind].model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadEvent(first["msg"], json_path(first["loc"])) from exc
    datasets: list[tuple[str, DatasetRef]] = []
    if isinstance(event, DatasetEventIn):
        datasets.append(("dataset", event.dataset))
    elif isinstance(event, RunEventIn | JobEventIn):
        datasets += [(f"inputs.{i}", d) for i, d in enumerate(event.inputs)]
        datasets += [(f"outputs.{i}", d) for i, d in enumerate(event.outputs)]
    for where, dataset in datasets:
        _symlinks(dataset, where)  # checked here, so that recording never fails on it
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    key = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return ParsedEvent(kind=kind, key=key, canonical=canonical, event=event)


def event_kind(doc: dict[str, Any]) -> str | None:
    """RunEvent, JobEvent or DatasetEvent by schemaURL's fragment (``#/$defs/RunEvent``,
    or ``#/definitions/RunEvent`` of older specs), else by shape; None: another type."""
    url = doc.get("schemaURL")
    if isinstance(url, str) and "#/" in url:
        definition = url.rsplit("/", 1)[-1]
        if definition in SCHEMA_KINDS:
            return SCHEMA_KINDS[definition]
        if definition.endswith("Event"):
            return None
    for field in ("run", "dataset", "job"):
        if field in doc:
            return "run" if field == "run" else field
    raise BadEvent("not an OpenLineage event: it has none of 'run', 'job' and 'dataset'")


def json_path(loc: tuple[int | str, ...]) -> str:
    path = "$"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _symlinks(dataset: DatasetRef, where: str) -> list[str]:
    raw = dataset.facets.get("symlinks")
    if raw is None:
        return []
    try:
        facet = SymlinksFacet.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        base = json_path(tuple(int(p) if p.isdigit() else p for p in where.split(".")))
        path = base + ".facets.symlinks" + json_path(first["loc"])[1:]
        raise BadEvent(first["msg"], path) from exc
    return [i.name for i in facet.identifiers]


# -- recording ------------------------------------------------------------------------------


def record(session: Session, ctx: Context, parsed: ParsedEvent) -> IngestResult:
    """Record the event once; its job and datasets become observed lineage."""
    if repo.event_recorded(session, parsed.key):
        return IngestResult(status="duplicate", kind=parsed.kind, event_id=parsed.key)
    now = ctx.now_ms()
    event = parsed.event
    when = event.eventTime if event.eventTime.tzinfo else event.eventTime.replace(tzinfo=UTC)
    event_ms = int(when.timestamp() * 1000)
    job: ObservedJob | None = None
    if parsed.kind == "dataset":
        _dataset(session, event.dataset, now)
    else:
        job = _job(session, event, event_ms, now)
        for direction, datasets in (("input", event.inputs), ("output", event.outputs)):
            for dataset in datasets:
                row = _dataset(session, dataset, now)
                if not repo.edge_exists(session, job.id, row.id, direction):
                    session.add(ObservedEdge(job_id=job.id, dataset_id=row.id, direction=direction))
                    session.flush()
    session.add(
        OpenLineageEvent(
            event_key=parsed.key,
            kind=parsed.kind,
            event_type=getattr(event, "eventType", None),
            event_time_ms=event_ms,
            run_id=str(event.run.runId) if isinstance(event, RunEventIn) else None,
            job_id=job.id if job is not None else None,
            payload=parsed.canonical,
            received_ms=now,
        )
    )
    session.flush()
    return IngestResult(status="recorded", kind=parsed.kind, event_id=parsed.key)


def _key(namespace: str, name: str) -> str:
    return hashlib.sha256(f"{namespace}\x00{name}".encode()).hexdigest()


def _job(session: Session, event: Any, event_ms: int, now: int) -> ObservedJob:
    key = _key(event.job.namespace, event.job.name)
    job = repo.observed_job(session, key)
    if job is None:
        job = ObservedJob(
            key=key,
            namespace=event.job.namespace,
            name=event.job.name,
            last_event_ms=event_ms,
            updated_ms=now,
        )
        session.add(job)
    # Events may arrive out of order: the job's state is its newest event's.
    if isinstance(event, RunEventIn) and event_ms >= job.last_event_ms:
        job.last_event_type = event.eventType
        job.last_run_id = str(event.run.runId)
        job.last_event_ms = event_ms
    job.updated_ms = now
    session.flush()
    return job


def _dataset(session: Session, dataset: DatasetRef, now: int) -> ObservedDataset:
    key = _key(dataset.namespace, dataset.name)
    row = repo.observed_dataset(session, key)
    names = _symlinks(dataset, "dataset")
    if row is None:
        row = ObservedDataset(
            key=key,
            namespace=dataset.namespace,
            name=dataset.name,
            symlinks=json.dumps(sorted(set(names))),
            updated_ms=now,
        )
        session.add(row)
    else:
        known = set(json.loads(row.symlinks))
        if not set(names) <= known:
            row.symlinks = json.dumps(sorted(known | set(names)))
        row.updated_ms = now
    session.flush()
    return row


# -- observed lineage as a graph ------------------------------------------------------------


def observed_job_node(namespace: str, name: str) -> str:
    # Barrier job names have no '/', so these never meet a barrier job's node.
    return f"job:{namespace}/{name}"


def dataset_node(dataset: ObservedDataset, tables: set[str]) -> tuple[str, str, str]:
    """(node id, kind, name) of an observed dataset: the table its symlinks facet names,
    or failing that its own name names, when that is one of ``tables``; else a dataset
    by namespace and name."""
    for name in [*json.loads(dataset.symlinks), dataset.name]:
        parts = name.split(".")
        # A symlink may carry the catalog's name in front: cat.dw.orders is dw.orders.
        for start in range(len(parts) - 1):
            table = ".".join(parts[start:])
            if table in tables:
                return table_node(table), "table", table
    return f"dataset:{dataset.namespace}/{dataset.name}", "dataset", dataset.name


def known_tables(barrier: nx.DiGraph, datasets: Sequence[ObservedDataset]) -> set[str]:
    """The barrier topology's tables, and the table identifiers symlinks facets gave
    (an Iceberg table written outside the barrier jobs is a table all the same)."""
    tables = {data["name"] for _, data in barrier.nodes(data=True) if data["kind"] == "table"}
    for dataset in datasets:
        tables.update(name for name in json.loads(dataset.symlinks) if is_table_name(name))
    return tables


def with_observed(session: Session, barrier: nx.DiGraph) -> nx.DiGraph:
    """The barrier topology with the observed jobs and datasets added, marked
    ``observed``: a copy, the barrier graph itself (cached, shared) is never changed.
    Callers ask first whether anything was observed (lineage.repository.topology_state)."""
    graph = barrier.copy()
    jobs, datasets, edges = repo.all_observed(session)
    tables = known_tables(barrier, datasets)
    job_nodes = {}
    for job in jobs:
        node = observed_job_node(job.namespace, job.name)
        job_nodes[job.id] = node
        graph.add_node(node, kind="job", name=job.name, namespace=job.namespace, observed=True)
    dataset_nodes = {}
    for dataset in datasets:
        node, kind, name = dataset_node(dataset, tables)
        dataset_nodes[dataset.id] = node
        if node not in graph:
            graph.add_node(node, kind=kind, name=name, namespace=dataset.namespace, observed=True)
    for edge in edges:
        job_node, data_node = job_nodes[edge.job_id], dataset_nodes[edge.dataset_id]
        u, v = (data_node, job_node) if edge.direction == "input" else (job_node, data_node)
        if not graph.has_edge(u, v):
            graph.add_edge(u, v, observed=True)
    return graph
