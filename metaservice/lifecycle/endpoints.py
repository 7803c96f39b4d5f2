from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from metaservice.auth.schemas import Role
from metaservice.deps import Services, require, services
from metaservice.lifecycle import expiry, service
from metaservice.lifecycle.schemas import (
    ExpireRequest,
    ExpiryPlan,
    ExpiryResult,
    Retention,
    RetentionUpdate,
)
from metaservice.schemas_common import ErrorBody, error_responses

router = APIRouter(tags=["lifecycle"], dependencies=[require(Role.READER)])

CATALOG_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {
        "model": ErrorBody,
        "description": "The Iceberg catalog or its storage cannot be used (catalog_unavailable)",
    }
}


@router.get("/tables/{table}/expirable", response_model=ExpiryPlan, responses=error_responses(404))
def expirable(table: str, s: Services = Depends(services)) -> ExpiryPlan:
    """The expiry plan: snapshots that may be expired, and why each other one is kept."""
    return s.db.read(lambda session: service.expiry_plan(session, s.ctx, table))


@router.post(
    "/tables/{table}/expire",
    response_model=ExpiryResult,
    dependencies=[require(Role.ADMIN)],
    responses={**error_responses(400, 404, 409, 413), **CATALOG_UNAVAILABLE},
)
def expire(
    table: str, body: ExpireRequest | None = None, s: Services = Depends(services)
) -> ExpiryResult:
    """Expire the table's snapshots that are not in use now, through pyiceberg, and delete
    the files only they referenced (admin). A lease taken meanwhile is never broken.
    ``dry_run``: list them and change nothing."""
    dry_run = body is not None and body.dry_run
    return expiry.expire_table(s.db, s.ctx, table, dry_run=dry_run)


@router.get("/tables/{table}/retention", response_model=Retention, responses=error_responses(404))
def get_retention(table: str, s: Services = Depends(services)) -> Retention:
    """The table's retention policy as it applies (its own values, else the defaults)."""
    return s.db.read(lambda session: service.get_retention(session, s.ctx, table))


@router.put(
    "/tables/{table}/retention",
    response_model=Retention,
    dependencies=[require(Role.ADMIN)],
    responses=error_responses(400, 404, 413),
)
def put_retention(table: str, body: RetentionUpdate, s: Services = Depends(services)) -> Retention:
    """Set the table's retention policy (admin): keep the newest N snapshots, and those
    younger than T seconds. A field left out follows the service's default."""
    return s.db.write(lambda session: service.put_retention(session, s.ctx, table, body))


@router.delete(
    "/tables/{table}/retention",
    response_model=Retention,
    dependencies=[require(Role.ADMIN)],
    responses=error_responses(404),
)
def delete_retention(table: str, s: Services = Depends(services)) -> Retention:
    """Drop the table's own retention policy (admin): the service's defaults apply again."""
    return s.db.write(lambda session: service.delete_retention(session, s.ctx, table))
