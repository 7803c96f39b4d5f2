"""Leases pin the snapshots of a consistent version against expiry until they end.

A lease pins either the snapshots its ``lease_snapshots`` rows name (a lease asked for
with ``lease_seconds``, a tag's catalog session), or, with ``all_tables``, on every table
the snapshot at its barrier (a catalog session on ``consistent`` or ``at:``, whose version
is exactly that: one row, whatever the table count)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, ForeignKey, String, false
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base


class Lease(Base):
    __tablename__ = "leases"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    barrier: Mapped[int] = mapped_column(BigInteger)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    expires_ms: Mapped[int] = mapped_column(BigInteger, index=True)
    all_tables: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class LeaseSnapshot(Base):
    __tablename__ = "lease_snapshots"

    lease_id: Mapped[str] = mapped_column(
        ForeignKey("leases.id", ondelete="CASCADE"), primary_key=True
    )
    table_id: Mapped[int] = mapped_column(
        ForeignKey("tables.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
