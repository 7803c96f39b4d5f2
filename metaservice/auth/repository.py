"""Every query about API tokens."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from metaservice.models import ApiToken, Job, Table


def by_hash(session: Session, token_hash: str) -> ApiToken | None:
    return session.execute(
        select(ApiToken).where(ApiToken.token_hash == token_hash)
    ).scalar_one_or_none()


def add(
    session: Session,
    token_hash: str,
    role: str,
    description: str,
    now_ms: int,
    jobs: str | None = None,
) -> ApiToken:
    token = ApiToken(
        token_hash=token_hash, role=role, description=description, created_ms=now_ms, jobs=jobs
    )
    session.add(token)
    session.flush()
    return token


def count(session: Session) -> int:
    return session.execute(select(func.count()).select_from(ApiToken)).scalar_one()


def page(session: Session, limit: int, offset: int) -> list[ApiToken]:
    return list(
        session.execute(
            select(ApiToken).order_by(ApiToken.id).limit(limit).offset(offset)
        ).scalars()
    )


def remove(session: Session, token_id: int) -> bool:
    """Deletes the token; False when there was none with that id."""
    result = session.execute(delete(ApiToken).where(ApiToken.id == token_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def writer_of_table(session: Session, table: str) -> str | None:
    """The name of the job that writes ``table`` (None: no such table, or no writer)."""
    return session.execute(
        select(Job.name).join(Table, Table.writer_id == Job.id).where(Table.name == table)
    ).scalar_one_or_none()


def by_id(session: Session, token_id: int) -> ApiToken | None:
    return session.get(ApiToken, token_id)
