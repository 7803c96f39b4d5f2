from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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


# The published addresses share one column (``tables.log_address``), separated by spaces.
LOG_ADDRESSES_MAX_CHARS = 400
LOG_SERVICES_MAX = 16


class TableLogSpec(BaseModel):
    """The body of ``PUT /tables/{table}/log``: where the table's log service runs, or its
    services when its rows are spread over several by partition (give ``address`` or
    ``addresses``)."""

    model_config = ConfigDict(extra="forbid")

    mode: LogMode = Field(
        description="'embedded': run by the writing Spark driver; 'external': a standalone "
        "`metaservice log start`"
    )
    address: str | None = Field(
        None, max_length=400, pattern=LOG_ADDRESS, examples=["http://10.0.0.5:7070"]
    )
    addresses: list[Annotated[str, Field(max_length=400, pattern=LOG_ADDRESS)]] | None = Field(
        None,
        min_length=1,
        max_length=LOG_SERVICES_MAX,
        description="Several log services the writer spreads the table's rows over by "
        "partition (readers merge them); instead of address. At most "
        f"{LOG_ADDRESSES_MAX_CHARS} characters in all",
        examples=[["http://10.0.0.5:7070", "http://10.0.0.6:7070"]],
    )

    @field_validator("addresses")
    @classmethod
    def _different(cls, addresses: list[str] | None) -> list[str] | None:
        if addresses is not None:
            if len(set(addresses)) != len(addresses):
                raise ValueError("addresses holds the same address twice")
            if len(" ".join(addresses)) > LOG_ADDRESSES_MAX_CHARS:
                raise ValueError(
                    f"addresses take more than {LOG_ADDRESSES_MAX_CHARS} characters in all"
                )
        return addresses

    def all_addresses(self) -> list[str]:
        return [self.address] if self.address is not None else list(self.addresses or [])


class TableLogView(BaseModel):
    mode: LogMode
    address: str = Field(
        description="The log service's address; for a log spread over several services, "
        "their addresses separated by spaces (so a client that knows one address only "
        "fails to reach it and never follows a part of the log as if it were all of it)"
    )
    addresses: list[str] = Field(
        default_factory=list,
        description="Every log service of the table (one, or the several its rows are "
        "spread over by partition: a reader merges them all)",
    )
    updated_ms: int = Field(description="When the writer last published it")

    @model_validator(mode="after")
    def _from_address(self) -> Self:
        if not self.addresses:  # an older MetaService's answer names the address only
            self.addresses = self.address.split()
        return self


class LogOffset(BaseModel):
    barrier: int
    batch_id: int
    seq: int = Field(description="Given by the log; grows with every append to the table")


class LogPersistedMark(BaseModel):
    barrier: int
    batch_id: int = Field(description="The newest batch marked committed")
    snapshot_id: int
    through_seq: int = Field(description="Every entry of the batch has a seq below this")


class LogStatus(BaseModel):
    """A table's log as its log service holds it now (the log service's ``GET /v1/status``)."""

    epoch: int = Field(description="Changes when a writer restarts, or the log service does")
    entries: int = Field(description="Entries held (one per record batch appended)")
    bytes: int = Field(description="Memory the held rows take")
    first: LogOffset | None = Field(description="The oldest entry held; None: empty")
    last: LogOffset | None = Field(description="The newest entry held; None: empty")
    persisted: LogPersistedMark | None = Field(
        description="The newest batch committed to the table, as the writer marked it"
    )
    complete_after: int | None = Field(
        description="Every entry of every batch after this batch is held; None: not known yet"
    )
    over_bound: bool = Field(
        description="Rows not yet committed hold the log past its memory bound (they are kept)"
    )
    readers: list[str] = Field(description="Readers seen in the last minute")
    spilled_entries: int = Field(
        0, description="Entries held in spill files rather than memory (rows past the bound)"
    )
    spilled_bytes: int = Field(0, description="Memory the spilled entries' rows took")
    spill_folder: str | None = Field(
        None, description="Where rows past the bound are spilled; None: kept in memory"
    )
    job: str | None = Field(
        None,
        description="The job whose batch ids the log holds, as its writer named it at its "
        "reset; None: not named",
    )


class LogServiceStatus(BaseModel):
    """One log service of a table, asked just now."""

    address: str
    reachable: bool = Field(
        description="False: the log service did not answer (down, or its address is wrong)"
    )
    status: LogStatus | None = Field(description="None when the log service could not tell")
    error: str | None = Field(description="Why there is no status")


class TableLogStatus(TableLogView):
    """``GET /tables/{table}/log``: where the table's log runs and, asked just now, what it
    holds."""

    table: str
    reachable: bool = Field(
        description="False: a log service did not answer (down, or its address is wrong)"
    )
    status: LogStatus | None = Field(
        description="The log service's status when the log is one service; None when it "
        "could not tell, and for a log of several services (see services)"
    )
    error: str | None = Field(description="Why there is no status (the first service's)")
    services: list[LogServiceStatus] = Field(
        default_factory=list, description="Each log service of the table, in addresses' order"
    )


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
    job: str | None = Field(
        description="the job that wrote it; None once that job was deleted (the table "
        "keeps its history)"
    )
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
