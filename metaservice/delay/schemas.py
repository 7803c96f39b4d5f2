from __future__ import annotations

from pydantic import BaseModel, Field


class JobLag(BaseModel):
    """A job's own share of the delay: how far its output trails its slowest input
    (for a source job: how far its output trails the wall clock)."""

    job: str
    output: str = Field(
        description="The job's output on the way to the table asked about (on the critical "
        "path: the table on it)"
    )
    outputs: list[str] = Field(
        default_factory=list,
        description="Every output of the job; they share its frontier, so its lag is theirs",
    )
    slowest_input: str | None
    input_frontier: int = Field(
        description="Frontier of the slowest input, or now for a source job"
    )
    output_frontier: int = Field(description="0 while the job has committed nothing")
    contribution_ms: int | None = Field(
        description="input_frontier - output_frontier; None while the job has committed "
        "nothing (no data yet)"
    )


class Delay(BaseModel):
    table: str
    now_ms: int
    frontier: int | None = Field(
        description="The writer's frontier; None while it has committed nothing (no data yet)"
    )
    delay_ms: int | None = Field(description="now - frontier; None while frontier is None")
    critical_path: list[JobLag] = Field(
        description="From the table up to a source: at each job, the input holding it back. "
        "The contributions add up to delay_ms (when there is one)."
    )
    jobs: list[JobLag] = Field(
        description="Every upstream job's own lag, largest first (jobs with no data yet first)"
    )
