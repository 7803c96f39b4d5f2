"""``GET /api/v1/whoami``: what the caller's token is (its role and scope), for the log
services, which check each caller's token with the MetaService; and how a request calls
log services (:func:`log_probe`).

Any valid token may ask about itself (a reader's too); without auth every caller is the
anonymous admin. A log service keeps each answer briefly, so a revoked token is refused
there within its cache time.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from metaservice.auth.log_services import log_service_key, writes
from metaservice.auth.schemas import Role
from metaservice.auth.service import Caller
from metaservice.deps import Services, caller, services
from metaservice.logstore.probe import LogProbe
from metaservice.schemas_common import error_responses

router = APIRouter(tags=["tokens"])


class WhoAmI(BaseModel):
    role: Role
    token_id: int | None = Field(description="None when auth is off (every caller is admin)")
    jobs: list[str] | None = Field(
        description="A scoped writer's job names or patterns; None: every job"
    )
    auth_required: bool = Field(description="Whether the MetaService requires tokens")
    writes_table: bool | None = Field(
        None,
        description="With ?table=T: whether the token may write T (a writer's, and for a "
        "scoped writer one of its jobs writes T); None without table",
    )


@router.get("/whoami", response_model=WhoAmI, responses=error_responses(401, 422))
def whoami(
    table: str | None = Query(None, max_length=400, description="Ask whether it may write it"),
    who: Caller = Depends(caller),
    s: Services = Depends(services),
) -> WhoAmI:
    """The caller's token: its role and scope (the log services ask this of each token
    they are shown, with the table for a write)."""
    return WhoAmI(
        role=who.role,
        token_id=who.token_id,
        jobs=list(who.jobs) if who.jobs is not None else None,
        auth_required=s.ctx.settings.auth_required,
        writes_table=None
        if table is None
        else s.db.read(lambda session: writes(session, who, table)),
    )


def log_probe(s: Services) -> LogProbe:
    """How this request calls log services: with auth on, only those that prove they hold
    a writer token (or are in the allowlist)."""
    settings = s.ctx.settings

    async def verify(token_id: int, nonce: str, mac: str) -> str | None:
        return await s.db.read_async(lambda session: log_service_key(session, token_id, nonce, mac))

    return LogProbe(
        verify=verify if settings.auth_required else None,
        allowlist=settings.log_address_allowlist,
    )
