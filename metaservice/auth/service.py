"""Issuing, listing and revoking tokens, and deciding who a request comes from.

A token is 32 random bytes (URL-safe base64, prefixed ``mst_`` so that secret
scanners recognise it). Only its SHA-256 is stored; a request's token is hashed
and looked up by that hash, so comparing never touches the secret itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy.orm import Session

from metaservice.auth import repository as repo
from metaservice.auth.schemas import Role, TokenCreated, TokenView
from metaservice.context import Context
from metaservice.errors import Forbidden, NotFound, Unauthenticated
from metaservice.schemas_common import Page

TOKEN_PREFIX = "mst_"
_MAX_TOKEN_CHARS = 200  # ours are 47; anything much longer is not one of ours


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the role of its token (``token_id`` None when auth is off)."""

    role: Role
    token_id: int | None = None


# With auth off every request acts as admin, so the embedded demo needs no token.
ANONYMOUS_ADMIN = Caller(role=Role.ADMIN)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, ctx: Context, role: Role, description: str) -> TokenCreated:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = repo.add(session, hash_token(token), role.value, description, ctx.now_ms())
    return TokenCreated(id=row.id, role=role, token=token)


def list_tokens(session: Session, limit: int, offset: int) -> Page[TokenView]:
    items = [
        TokenView(id=t.id, role=Role(t.role), description=t.description, created_ms=t.created_ms)
        for t in repo.page(session, limit, offset)
    ]
    return Page(items=items, total=repo.count(session), limit=limit, offset=offset)


def revoke_token(session: Session, token_id: int) -> None:
    if not repo.remove(session, token_id):
        raise NotFound(f"there is no token with id {token_id}", field="token_id")


def authenticate(session: Session, token: str) -> Caller:
    """The caller presenting ``token``; Unauthenticated when no stored token matches."""
    if len(token) <= _MAX_TOKEN_CHARS:
        digest = hash_token(token)
        row = repo.by_hash(session, digest)
        if row is not None and hmac.compare_digest(row.token_hash, digest):
            return Caller(role=Role(row.role), token_id=row.id)
    raise Unauthenticated("the bearer token is unknown or revoked")


def check_role(caller: Caller, needed: Role, action: str = "this request") -> None:
    if not caller.role.includes(needed):
        raise Forbidden(
            f"{action} needs the {needed.value} role; this token has the {caller.role.value} role"
        )
