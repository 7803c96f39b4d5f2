"""Revisions: a table and everything downstream of it re-run from a barrier into mirrors."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base

CREATING = "creating"
PLANNED = "planned"
RUNNING = "running"
READY = "ready"
SWAPPING = "swapping"
SWAPPED = "swapped"
CANCELLED = "cancelled"
# A revision in one of these states keeps its start snapshots from expiry and its tables
# from a second revision.
ACTIVE = (CREATING, PLANNED, RUNNING, READY, SWAPPING)
# States whose revision jobs run: the revision's state among them is computed from the
# mirrors' frontiers when it is read (``revisions.service``).
FOLLOWED = (PLANNED, RUNNING, READY)
# The original writers of a revision in one of these states are superseded: their new
# batches are refused (409 ``superseded``).
FREEZING = (SWAPPING, SWAPPED)


class Revision(Base):
    """Revising ``table_id`` from ``from_barrier``. ``state``: ``creating`` while its
    mirrors are being made (its start snapshots are already kept from expiry),
    ``planned`` once they all are and the revision jobs are registered, ``running`` once
    a revision job committed past ``from_barrier``, ``ready`` once every mirror has caught
    up with its original (within ``revision_ready_lag_ms``), ``swapping`` while a swap
    waits for the mirrors to reach the frozen originals, ``swapped`` after it,
    ``cancelled`` after DELETE."""

    __tablename__ = "revisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    table_id: Mapped[int] = mapped_column(ForeignKey("tables.id", ondelete="CASCADE"), index=True)
    from_barrier: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), index=True)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    updated_ms: Mapped[int] = mapped_column(BigInteger)


class RevisionTable(Base):
    """One affected table of a revision: its mirror in the catalog, the original's
    snapshot the mirror starts at (null: the table was empty at ``from_barrier``), the
    job that writes it, and how far the mirror has been written (``frontier``; the
    revision's ``from_barrier`` until jobs write mirrors)."""

    __tablename__ = "revision_tables"

    revision_id: Mapped[int] = mapped_column(
        ForeignKey("revisions.id", ondelete="CASCADE"), primary_key=True
    )
    table_id: Mapped[int] = mapped_column(
        ForeignKey("tables.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    mirror: Mapped[str] = mapped_column(String(420), unique=True)
    start_snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    writer: Mapped[str] = mapped_column(String(200))
    frontier: Mapped[int] = mapped_column(BigInteger)


class RevisionSwapStep(Base):
    """One catalog step of a swap through a catalog outside the MetaService's database:
    rename ``source`` to ``target``, moving the original table (``moves`` = ``original``)
    or the revision's mirror (``mirror``). The steps are written in the transaction that
    swaps the records, so none is ever lost, and each one gets ``done_ms`` once the
    catalog shows it done (``revisions.swap``); until every step of a revision has,
    expiry and new revisions of the tables they name are refused."""

    __tablename__ = "revision_swap_steps"

    revision_id: Mapped[int] = mapped_column(
        ForeignKey("revisions.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(420))
    target: Mapped[str] = mapped_column(String(420))
    moves: Mapped[str] = mapped_column(String(16))
    done_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
