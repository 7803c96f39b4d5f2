"""What a table's log holds and answers: its entries (:class:`LogEntry`), the marks of
committed batches (:class:`PersistedMark`), a read's answer (:class:`ReadResult`), a
table's status (:class:`TableStatus`), the errors a read or an append meets, and the
default bounds. The log itself is :class:`metaservice.logstore.store.TableLog`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from metaservice.errors import Conflict, ServiceError
from metaservice.logstore import wire

if TYPE_CHECKING:
    import pyarrow as pa

    from metaservice.logstore.spill import SpillFile

__all__ = [
    "DEFAULT_KEEP_BARRIERS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_SPILL_BYTES",
    "EpochChanged",
    "LogEntry",
    "LogFull",
    "LogGone",
    "PersistedMark",
    "ReadResult",
    "TableStatus",
]

DEFAULT_KEEP_BARRIERS = 2
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_SPILL_BYTES = 4 * 1024 * 1024 * 1024


class LogGone(ServiceError):
    """The reader's position is older than what the log holds: read the table's snapshots."""

    status = 410
    code = wire.GONE_CODE


class LogFull(Conflict):
    """The table's log is at its bounds (memory and spill space): the append is refused,
    and the log falls behind until the writer's commits free it."""

    code = wire.FULL_CODE


class EpochChanged(ServiceError):
    """The log was reset (a writer restarted) since the reader's position was handed out."""

    status = 409
    code = wire.RESET_CODE


@dataclass(frozen=True)
class LogEntry:
    """One appended record batch: in memory (``rows``) or spilled to a file (``spilled``)."""

    barrier: int
    batch_id: int
    seq: int
    rows: pa.RecordBatch | None
    nbytes: int
    spilled: SpillFile | None = None


@dataclass(frozen=True)
class PersistedMark:
    """Batch ``batch_id`` is in snapshot ``snapshot_id``; every entry of it has a seq
    below ``through_seq`` (the marks come after the commit, the appends before it)."""

    barrier: int
    batch_id: int
    snapshot_id: int
    through_seq: int


@dataclass(frozen=True)
class ReadResult:
    entries: list[LogEntry]
    epoch: int
    next_seq: int  # the position to ask from next time (after_seq)
    committed: PersistedMark | None  # the newest batch a reader at next_seq has in full
    job: str | None = None  # whose batch ids the log holds (None: its writer named none)


@dataclass(frozen=True)
class TableStatus:
    table: str
    epoch: int
    entries: int
    bytes: int
    first: tuple[int, int, int] | None  # (barrier, batch_id, seq) of the oldest entry
    last: tuple[int, int, int] | None
    persisted: PersistedMark | None
    complete_after: int | None
    over_bound: bool  # the log refused an append at its bounds (it fell behind)
    readers: list[str]
    spilled_entries: int = 0
    spilled_bytes: int = 0  # the rows' size in memory before they were spilled
    spill_folder: str | None = None
    job: str | None = None  # the job whose batches the log holds, as its writer named it
    refused_through: int | None = None  # batches through this one were refused (log_full)
