from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Response

from metaservice.auth.schemas import Role
from metaservice.auth.service import Caller, check_role
from metaservice.deps import Services, caller, require, services
from metaservice.schemas_common import error_responses
from metaservice.versions import service
from metaservice.versions.schemas import ConsistentVersion, LeaseRequest

router = APIRouter(tags=["versions"], dependencies=[require(Role.READER)])


def consistent(
    s: Services, tables: list[str], at_or_before: int | None, lease_seconds: int | None
) -> ConsistentVersion:
    names = service.parse_tables(s.ctx, tables)
    if lease_seconds is not None:
        seconds = lease_seconds
        return s.db.write(
            lambda session: service.lease_version(session, s.ctx, names, at_or_before, seconds)
        )
    # Sealing is a write; take it only when a writer can move, then read. A request
    # that needs no write is answered by the read that decided so.
    version = s.db.read(
        lambda session: service.version_unless_sealing(session, s.ctx, names, at_or_before)
    )
    if version is not None:
        return version
    s.db.write(lambda session: service.seal_writers(session, s.ctx, names))
    return s.db.read(
        lambda session: service.consistent_version(session, s.ctx, names, at_or_before)
    )


@router.get(
    "/versions/consistent",
    response_model=ConsistentVersion,
    response_model_exclude_none=True,
    responses=error_responses(404, 409, 413),
)
def consistent_version(
    tables: str = Query(
        description="Comma-separated table identifiers",
        examples=["dwd.order_detail,dws.item_revenue"],
    ),
    at_or_before: int | None = Query(
        None, ge=0, description="Latest version at or before this barrier"
    ),
    lease_seconds: int | None = Query(
        None, ge=1, description="Also pin the snapshots for this long"
    ),
    s: Services = Depends(services),
    who: Caller = Depends(caller),
) -> ConsistentVersion:
    """The snapshots of several tables that belong together (409 while none exists).

    Taking a lease (``lease_seconds``) is a write and needs the writer role.
    """
    if lease_seconds is not None:
        check_role(who, Role.WRITER, "a lease (lease_seconds)")
    return consistent(s, tables.split(","), at_or_before, lease_seconds)


@router.post(
    "/leases",
    response_model=ConsistentVersion,
    status_code=201,
    responses=error_responses(400, 404, 409, 413),
    dependencies=[require(Role.WRITER)],
)
def create_lease(body: LeaseRequest, s: Services = Depends(services)) -> ConsistentVersion:
    """Pin the consistent version of some tables against expiry."""
    return consistent(s, body.tables, body.at_or_before, body.lease_seconds)


@router.delete(
    "/leases/{lease_id}",
    status_code=204,
    responses=error_responses(404),
    dependencies=[require(Role.WRITER)],
)
def delete_lease(lease_id: str, s: Services = Depends(services)) -> Response:
    s.db.write(lambda session: service.delete_lease(session, lease_id))
    return Response(status_code=204)
