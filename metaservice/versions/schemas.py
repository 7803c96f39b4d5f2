from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ConsistentVersion(BaseModel):
    """Snapshots that belong together: reading them joins to the sources as of ``barrier``."""

    barrier: int
    snapshots: dict[str, int | None] = Field(
        description="Snapshot of each table at the barrier; null for a table still empty then"
    )
    lease_id: str | None = None
    lease_expires_ms: int | None = None


class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tables: list[str] = Field(min_length=1)
    at_or_before: int | None = Field(None, ge=0)
    lease_seconds: int = Field(ge=1)
