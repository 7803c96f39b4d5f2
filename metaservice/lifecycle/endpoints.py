from __future__ import annotations

from fastapi import APIRouter, Depends

from metaservice.auth.schemas import Role
from metaservice.deps import Services, require, services
from metaservice.lifecycle import service
from metaservice.lifecycle.schemas import ExpiryPlan
from metaservice.schemas_common import error_responses

router = APIRouter(tags=["lifecycle"], dependencies=[require(Role.READER)])


@router.get("/tables/{table}/expirable", response_model=ExpiryPlan, responses=error_responses(404))
def expirable(table: str, s: Services = Depends(services)) -> ExpiryPlan:
    """The expiry plan: snapshots that may be expired, and why each other one is kept."""
    return s.db.read(lambda session: service.expiry_plan(session, s.ctx, table))
