from __future__ import annotations

from pydantic import BaseModel, Field


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


class ConsumedRange(BaseModel):
    """Snapshots of one input that a batch consumed: (from_snapshot, to_snapshot]."""

    table: str
    from_barrier: int
    to_barrier: int
    from_snapshot: int | None
    to_snapshot: int | None


class SnapshotLineage(BaseModel):
    table: str
    snapshot_id: int
    job: str
    batch_id: int
    barrier: int
    inputs: list[ConsumedRange]
