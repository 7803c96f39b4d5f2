from __future__ import annotations

from pydantic import BaseModel, Field


class JobLag(BaseModel):
    """A job's own share of the delay: how far its output trails its slowest input
    (for a source job: how far its output trails the wall clock)."""

    job: str
    output: str
    slowest_input: str | None
    input_frontier: int = Field(
        description="Frontier of the slowest input, or now for a source job"
    )
    output_frontier: int
    contribution_ms: int


class Delay(BaseModel):
    table: str
    now_ms: int
    frontier: int
    delay_ms: int = Field(description="now - frontier")
    critical_path: list[JobLag] = Field(
        description="From the table up to a source: at each job, the input holding it back. "
        "The contributions add up to delay_ms."
    )
    jobs: list[JobLag] = Field(description="Every upstream job's own lag, largest first")
