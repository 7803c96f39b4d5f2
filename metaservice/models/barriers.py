"""The barrier clock, batches and the barrier-to-snapshot mapping."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base


class ClockState(Base):
    """One row: the last barrier issued (so barriers never go backwards across
    restarts) and a counter bumped on every topology change (so replicas know
    when their cached graph is stale)."""

    __tablename__ = "clock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_issued: Mapped[int] = mapped_column(BigInteger, default=0)
    topology_version: Mapped[int] = mapped_column(BigInteger, default=0)


class Batch(Base):
    """A Spark micro-batch of a job and the barrier it was given.

    For a derived job, ``start_barrier`` is the barrier it starts after: the
    batch reads its inputs' snapshots with barriers in (start_barrier, barrier].
    """

    __tablename__ = "batches"
    __table_args__ = (
        UniqueConstraint("job_id", "batch_id"),
        Index("ix_batches_job_committed_barrier", "job_id", "committed", "barrier"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    batch_id: Mapped[int] = mapped_column(BigInteger)
    barrier: Mapped[int] = mapped_column(BigInteger)
    start_barrier: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    committed: Mapped[bool] = mapped_column(Boolean, default=False)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    committed_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Commit(Base):
    """A reported commit: one job's batch wrote one table, as one snapshot (or none when empty)."""

    __tablename__ = "commits"
    __table_args__ = (
        UniqueConstraint("job_id", "batch_id", "table_id"),
        UniqueConstraint("table_id", "snapshot_id"),
        Index("ix_commits_table_barrier", "table_id", "barrier", "batch_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    batch_id: Mapped[int] = mapped_column(BigInteger)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.id", ondelete="CASCADE"))
    barrier: Mapped[int] = mapped_column(BigInteger)
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_ms: Mapped[int] = mapped_column(BigInteger)
