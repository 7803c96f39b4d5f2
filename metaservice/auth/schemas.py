from __future__ import annotations

from enum import StrEnum

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


class TokenRequest(BaseModel):
    """The body of ``POST /tokens``."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    description: str = Field("", max_length=1000, examples=["spark jobs of team orders"])


class TokenCreated(BaseModel):
    id: int
    role: Role
    token: str = Field(description="The bearer token; shown only here, the service keeps its hash")


class TokenView(BaseModel):
    id: int
    role: Role
    description: str
    created_ms: int
