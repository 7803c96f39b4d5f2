"""The check of a log service's proof that it holds a writer token
(:mod:`metaservice.logstore.proof`): the MetaService calls only log services that give
one (or that its allowlist names). No FastAPI here: the swap's reset uses it too."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from sqlalchemy.orm import Session

from metaservice.auth import repository as repo
from metaservice.auth.schemas import Role
from metaservice.auth.service import Caller
from metaservice.context import Context
from metaservice.db import Database
from metaservice.logstore import proof

__all__ = ["log_service_check", "log_service_key", "writes"]


def writes(session: Session, who: Caller, table: str) -> bool:
    """Whether ``who`` may write ``table``'s log: a writer's token, and for a writer scoped
    to jobs, one of its jobs writes the table (as the MetaService's own writer routes
    hold it: ``auth.service.check_table_scope``)."""
    if not who.role.includes(Role.WRITER):
        return False
    if who.jobs is None:
        return True  # no need to look the writer up
    return who.acts_for_table(repo.writer_of_table(session, table))


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


def log_service_check(db: Database, ctx: Context) -> Callable[[int, str, str], str | None] | None:
    """The blocking check of a proof, with auth on (None: auth is off, nothing to prove)."""
    if not ctx.settings.auth_required:
        return None

    def verify(token_id: int, nonce: str, mac: str) -> str | None:
        return db.read(lambda session: log_service_key(session, token_id, nonce, mac))

    return verify
