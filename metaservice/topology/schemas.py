from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NO_NUL = r"^[^\x00]*$"  # PostgreSQL text cannot hold NUL characters


class JobSpec(BaseModel):
    """The body of ``PUT /jobs/{job}``."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str] = Field(default_factory=list, max_length=1000, examples=[["ods.orders"]])
    outputs: list[str] = Field(min_length=1, max_length=1000, examples=[["dwd.order_detail"]])
    description: str = Field("", max_length=10_000, pattern=NO_NUL)


class JobView(BaseModel):
    name: str
    description: str
    kind: str = Field(description="'source' (no table inputs) or 'derived'")
    inputs: list[str]
    outputs: list[str]
    status: str
    frontier: int = Field(description="Barrier up to which the job's outputs are complete")
    last_barrier: int | None
    last_batch_id: int | None
    pending_target: int | None = Field(
        description="Derived jobs: the barrier the current batch is aligned to"
    )
    last_seen_ms: int | None
    offline_floor: int | None = Field(
        None,
        description="Source jobs holding an offline grant: the frontier stays below this barrier",
    )


LogMode = Literal["embedded", "external"]
# http(s), a host name or address and port, an optional path: printable ASCII only (no
# NUL, which PostgreSQL text cannot hold; no spaces).
LOG_ADDRESS = r"^https?://[A-Za-z0-9.\-\[\]:]+(/[\x21-\x7e]*)?$"


class TableLogSpec(BaseModel):
    """The body of ``PUT /tables/{table}/log``: where the table's log service runs."""

    model_config = ConfigDict(extra="forbid")

    mode: LogMode = Field(
        description="'embedded': run by the writing Spark driver; 'external': a standalone "
        "`metaservice log start`"
    )
    address: str = Field(max_length=400, pattern=LOG_ADDRESS, examples=["http://10.0.0.5:7070"])


class TableLogView(TableLogSpec):
    updated_ms: int = Field(description="When the writer last published it")


class TableView(BaseModel):
    name: str
    writer: str | None
    readers: list[str]
    frontier: int | None = Field(
        description="Barrier up to which the table is complete: its writer's frontier. None "
        "while no job writes the table, or while its (derived) writer has committed nothing"
    )
    latest_snapshot: int | None
    latest_barrier: int | None
    delay_ms: int | None = Field(
        description="now - frontier; None when the frontier is None (no data yet, not the "
        "age of the epoch)"
    )
    log: TableLogView | None = Field(
        None, description="The table's log store, as its writer published it; None: no log"
    )


class SnapshotView(BaseModel):
    snapshot_id: int | None = Field(description="None for a batch that wrote no rows")
    barrier: int
    job: str
    batch_id: int
    reported_ms: int


class JobEvent(BaseModel):
    """Liveness and progress reported by the Spark listener."""

    model_config = ConfigDict(extra="forbid")

    event: str = Field(pattern="^(started|progress|terminated|failed)$")
    run_id: str | None = Field(None, max_length=100, pattern=NO_NUL)
    batch_id: int | None = Field(None, ge=0)
    num_input_rows: int | None = Field(None, ge=0)
    duration_ms: int | None = Field(None, ge=0)
    message: str | None = Field(None, max_length=10_000, pattern=NO_NUL)
