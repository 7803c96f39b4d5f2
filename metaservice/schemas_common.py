"""Shapes shared by every feature: pages and errors."""

from __future__ import annotations

from typing import Generic, TypeVar

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
