"""Iceberg REST catalog sessions: the version every table of one engine's catalog reads."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base


class CatalogSession(Base):
    """One engine's catalog session (what ``GET /iceberg/v1/config`` hands out as its
    prefix). Its id is the lease that keeps the version's snapshots from expiry; the
    lease is renewed while the session is used, and the session ends with it.

    ``tables`` is a JSON object: each table under the name it had when the session was
    configured -> [its id, its snapshot at the version (null: empty there)]. A revision
    swapped in later gives the name to another table, and the session keeps reading the
    one it started with. One column, not a row per table: configuring a session on 1,000
    tables writes one row (see ``iceberg_rest.repository``)."""

    __tablename__ = "catalog_sessions"

    lease_id: Mapped[str] = mapped_column(
        ForeignKey("leases.id", ondelete="CASCADE"), primary_key=True
    )
    warehouse: Mapped[str] = mapped_column(String(200))
    created_ms: Mapped[int] = mapped_column(BigInteger)
    tables: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")
