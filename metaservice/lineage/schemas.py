from __future__ import annotations

from pydantic import BaseModel, Field

from metaservice.barriers.schemas import InputRange


class Node(BaseModel):
    id: str = Field(examples=["table:dwd.order_detail"])
    kind: str = Field(description="'job' or 'table'")
    name: str


class Edge(BaseModel):
    source: str
    target: str


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
