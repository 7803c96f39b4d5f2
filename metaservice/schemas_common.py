"""Shapes shared by every feature: pages and errors."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list endpoint and the total number of items."""

    items: list[T]
    total: int
    limit: int
    offset: int


class ErrorBody(BaseModel):
    """Every error response: a stable machine code, a human message, the offending field."""

    model_config = ConfigDict(extra="allow")

    code: str = Field(examples=["conflict"])
    message: str
    field: str | None = None


ERROR_DESCRIPTIONS = {
    400: "The request body is not valid JSON",
    401: "Auth is on and the request has no known token",
    403: "The token's role is too small for this request, a writer token scoped to other "
    "jobs sent it (out_of_scope), or a browser page of another origin sent it",
    404: "A job, table, lease, snapshot or token that does not exist",
    409: "Contradicts what is recorded (cycle, second writer, out-of-order batch, no version yet)",
    413: "Past a configured bound (body size, page size, tables per query, lineage depth)",
    415: "The request body is not sent as JSON (Content-Type: application/json)",
    422: "The request is well-formed but breaks a rule",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for error statuses, all answered with ErrorBody."""
    return {s: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}
