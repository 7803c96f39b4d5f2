"""What reconciliation reads (stamps) and what it answers (a per-table report)."""

from __future__ import annotations

from pydantic import BaseModel, Field, computed_field


class Stamp(BaseModel):
    """The MetaService stamp in one Iceberg snapshot's summary."""

    snapshot_id: int
    barrier: int = Field(description="metaservice.barrier")
    job: str = Field(description="metaservice.job")
    batch_id: int = Field(description="metaservice.batch")


class Recorded(BaseModel):
    """A commit reconciliation recorded (``snapshot_id`` None: an empty commit)."""

    job: str
    batch_id: int
    barrier: int
    snapshot_id: int | None


class StampIssue(BaseModel):
    """A stamp that was not applied, and why."""

    job: str
    batch_id: int
    barrier: int
    snapshot_id: int
    code: str = Field(
        description="conflicting_report, barrier_mismatch, snapshot_recorded_elsewhere, "
        "barrier_from_future, batch_complete (conflicts); not_writer, batch_abandoned, "
        "output_added_after_batch (skipped)"
    )
    message: str


class TableReconciliation(BaseModel):
    table: str
    writer: str | None = None
    stamped: int = Field(0, description="Stamped snapshots read from the table")
    already_present: int = 0
    added: list[Recorded] = Field(default_factory=list)
    closed_empty: list[Recorded] = Field(
        default_factory=list,
        description="Open batches a later stamped batch proves finished, with no snapshot "
        "in this table: recorded as empty commits",
    )
    conflicts: list[StampIssue] = Field(default_factory=list)
    skipped: list[StampIssue] = Field(
        default_factory=list,
        description="Stamps of a job that does not write the table, of a batch an operator "
        "abandoned, or of a batch opened before the table became its job's output: never "
        "recorded, as their commit reports would not be",
    )
    note: str | None = Field(None, description="Why the table was not (fully) reconciled")
    error: str | None = Field(None, description="The table could not be read")


class ReconcileReport(BaseModel):
    check: bool = Field(description="True for a dry run: nothing was changed")
    tables: list[TableReconciliation]
    last_issued_before: int
    last_issued_after: int = Field(
        description="The barrier clock afterwards (what it would be, for a dry run)"
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def added(self) -> int:
        return sum(len(t.added) + len(t.closed_empty) for t in self.tables)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def already_present(self) -> int:
        return sum(t.already_present for t in self.tables)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def conflicts(self) -> int:
        return sum(len(t.conflicts) for t in self.tables)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def errors(self) -> int:
        return sum(1 for t in self.tables if t.error is not None)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        """No conflicts and every table read."""
        return self.conflicts == 0 and self.errors == 0
