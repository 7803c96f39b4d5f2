from __future__ import annotations

from pydantic import BaseModel, Field


class TableLease(BaseModel):
    """A live lease pinning one of the table's snapshots against expiry."""

    lease_id: str
    barrier: int = Field(description="The consistent version's barrier the lease was taken on")
    snapshot_id: int | None = Field(
        description="The table's snapshot the lease pins; null: the table was empty then"
    )
    created_ms: int
    expires_ms: int
    tables: int = Field(description="How many tables the lease pins, this one included")
