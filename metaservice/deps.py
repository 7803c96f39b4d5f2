"""FastAPI dependencies: the service's context, its database, and paging."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Query, Request

from metaservice.barriers.schemas import MAX_SIGNED_64
from metaservice.context import Context
from metaservice.db import Database
from metaservice.errors import TooLarge


@dataclass
class Services:
    ctx: Context
    db: Database


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


@dataclass
class Paging:
    limit: int
    offset: int


def paging(
    request: Request,
    limit: int = Query(100, ge=1, description="Items per page"),
    offset: int = Query(0, ge=0, le=MAX_SIGNED_64, description="Items to skip"),
) -> Paging:
    most = services(request).ctx.settings.max_page_size
    if limit > most:
        raise TooLarge(f"limit {limit} is over the page size limit of {most}", field="limit")
    return Paging(limit=limit, offset=offset)
