from __future__ import annotations

from pydantic import BaseModel, Field


class PlannedSnapshot(BaseModel):
    snapshot_id: int
    barrier: int
    batch_id: int
    reasons: list[str] = Field(
        default_factory=list, description="Why it is kept (empty if expirable)"
    )


class ExpiryPlan(BaseModel):
    table: str
    oldest_in_use: int | None = Field(description="Snapshot id; everything older may be expired")
    expirable: list[PlannedSnapshot]
    kept: list[PlannedSnapshot]
