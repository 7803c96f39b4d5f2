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
    expiry_horizon: int | None = Field(
        None,
        description="Barrier below which snapshots may have been expired: no version or "
        "lease is handed out on a snapshot older than the table's snapshot at it",
    )
    expirable: list[PlannedSnapshot]
    kept: list[PlannedSnapshot]
