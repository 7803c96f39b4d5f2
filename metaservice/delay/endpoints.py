from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from metaservice.auth.schemas import Role
from metaservice.delay import service
from metaservice.delay.schemas import Delay
from metaservice.deps import Services, require, services
from metaservice.schemas_common import error_responses

router = APIRouter(tags=["delay"], dependencies=[require(Role.READER)])


@router.get("/delay", response_model=Delay, responses=error_responses(404, 409))
def delay(
    table: str = Query(description="Table identifier"), s: Services = Depends(services)
) -> Delay:
    """How stale a table is, each upstream job's share, and the critical path."""
    return s.db.read(lambda session: service.delay(session, s.ctx, table))
