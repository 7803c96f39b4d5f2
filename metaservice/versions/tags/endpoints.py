from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from metaservice.auth.schemas import Role
from metaservice.deps import Paging, Services, paging, require, services
from metaservice.lifecycle.endpoints import CATALOG_UNAVAILABLE
from metaservice.schemas_common import Page, error_responses
from metaservice.versions.tags import publish, service
from metaservice.versions.tags.schemas import TagRequest, TagView

router = APIRouter(tags=["tags"], dependencies=[require(Role.READER)])


@router.post(
    "/versions/tags",
    response_model=TagView,
    status_code=201,
    dependencies=[require(Role.ADMIN)],
    responses={**error_responses(400, 404, 409, 413), **CATALOG_UNAVAILABLE},
)
def create_tag(body: TagRequest, s: Services = Depends(services)) -> TagView:
    """Publish the consistent version of ``tables`` under ``name`` (admin): every table
    gets an Iceberg tag ``name`` on its snapshot at the version, with a max-ref-age when
    ``retain_seconds`` is given. Expiry keeps tagged snapshots while the tag lasts.
    409 ``tag_exists`` for a name in use (in the MetaService or as a ref of a table)."""
    return publish.create_tag(s.db, s.ctx, body)


@router.get("/versions/tags", response_model=Page[TagView], responses=error_responses(404, 413))
def list_tags(
    table: str | None = Query(None, description="Only the tags of this table"),
    page: Paging = Depends(paging),
    s: Services = Depends(services),
) -> Page[TagView]:
    """The tags that have not ended, by name."""
    return s.db.read(
        lambda session: service.list_tags(session, s.ctx, page.limit, page.offset, table)
    )


@router.get("/versions/tags/{name}", response_model=TagView, responses=error_responses(404))
def get_tag(name: str, s: Services = Depends(services)) -> TagView:
    return s.db.read(lambda session: service.get_tag(session, s.ctx, name))


@router.delete(
    "/versions/tags/{name}",
    response_model=TagView,
    dependencies=[require(Role.ADMIN)],
    responses={**error_responses(404), **CATALOG_UNAVAILABLE},
)
def delete_tag(name: str, s: Services = Depends(services)) -> TagView:
    """Remove the tag's Iceberg tags and its record (admin); answers with the tag removed.
    An ended tag not yet dropped by an expiry can be removed too."""
    return publish.delete_tag(s.db, s.ctx, name)
