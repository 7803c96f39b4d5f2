from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from metaservice.barriers.schemas import MAX_SIGNED_64

RevisionState = Literal[
    "creating", "planned", "running", "ready", "swapping", "swapped", "cancelled"
]
MAX_SWAP_WAIT_SECONDS = 300
MAX_REVISION_ID = 2**31 - 1  # revisions.id is an INTEGER column


class RevisionRequest(BaseModel):
    """The body of ``POST /revisions``: revise ``table`` and its downstream closure from
    ``from_barrier``."""

    model_config = ConfigDict(extra="forbid")

    table: str = Field(description="The table to revise", examples=["dwd.order_detail"])
    from_barrier: int = Field(
        ge=0,
        le=MAX_SIGNED_64,
        description="Revise from this barrier: each mirror starts at its original's "
        "snapshot at it (the latest snapshot with a barrier at or below it)",
        examples=[1_700_000_000_000],
    )


class MirrorView(BaseModel):
    """One affected table of a revision and its mirror."""

    table: str = Field(description="The original table")
    mirror: str = Field(description="The mirror table in the jobs' catalog")
    start_snapshot: int | None = Field(
        description="The original's snapshot at from_barrier, where the mirror's history "
        "starts; null: the original was empty there (the mirror starts empty)"
    )
    writer: str = Field(description="The job that writes the table")
    revision_job: str = Field(
        description="The job that writes the mirror: the writer re-run, named <writer>__rev<id>"
    )
    frontier: int = Field(
        description="How far the mirror is written: its revision job's frontier (from_barrier "
        "until the job commits a batch past it)"
    )
    original_frontier: int | None = Field(
        None, description="The original's frontier now (null: its writer is gone)"
    )
    lag_ms: int | None = Field(
        None,
        description="original_frontier - frontier: how far the mirror trails its original "
        "(barriers are times); 0 once it has caught up",
    )


class MirrorInput(BaseModel):
    """An input a revised job reads from a mirror instead of the original."""

    table: str
    mirror: str


class MustRun(BaseModel):
    """A job that must run in revision mode: it writes the mirrors of ``outputs`` and reads
    ``mirror_inputs`` from their mirrors (its other inputs from the originals)."""

    job: str
    revision_job: str = Field(
        description="The name to run it under (<job>__rev<id>): registered already, reading "
        "the mirrors and writing them, positioned at from_barrier"
    )
    outputs: list[MirrorInput] = Field(description="Its affected outputs and their mirrors")
    mirror_inputs: list[MirrorInput] = Field(
        description="Its inputs that it must read from a mirror"
    )


class RevisionView(BaseModel):
    """A revision: what it mirrors, from where, and how far the mirrors are."""

    id: int
    table: str = Field(description="The table revised (the others are downstream of it)")
    from_barrier: int
    state: RevisionState = Field(
        description="creating: its mirrors are being made; planned: they all exist and the "
        "revision jobs are registered at from_barrier; running: a revision job committed "
        "past from_barrier; ready: every mirror is within revision_ready_lag_ms of its "
        "original (POST /swap may begin); swapping: the original writers are superseded "
        "and the swap waits for the mirrors to reach them; swapped: the mirrors carry the "
        "original names; cancelled: its mirrors and revision jobs are dropped"
    )
    created_ms: int
    updated_ms: int
    tables: list[MirrorView] = Field(description="The affected tables, by name")
    must_run: list[MustRun] = Field(description="The writers of the affected tables, by name")
    swap_waits_for: str | None = Field(
        None,
        description="While swapping: what the swap waits for before it can happen (an "
        "original's open batch to be reported, a mirror to reach its frozen original, or "
        "a table whose consistent version with the affected ones would go back); null "
        "otherwise",
    )


class SwapRequest(BaseModel):
    """The body of ``POST /revisions/{id}/swap`` (optional)."""

    model_config = ConfigDict(extra="forbid")

    wait_seconds: float = Field(
        30,
        ge=0,
        le=MAX_SWAP_WAIT_SECONDS,
        description="How long to wait for the mirrors to reach the frozen originals before "
        "answering 202 (state swapping; POST /swap again continues)",
    )
