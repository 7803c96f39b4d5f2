"""Tags: a consistent version published under a name as an Iceberg tag in every table."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base

CREATING = "creating"
PUBLISHED = "published"


class VersionTag(Base):
    """A named consistent version. ``state`` is ``creating`` from the moment the name is
    taken (its snapshots are then already kept from expiry) until every table's Iceberg
    tag is made, ``published`` after. ``expires_ms``: when a retained tag ends (null:
    kept until deleted); past it the tag is no longer listed and no longer keeps its
    snapshots, and the next expiry of each table drops its Iceberg tag and this record."""

    __tablename__ = "version_tags"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    barrier: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    created_ms: Mapped[int] = mapped_column(BigInteger)
    expires_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)


class VersionTagSnapshot(Base):
    """The snapshot a tag names in one table (null: the table was still empty at the
    tag's barrier, so it has no Iceberg tag)."""

    __tablename__ = "version_tag_snapshots"

    tag_id: Mapped[int] = mapped_column(
        ForeignKey("version_tags.id", ondelete="CASCADE"), primary_key=True
    )
    table_id: Mapped[int] = mapped_column(
        ForeignKey("tables.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
