"""Issuing, listing and revoking tokens, and deciding who a request comes from.

A token is 32 random bytes (URL-safe base64, prefixed ``mst_`` so that secret
scanners recognise it). Only its SHA-256 is stored; a request's token is hashed
and looked up by that hash, so comparing never touches the secret itself.

A writer token may be scoped to jobs (names or shell patterns): it then acts only for
those jobs (every route with a ``{job}`` the writer role guards, and the job of each
commit report) and for the tables they write (a ``{table}`` the writer role guards).
Reading stays open to it as to any reader; an unscoped writer acts for every job.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from sqlalchemy.orm import Session

from metaservice.auth import repository as repo
from metaservice.auth.schemas import JOB_SCOPE_PATTERN, Role, TokenCreated, TokenView
from metaservice.context import Context
from metaservice.errors import Forbidden, Invalid, NotFound, Unauthenticated
from metaservice.schemas_common import Page

TOKEN_PREFIX = "mst_"
OUT_OF_SCOPE = "out_of_scope"  # 403: a scoped writer acting for a job outside its scope
_MAX_TOKEN_CHARS = 200  # ours are 47; anything much longer is not one of ours


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the role of its token (``token_id`` None when auth is off)
    and, for a scoped writer, the job names or patterns it may act for (None: any job)."""

    role: Role
    token_id: int | None = None
    jobs: tuple[str, ...] | None = None

    def acts_for(self, job: str) -> bool:
        """Whether this caller may act for ``job`` (always, unless it is a scoped writer)."""
        return self.jobs is None or any(fnmatchcase(job, pattern) for pattern in self.jobs)

    def acts_for_table(self, writer: str | None) -> bool:
        """Whether this caller may act for a table whose writer job is ``writer`` (None:
        no job writes it, which only an unscoped caller may act on)."""
        return self.jobs is None or (writer is not None and self.acts_for(writer))


# With auth off every request acts as admin, so the embedded demo needs no token.
ANONYMOUS_ADMIN = Caller(role=Role.ADMIN)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    session: Session,
    ctx: Context,
    role: Role,
    description: str,
    jobs: Sequence[str] | None = None,
) -> TokenCreated:
    """A new token; ``jobs`` (writers only) scopes it to those job names or patterns."""
    if jobs is not None:
        _check_scope(role, jobs)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    stored = _JOBS_SEPARATOR.join(jobs) if jobs is not None else None
    row = repo.add(session, hash_token(token), role.value, description, ctx.now_ms(), stored)
    return TokenCreated(id=row.id, role=role, token=token, jobs=_scope(stored))


def list_tokens(session: Session, limit: int, offset: int) -> Page[TokenView]:
    items = [
        TokenView(
            id=t.id,
            role=Role(t.role),
            description=t.description,
            created_ms=t.created_ms,
            jobs=_scope(t.jobs),
        )
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
            scope = _scope(row.jobs)
            return Caller(
                role=Role(row.role),
                token_id=row.id,
                jobs=tuple(scope) if scope is not None else None,
            )
    raise Unauthenticated("the bearer token is unknown or revoked")


def check_job_scope(caller: Caller, job: str, field: str = "job") -> None:
    """Forbidden unless the caller may act for ``job``."""
    if not caller.acts_for(job):
        raise Forbidden(
            f"this writer token is scoped to the jobs {', '.join(caller.jobs or ())}; "
            f"it cannot act for job '{job}' (use a token scoped to it, or an unscoped one)",
            field=field,
            code=OUT_OF_SCOPE,
        )


def check_table_scope(caller: Caller, table: str, writer: str | None) -> None:
    """Forbidden unless the caller may act for ``table``, whose writer job is ``writer``."""
    if not caller.acts_for_table(writer):
        whose = f"job '{writer}'" if writer is not None else "no registered job"
        raise Forbidden(
            f"this writer token is scoped to the jobs {', '.join(caller.jobs or ())}; table "
            f"'{table}' is written by {whose} (use a token scoped to its writer, or an "
            "unscoped one)",
            field="table",
            code=OUT_OF_SCOPE,
        )


def _check_scope(role: Role, jobs: Sequence[str]) -> None:
    """The one check of a token's scope (the API, the CLI and the tests all come here)."""
    if role is not Role.WRITER:
        raise Invalid(
            f"a {role.value} token cannot be scoped to jobs: only writer tokens can",
            field="jobs",
        )
    if not jobs:
        raise Invalid("a scoped token needs at least one job name or pattern", field="jobs")
    for i, pattern in enumerate(jobs):
        if not _JOB_SCOPE.fullmatch(pattern):
            raise Invalid(
                f"'{pattern[:210]}' is not a job name or pattern: letters, digits, '_', "
                "'.', '-', and '*' (any characters) or '?' (one)",
                field=f"jobs.{i}",
            )


# Patterns hold no commas (JOB_SCOPE_PATTERN), so one text column keeps the list.
_JOBS_SEPARATOR = ","
_JOB_SCOPE = re.compile(JOB_SCOPE_PATTERN)


def _scope(stored: str | None) -> list[str] | None:
    return stored.split(_JOBS_SEPARATOR) if stored is not None else None


def check_role(caller: Caller, needed: Role, action: str = "this request") -> None:
    if not caller.role.includes(needed):
        raise Forbidden(
            f"{action} needs the {needed.value} role; this token has the {caller.role.value} role"
        )
