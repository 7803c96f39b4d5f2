"""The barrier clock, batches and the barrier-to-snapshot mapping."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base


class ClockState(Base):
    """One row: the last barrier issued (so barriers never go backwards across
    restarts), a counter bumped on every topology change (so replicas know
    when their cached graph is stale) and the watermark ``S``: no source batch is
    given a barrier at or below it any more (raised once a slot, see
    :mod:`metaservice.barriers.watermark`)."""

    __tablename__ = "clock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_issued: Mapped[int] = mapped_column(BigInteger, default=0)
    topology_version: Mapped[int] = mapped_column(BigInteger, default=0)
    watermark: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class Batch(Base):
    """A Spark micro-batch of a job and the barrier it was given.

    For a derived job, ``start_barrier`` is the barrier it starts after: the
    batch reads its inputs' snapshots with barriers in (start_barrier, barrier].

    ``query_id`` is the Spark query (its checkpoint's identity) that ran the batch, so
    that a reset checkpoint, whose batch ids start again at 0, is told apart from a
    replay. ``abandoned``: an operator gave up a dead driver's open batch; its late
    commit is refused. ``advanced``: no Spark batch at all, the MetaService moved an
    idle derived job's frontier because none of its inputs changed (``batch_id`` is
    then ``-barrier``, so it never meets a Spark batch id). ``outputs``: how many
    outputs the job had when the batch was opened, the commits it needs to complete.
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
    query_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    abandoned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    advanced: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    outputs: Mapped[int | None] = mapped_column(Integer, nullable=True)


class BatchPlan(Base):
    """The end a derived job's batch starting after ``after`` is given: fixed once it is
    ready, so that every barrier source of the job plans the same batch whatever
    reports land in between (``barrier`` is None while no batch is ready).

    ``asked`` lists the sources (input tables) that were told "not ready" in the
    current round: the answer stays "not ready" until one of them asks again, i.e.
    until Spark's next trigger, so the sources of one trigger never disagree.
    """

    __tablename__ = "batch_plans"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    after: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    barrier: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    asked: Mapped[str] = mapped_column(Text, default="", server_default="")
    created_ms: Mapped[int] = mapped_column(BigInteger)


class BatchInput(Base):
    """An input table a derived batch read (the job's inputs when the batch was opened)."""

    __tablename__ = "batch_inputs"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    batch_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    table_id: Mapped[int] = mapped_column(
        ForeignKey("tables.id", ondelete="CASCADE"), primary_key=True
    )


class Commit(Base):
    """A reported commit: one job's batch wrote one table, as one snapshot (or none when empty).

    ``job_id`` is NULL once the job was deleted: the row stays as the table's snapshot at
    its barrier, which versions already handed out named (topology.service.delete_job)."""

    __tablename__ = "commits"
    __table_args__ = (
        UniqueConstraint("job_id", "batch_id", "table_id"),
        UniqueConstraint("table_id", "snapshot_id"),
        Index("ix_commits_table_barrier", "table_id", "barrier", "batch_id"),
        # A table's snapshot at a barrier skips empty batches' commits: without it, a
        # table whose batches have long been empty is read back to its last snapshot.
        Index(
            "ix_commits_table_barrier_with_snapshot",
            "table_id",
            "barrier",
            "batch_id",
            "snapshot_id",
            postgresql_where=text("snapshot_id IS NOT NULL"),
            sqlite_where=text("snapshot_id IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), nullable=True
    )
    batch_id: Mapped[int] = mapped_column(BigInteger)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.id", ondelete="CASCADE"))
    barrier: Mapped[int] = mapped_column(BigInteger)
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_ms: Mapped[int] = mapped_column(BigInteger)
