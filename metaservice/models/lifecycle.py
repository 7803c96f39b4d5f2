"""What the expiry executor removed from the tables, and each table's retention policy."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base


class ExpiredSnapshot(Base):
    """A reported snapshot that an expiry removed from its Iceberg table (or found gone).

    Kept apart from ``commits``, which hold lineage and go with a deleted writer: this
    record lasts as long as the table. The expiry plan leaves these out, and the table's
    ``expiry_horizon`` (above every one of them) keeps versions and leases off them."""

    __tablename__ = "expired_snapshots"

    table_id: Mapped[int] = mapped_column(
        ForeignKey("tables.id", ondelete="CASCADE"), primary_key=True
    )
    snapshot_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    barrier: Mapped[int] = mapped_column(BigInteger)
    batch_id: Mapped[int] = mapped_column(BigInteger)
    expired_ms: Mapped[int] = mapped_column(BigInteger)


class TableRetention(Base):
    """A table's own retention policy; a field left null follows the service's default
    (``retention_keep_last``, ``retention_keep_for_seconds``)."""

    __tablename__ = "table_retention"

    table_id: Mapped[int] = mapped_column(
        ForeignKey("tables.id", ondelete="CASCADE"), primary_key=True
    )
    keep_last: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    keep_for_seconds: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_ms: Mapped[int] = mapped_column(BigInteger)
