from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Role(StrEnum):
    """What a token may do; each role can do everything the ones before it can.

    >>> Role.WRITER.includes(Role.READER), Role.WRITER.includes(Role.ADMIN)
    (True, False)
    """

    READER = "reader"  # every query (GET under /api/v1)
    WRITER = "writer"  # + registration, barriers, commit reports, job events, leases
    ADMIN = "admin"  # + deleting jobs and managing tokens

    def includes(self, other: Role) -> bool:
        return _ORDER.index(self) >= _ORDER.index(other)


_ORDER = (Role.READER, Role.WRITER, Role.ADMIN)


# A job name (see metaservice.names) in which '*' stands for any run of characters and
# '?' for one: the shell's patterns, without brackets.
JOB_SCOPE_PATTERN = r"^[A-Za-z0-9_.\-*?]{1,200}$"
JobScope = Annotated[str, Field(pattern=JOB_SCOPE_PATTERN, examples=["ingest_*"])]
_JOBS_DESCRIPTION = (
    "For a writer token: the jobs it may act for, by name or pattern ('*' any characters, "
    "'?' one); it then registers, runs and reports only those jobs and publishes logs only "
    "for the tables they write. Absent: every job."
)


class TokenRequest(BaseModel):
    """The body of ``POST /tokens``."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    description: str = Field("", max_length=1000, examples=["spark jobs of team orders"])
    jobs: list[JobScope] | None = Field(
        None, min_length=1, max_length=100, description=_JOBS_DESCRIPTION
    )


class TokenCreated(BaseModel):
    id: int
    role: Role
    jobs: list[str] | None = Field(None, description=_JOBS_DESCRIPTION)
    token: str = Field(description="The bearer token; shown only here, the service keeps its hash")


class TokenView(BaseModel):
    id: int
    role: Role
    description: str
    created_ms: int
    jobs: list[str] | None = Field(None, description=_JOBS_DESCRIPTION)
