"""Jobs, tables and which job reads which table: the ETL topology."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base

SOURCE = "source"
DERIVED = "derived"


class Job(Base):
    """A Spark streaming query and its progress through the barriers.

    ``frontier`` means, for a derived job, the last barrier it committed (or 0);
    for a source job, the slot up to which it is sealed: no batch will ever get a
    barrier at or below it. ``open_batches`` counts a source job's batches that
    have a barrier but are not fully committed; the job row is the lock that
    serialises every change to these fields.

    ``offline_floor`` is set while a source job holds an offline grant: the job may
    give its own batches barriers at or above it while the MetaService is
    unreachable, so the job's frontier stays below it (see ``barriers/offline.py``).
    """

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    kind: Mapped[str] = mapped_column(String(16))
    frontier: Mapped[int] = mapped_column(BigInteger, default=0)
    open_batches: Mapped[int] = mapped_column(Integer, default=0)
    pending_target: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    offline_floor: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_barrier: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_batch_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="registered")
    last_event: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_seen_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    updated_ms: Mapped[int] = mapped_column(BigInteger)


class Table(Base):
    """An Iceberg table by its catalog identifier; at most one job writes it.

    ``expiry_horizon``: the barrier below which snapshots may have been expired (an
    expiry was allowed up to the table's snapshot at it); no version or lease is
    handed out on a snapshot older than that.

    ``log_mode`` and ``log_address``: the table's log store ("embedded" in its writing
    driver, or "external"), as its writer published it; None when it has none.

    ``writer_first_batch``: the first batch id of the writer that may report the table,
    the writer's next batch when it took the table on (a batch opened before was opened
    without it, see ``barriers.service.fence``); None: every batch of the writer.

    ``handover_barrier`` and ``handover_kind``: how far the table's last former writer
    answered for it (its frontier when it stopped writing the table: output removed, or
    job deleted) and that writer's kind; None while the table never lost a writer. A new
    writer never stamps the table at or below that barrier, and only a writer that keeps
    the table's exact barriers takes it on (``topology.service``).

    ``source_until``: the table was written by source jobs up to this barrier, so it is
    exact at every barrier at or below it whoever writes it now; None while no source
    job handed it over. Its former derived writers' exact barriers are
    :class:`TableExactBarrier` rows. Together with its writer's committed barriers they
    are where the table is exact (``barriers.repository.latest_exact_at_or_before``)."""

    __tablename__ = "tables"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(400), unique=True)
    writer_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True, index=True
    )
    created_ms: Mapped[int] = mapped_column(BigInteger)
    expiry_horizon: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    log_mode: Mapped[str | None] = mapped_column(String(16), nullable=True)
    log_address: Mapped[str | None] = mapped_column(String(400), nullable=True)
    log_updated_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    writer_first_batch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    handover_barrier: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    handover_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    source_until: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class TableExactBarrier(Base):
    """A barrier a derived table was exact at under a former writer: the barriers that
    writer committed (or was advanced to) while it wrote the table, kept when it handed
    the table over (output removed or moved, job deleted), since the writer's batches
    are not the table's any more (or are gone with the job). Versions handed out for the
    table at them are answered again after any number of writers."""

    __tablename__ = "table_exact_barriers"

    table_id: Mapped[int] = mapped_column(
        ForeignKey("tables.id", ondelete="CASCADE"), primary_key=True
    )
    barrier: Mapped[int] = mapped_column(BigInteger, primary_key=True)


class JobInput(Base):
    __tablename__ = "job_inputs"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    table_id: Mapped[int] = mapped_column(
        ForeignKey("tables.id", ondelete="CASCADE"), primary_key=True, index=True
    )
