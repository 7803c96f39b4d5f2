"""OpenLineage in and out: events received at ``POST /lineage``, the jobs and datasets
they name (observed lineage, beside the barrier topology), and the queue of events the
service emits for its barrier jobs."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base


class OpenLineageEvent(Base):
    """A received event, whole as it came (unknown facets included).

    ``event_key`` is the SHA-256 of the event's canonical JSON: a client's retry of the
    same event finds it and records nothing new."""

    __tablename__ = "openlineage_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    event_key: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # run, dataset, job
    event_type: Mapped[str | None] = mapped_column(String(16), nullable=True)
    event_time_ms: Mapped[int] = mapped_column(BigInteger)
    run_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("observed_jobs.id", ondelete="CASCADE"), nullable=True, index=True
    )
    payload: Mapped[str] = mapped_column(Text)
    received_ms: Mapped[int] = mapped_column(BigInteger)


class ObservedJob(Base):
    """A job some OpenLineage producer reported; ``key`` hashes (namespace, name)."""

    __tablename__ = "observed_jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    namespace: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    last_event_type: Mapped[str | None] = mapped_column(String(16), nullable=True)
    last_run_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    last_event_ms: Mapped[int] = mapped_column(BigInteger)
    updated_ms: Mapped[int] = mapped_column(BigInteger)


class ObservedDataset(Base):
    """A dataset some OpenLineage producer reported; ``symlinks`` is a JSON list of the
    names its ``symlinks`` facet gives it (an Iceberg table named by location carries
    its catalog identifier there)."""

    __tablename__ = "observed_datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    namespace: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    symlinks: Mapped[str] = mapped_column(Text, default="[]")
    updated_ms: Mapped[int] = mapped_column(BigInteger)


class ObservedEdge(Base):
    """An observed job read (``input``) or wrote (``output``) a dataset. Many jobs may
    write one dataset: observed lineage has no single-writer rule."""

    __tablename__ = "observed_edges"

    job_id: Mapped[int] = mapped_column(
        ForeignKey("observed_jobs.id", ondelete="CASCADE"), primary_key=True
    )
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("observed_datasets.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    direction: Mapped[str] = mapped_column(String(8), primary_key=True)


class OpenLineageOutbox(Base):
    """An event to emit, written in the transaction that made it happen (a batch
    committed, a query started or ended), deleted once the backend accepted it.

    ``due_ms``: when a sender may next try it (later after each failed round, and while
    a sender holds it); ``attempts`` and ``last_error`` tell an operator why it waits."""

    __tablename__ = "openlineage_outbox"
    __table_args__ = (Index("ix_openlineage_outbox_due_ms_id", "due_ms", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job: Mapped[str] = mapped_column(String(200))
    event_type: Mapped[str] = mapped_column(String(16))
    payload: Mapped[str] = mapped_column(Text)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    due_ms: Mapped[int] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
