"""Iceberg REST catalog sessions: the version every table of one engine's catalog reads."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base


class CatalogSession(Base):
    """One engine's catalog session (what ``GET /iceberg/v1/config`` hands out as its
    prefix). Its id is the lease that keeps the version's snapshots from expiry; the
    lease is renewed while the session is used, and the session ends with it."""

    __tablename__ = "catalog_sessions"

    lease_id: Mapped[str] = mapped_column(
        ForeignKey("leases.id", ondelete="CASCADE"), primary_key=True
    )
    warehouse: Mapped[str] = mapped_column(String(200))
    created_ms: Mapped[int] = mapped_column(BigInteger)


class CatalogSessionTable(Base):
    """A table of a session under the name it had when the session was configured: a
    revision swapped in later gives the name to another table, and the session keeps
    reading the one it started with."""

    __tablename__ = "catalog_session_tables"

    lease_id: Mapped[str] = mapped_column(
        ForeignKey("catalog_sessions.lease_id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(400), primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.id", ondelete="CASCADE"), index=True)
