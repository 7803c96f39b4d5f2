from __future__ import annotations

from pydantic import BaseModel, Field

from metaservice.barriers.schemas import InputRange


class Node(BaseModel):
    id: str = Field(examples=["table:dwd.order_detail"])
    kind: str = Field(
        description="'job' or 'table'; 'dataset' for an observed dataset that is no table"
    )
    name: str
    # Present only on observed nodes: a barrier node keeps its three fields.
    observed: bool = Field(
        False,
        exclude_if=lambda v: not v,
        description="Known only from OpenLineage events (POST /lineage), not a barrier job "
        "or table; present only when true",
    )
    source: str | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="'openlineage' on an observed node; absent otherwise",
    )
    namespace: str | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="An observed node's OpenLineage namespace; absent otherwise",
    )


class Edge(BaseModel):
    source: str
    target: str
    observed: bool = Field(
        False,
        exclude_if=lambda v: not v,
        description="Reported by OpenLineage events, not the barrier topology; present only "
        "when true",
    )


class LineageGraph(BaseModel):
    root: str
    direction: str
    depth: int | None
    nodes: list[Node]
    edges: list[Edge]


class SnapshotLineage(BaseModel):
    table: str
    snapshot_id: int
    job: str
    batch_id: int
    barrier: int
    inputs: list[InputRange] = Field(
        description="What the batch read from each input it was opened with: snapshots in "
        "(from_snapshot, to_snapshot]; empty for a source job's snapshot"
    )
