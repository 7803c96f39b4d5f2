from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from metaservice.topology.schemas import JobEvent

MAX_SIGNED_64 = 2**63 - 1


class InputRange(BaseModel):
    """What one batch of a derived job reads from one input: snapshots in (from, to]."""

    table: str
    from_barrier: int
    to_barrier: int
    from_snapshot: int | None = Field(description="Exclusive start; None reads from the beginning")
    to_snapshot: int | None = Field(description="Inclusive end; None when the input is empty")


class BatchBarrier(BaseModel):
    job: str
    batch_id: int
    barrier: int
    start_barrier: int | None = Field(
        description="Derived jobs: the batch reads input snapshots with barriers after this one"
    )
    committed: bool
    inputs: list[InputRange] = Field(default_factory=list)


class NextBarrier(BaseModel):
    job: str
    barrier: int = Field(description="The offset the job's barrier sources report as latest")
    start_barrier: int = Field(description="The start the batch ending at `barrier` begins after")
    ready: bool = Field(description="True when there is a new batch to run up to `barrier`")


class CommitReport(BaseModel):
    """A commit of one job's batch to one table. ``snapshot_id`` is null for an empty batch."""

    model_config = ConfigDict(extra="forbid")

    job: str = Field(min_length=1, max_length=200)
    batch_id: int = Field(ge=0, le=MAX_SIGNED_64)
    barrier: int = Field(ge=0, le=MAX_SIGNED_64)
    table: str = Field(min_length=1, max_length=400)
    snapshot_id: int | None = Field(None, ge=-(2**63), le=MAX_SIGNED_64)


class CommitBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    commits: list[CommitReport] = Field(min_length=1)


class CommitResult(BaseModel):
    job: str
    batch_id: int
    table: str
    barrier: int
    snapshot_id: int | None
    status: str = Field(description="'recorded', or 'duplicate' for a report already recorded")
    batch_committed: bool = Field(description="True once every output of the batch is reported")


class CommitBatchResult(BaseModel):
    results: list[CommitResult]
    recorded: int
    duplicates: int


class BatchRequest(BaseModel):
    """The optional body of a barrier request: what the caller knows about the batch.

    A derived job's sink says which offsets Spark planned (``start``, ``end``), so the
    MetaService refuses a batch that is not the one it planned; every sink says which
    Spark query runs the batch (``query_id``), so a reset checkpoint is refused instead
    of being taken for a replay. A source job holding an offline grant claims the
    barrier it gave the batch while the MetaService was unreachable (``barrier``).
    """

    model_config = ConfigDict(extra="forbid")

    barrier: int | None = Field(
        None, ge=0, le=MAX_SIGNED_64, description="Offline claim: on the grid, >= the floor"
    )
    start: int | None = Field(
        None, ge=0, le=MAX_SIGNED_64, description="Derived jobs: the start offset Spark planned"
    )
    end: int | None = Field(
        None, ge=0, le=MAX_SIGNED_64, description="Derived jobs: the end offset Spark planned"
    )
    query_id: str | None = Field(
        None, min_length=1, max_length=64, description="The Spark query (checkpoint) identity"
    )
    # What the request carries besides (one request per batch): each part is applied and
    # answered on its own, in ``carried`` (barriers/carried.py).
    reports: list[CommitReport] | None = Field(
        None,
        min_length=1,
        description="Commit reports of the job's earlier batches (batch k's, on batch k+1's "
        "request), recorded as `POST /commits/batch` records them, all or nothing, before "
        "the barrier; a refusal refuses only them",
    )
    progress: JobEvent | None = Field(
        None, description="The listener's event of the job's query (`POST /jobs/{job}/events`)"
    )
    floor: int | None = Field(
        None,
        ge=0,
        le=MAX_SIGNED_64,
        description="A source job's offline-grant promise (`PUT /jobs/{job}/offline-grant`), "
        "taken after the barrier",
    )

    def carries(self) -> bool:
        return self.reports is not None or self.progress is not None or self.floor is not None


class PartRefused(BaseModel):
    """A carried part the MetaService refused: the error its own request would have got."""

    status: int
    code: str
    message: str
    field: str | None = None


class Carried(BaseModel):
    """What became of each part a barrier request carried, each on its own: a part left
    out of the request is absent here, a refused one has its ``..._refused``."""

    reports: CommitBatchResult | None = Field(
        None, description="The carried reports, recorded (or duplicates of recorded ones)"
    )
    reports_refused: PartRefused | None = None
    progress: bool | None = Field(None, description="True: the event was recorded")
    progress_refused: PartRefused | None = None
    grant: OfflineGrant | None = Field(None, description="The offline grant the promise renewed")
    grant_refused: PartRefused | None = None


class CarriedBatchBarrier(BatchBarrier):
    """A batch's barrier, and what became of the parts its request carried (``carried``
    is absent when the request carried none)."""

    carried: Carried | None = None


class ClaimedBarrier(BaseModel):
    """One batch's barrier, given by the job itself while offline."""

    model_config = ConfigDict(extra="forbid")

    batch_id: int = Field(ge=0, le=MAX_SIGNED_64)
    barrier: int = Field(ge=0, le=MAX_SIGNED_64, description="On the barrier grid, >= the floor")
    query_id: str | None = Field(
        None, min_length=1, max_length=64, description="The Spark query (checkpoint) identity"
    )


class ClaimBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    claims: list[ClaimedBarrier] = Field(min_length=1, description="In batch order")


class ClaimBatchResult(BaseModel):
    results: list[BatchBarrier]


class OfflineGrantRequest(BaseModel):
    """A source job's promise: it will never give itself a barrier below ``floor``."""

    model_config = ConfigDict(extra="forbid")

    floor: int = Field(ge=0, le=MAX_SIGNED_64)


class OfflineGrant(BaseModel):
    job: str
    floor: int = Field(
        description="The job's frontier stays below this barrier until the job reports in again"
    )
    barrier: int = Field(description="The barrier clock's current slot")
    now_ms: int = Field(description="The MetaService's clock, to correct the job's clock offset")
    interval_ms: int = Field(description="Width of one barrier-clock slot")


Carried.model_rebuild()
CarriedBatchBarrier.model_rebuild()
