"""``GET /api/v1/whoami``: what the caller's token is (its role and scope), for the log
services, which check each caller's token with the MetaService; and the check of a log
service's proof that it holds a token (:mod:`metaservice.logstore.proof`).

Any valid token may ask about itself (a reader's too); without auth every caller is the
anonymous admin. A log service keeps each answer briefly, so a revoked token is refused
there within its cache time.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from metaservice.auth import repository as repo
from metaservice.auth.schemas import Role
from metaservice.auth.service import Caller
from metaservice.deps import Services, caller, services
from metaservice.logstore import proof
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


@router.get("/whoami", response_model=WhoAmI, responses=error_responses(401))
def whoami(who: Caller = Depends(caller), s: Services = Depends(services)) -> WhoAmI:
    """The caller's token: its role and scope (the log services ask this of each token
    they are shown)."""
    return WhoAmI(
        role=who.role,
        token_id=who.token_id,
        jobs=list(who.jobs) if who.jobs is not None else None,
        auth_required=s.ctx.settings.auth_required,
    )


def log_service_key(session: Session, token_id: int, nonce: str, mac: str) -> str | None:
    """The key of a log service whose proof for ``nonce`` holds: its token's stored hash
    (which signs the MetaService's calls to it). None when the proof does not hold, the
    token is gone, or it is not a writer's."""
    row = repo.by_id(session, token_id)
    if row is None or not Role(row.role).includes(Role.WRITER):
        return None
    if not hmac.compare_digest(proof.identity_mac(row.token_hash, nonce), mac):
        return None
    return row.token_hash


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
