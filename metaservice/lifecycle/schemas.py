from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PlannedSnapshot(BaseModel):
    snapshot_id: int
    barrier: int
    batch_id: int
    reasons: list[str] = Field(
        default_factory=list, description="Why it is kept (empty if expirable)"
    )


class ExpiryPlan(BaseModel):
    table: str
    oldest_in_use: int | None = Field(
        description="Snapshot id; everything older may be expired, tagged snapshots excepted"
    )
    expiry_horizon: int | None = Field(
        None,
        description="Barrier below which snapshots may have been expired: no version or "
        "lease is handed out on a snapshot older than the table's snapshot at it",
    )
    expirable: list[PlannedSnapshot]
    kept: list[PlannedSnapshot]


# A bound the database holds (BIGINT) with room for the arithmetic on it (seconds to ms).
MAX_KEEP = 2**53 // 1000


class RetentionUpdate(BaseModel):
    """The body of ``PUT /tables/{table}/retention``: the table's whole policy. A field
    left out (or null) follows the service's default; at least one must be given."""

    model_config = ConfigDict(extra="forbid")

    keep_last: int | None = Field(
        None, ge=1, le=MAX_KEEP, description="Keep the newest N snapshots", examples=[10]
    )
    keep_for_seconds: int | None = Field(
        None,
        ge=0,
        le=MAX_KEEP,
        description="Keep snapshots reported less than this many seconds ago (0: none for "
        "their age)",
        examples=[86_400],
    )


class Retention(BaseModel):
    """A table's retention policy as it applies: its own values, else the defaults."""

    table: str
    keep_last: int = Field(description="The newest N snapshots are kept")
    keep_for_seconds: int = Field(description="Snapshots younger than this are kept")
    keep_last_is_default: bool = Field(description="keep_last is the service's default")
    keep_for_seconds_is_default: bool = Field(
        description="keep_for_seconds is the service's default"
    )


class ExpireRequest(BaseModel):
    """The body of ``POST /tables/{table}/expire`` (optional)."""

    model_config = ConfigDict(extra="forbid")

    dry_run: bool = Field(
        False,
        description="List what would be removed now and change nothing (no reservation: a "
        "lease taken before the real run still keeps its snapshot)",
    )


class RemovedFile(BaseModel):
    path: str
    kind: Literal["data", "deletes", "manifest", "manifest_list", "log"] = Field(
        description="log: rows the table's log store spilled for the snapshot's batch"
    )
    bytes: int


class RefusedFile(BaseModel):
    """A file an expired snapshot's metadata names outside what the service owns: left."""

    path: str
    kind: Literal["data", "deletes", "manifest", "manifest_list", "log"]
    snapshot_id: int = Field(description="The expired snapshot that names it")


class ExpiryResult(BaseModel):
    """What an expiry removed from one table (or, on a dry run, would remove)."""

    table: str
    dry_run: bool
    snapshots: list[PlannedSnapshot] = Field(
        description="The reported snapshots removed from the Iceberg table (dry run: that "
        "may be removed now)"
    )
    already_gone: list[int] = Field(
        default_factory=list,
        description="Snapshot ids the plan listed that the Iceberg table no longer had "
        "(recorded as expired too)",
    )
    held_by_refs: list[int] = Field(
        default_factory=list,
        description="Snapshot ids the plan listed that a branch or tag of the Iceberg "
        "table points at: kept, with everything they use",
    )
    files: list[RemovedFile] = Field(
        description="Files only those snapshots referenced, deleted (dry run: to delete)"
    )
    refused_files: list[RefusedFile] = Field(
        default_factory=list,
        description="Files only those snapshots referenced that lie neither under the "
        "table's location nor under a configured log spill location "
        "(log_spill_locations): not deleted (dry run: would not be), and logged",
    )
    snapshots_removed: int
    files_removed: int
    bytes_freed: int
    expiry_horizon: int | None = Field(
        description="The table's expiry horizon afterwards (see ExpiryPlan)"
    )
