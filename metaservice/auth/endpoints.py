from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Response

from metaservice.auth import service
from metaservice.auth.schemas import Role, TokenCreated, TokenRequest, TokenView
from metaservice.deps import Paging, Services, paging, require, services
from metaservice.schemas_common import Page, error_responses

router = APIRouter(tags=["tokens"], dependencies=[require(Role.ADMIN)])


@router.post(
    "/tokens", response_model=TokenCreated, status_code=201, responses=error_responses(400, 413)
)
def create_token(body: TokenRequest, s: Services = Depends(services)) -> TokenCreated:
    """Issue a token. Its text is in this answer only: the service stores just its hash."""
    return s.db.write(
        lambda session: service.create_token(session, s.ctx, body.role, body.description, body.jobs)
    )


@router.get("/tokens", response_model=Page[TokenView], responses=error_responses(413))
def list_tokens(page: Paging = Depends(paging), s: Services = Depends(services)) -> Page[TokenView]:
    """Every token's id, role and description (never the token itself)."""
    return s.db.read(lambda session: service.list_tokens(session, page.limit, page.offset))


@router.delete("/tokens/{token_id}", status_code=204, responses=error_responses(404))
def revoke_token(
    token_id: int = Path(ge=1, le=2**31 - 1), s: Services = Depends(services)
) -> Response:
    """Revoke a token: requests presenting it get 401 from now on."""
    s.db.write(lambda session: service.revoke_token(session, token_id))
    return Response(status_code=204)
