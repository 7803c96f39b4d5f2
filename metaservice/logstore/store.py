"""The log store's memory: per table, the newest rows at offsets (barrier, batch, seq).

Pure Python and pyarrow; the HTTP service (:mod:`metaservice.logstore.server`) and the
tests drive it directly. One :class:`TableLog` per table, behind one lock per table;
:class:`LogStore` holds them by name. What a log holds and answers (entries, marks,
reads, status, errors) is :mod:`metaservice.logstore.entries`.

:class:`TableLog` is one thing, and so this file is long: appends, reads, resets,
retention, bounds and spilling all change one table's entries and marks under its one
lock, and each keeps the same promise to the readers (a position answered is held whole,
else :class:`LogGone` or :class:`EpochChanged`). Split across modules, that promise would
be spread over files that each see half of the state.

**Offsets.** An entry is one Arrow record batch appended by an executor for micro-batch
``batch_id`` of barrier ``barrier``. The log gives it ``seq``, a number that grows with
every append to the table (never reused, not even across a reset), so a reader that
follows by ``seq`` sees every later append, whatever order the executors' appends of
one batch arrive in.

**Positions a reader can ask from.**

- ``after_seq`` within one ``epoch``: the next entries of the log the reader follows.
- ``after_batch``: everything of the batches after a committed batch (a reader that
  read the table's snapshots up to that batch and switches back to the log). The log
  can answer only when it holds every entry of every batch after it
  (``complete_after <= after_batch``), else :class:`LogGone`.

**Whose batches.** Batch ids are a job's own (a Spark checkpoint's): batch 7 of one job
says nothing of another's batches. A writer names its job at its reset, and the log
keeps it (``job``). A read ``after_batch`` names the job whose batch it is (the job that
stamped the reader's snapshot); when that is not the log's job, the position says
nothing about which of the log's batches the reader lacks, so the log answers from its
start if it holds every batch its writer wrote (``complete_after == -1``), else
:class:`LogGone` (the reader reads the table's snapshots until one is stamped by the
log's job). A reset naming another job than the log's drops everything first (as
``reset(None)`` does). A log whose writer named no job answers by batch alone.

**Retention and bounds.** Kept: every entry not yet persisted (its batch is not in a
committed Iceberg snapshot yet), plus the persisted entries of the last
``keep_barriers`` persisted barriers. Past ``max_bytes`` of memory, the oldest persisted
batches go first. A log with a :class:`~metaservice.logstore.spill.Spill` then writes the
oldest unpersisted entries to files, up to ``max_spill_bytes`` (the writer lists a
batch's files in its snapshot summary, whose expiry deletes them:
:meth:`TableLog.claim_spilled`). An append that would still leave the log past
``max_bytes`` is refused (409 ``log_full``, nothing of it held) and the log **falls
behind**: it drops its unpersisted entries of that batch and the ones before it, refuses
the rest of those batches, and bumps the epoch. The writer goes on (the batch commits to
the table; the log is a copy), and readers, whose positions the new epoch or the
dropped batches void, read the table's snapshots until the log holds their position
again (the batches after the refused one). No reader is left a hole it cannot see, and
no request holds the log service's memory past the bound.

**Epoch.** ``reset(after_batch_id, job)`` (a writer restarting from its last committed
batch) drops every entry past that batch and bumps the epoch: a reader following the
old epoch gets :class:`EpochChanged` and re-reads from its last committed snapshot
(duplicates, never a gap). ``reset(None)`` (a revision swap: the table's history
restarts) drops everything and forgets the persisted marks and the job too. A new store
starts at an epoch taken from the clock, so a restarted log service never repeats an
epoch its readers knew.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from metaservice.errors import Conflict, Invalid, NotFound
from metaservice.logstore import wire
from metaservice.logstore.entries import (
    DEFAULT_KEEP_BARRIERS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SPILL_BYTES,
    EpochChanged,
    LogEntry,
    LogFull,
    LogGone,
    PersistedMark,
    ReadResult,
    TableStatus,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from metaservice.logstore.spill import Spill

__all__ = [
    "DEFAULT_KEEP_BARRIERS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_SPILL_BYTES",
    "EpochChanged",
    "LogEntry",
    "LogFull",
    "LogGone",
    "LogStore",
    "PersistedMark",
    "ReadResult",
    "TableLog",
    "TableStatus",
]

log = logging.getLogger(__name__)

READERS_RECENT_S = 60.0  # a reader seen within this long counts as "reading"
_MARKS_KEPT = 1000
_READERS_KEPT = 1000  # persisted marks remembered (for readers' committed positions)


@dataclass
class TableLog:
    """One table's entries. Thread-safe."""

    name: str
    keep_barriers: int = DEFAULT_KEEP_BARRIERS
    max_bytes: int = DEFAULT_MAX_BYTES
    now: Callable[[], float] = time.time
    max_spill_bytes: int = DEFAULT_MAX_SPILL_BYTES
    # Microseconds of the clock: a restarted service never starts at an epoch it had.
    epoch: int = field(default_factory=lambda: time.time_ns() // 1_000)
    _entries: deque[LogEntry] = field(default_factory=deque)
    _bytes: int = 0
    _next_seq: int = 1
    _dropped_through_seq: int = 0  # the newest seq retention dropped
    _marks: deque[PersistedMark] = field(default_factory=lambda: deque(maxlen=_MARKS_KEPT))
    # Every entry of every batch after this one is held (None: nothing known yet).
    complete_after: int | None = None
    # The job whose batch ids these are, named by its writer's reset (None: not named).
    job: str | None = None
    _readers: dict[str, float] = field(default_factory=dict)
    spill: Spill | None = None  # where rows past max_bytes go; None: kept in memory
    _spilled_bytes: int = 0
    _spilled_entries: int = 0
    # Batches through this one had their spilled files listed for a snapshot summary: their
    # entries are not spilled any more (a file made later would be listed nowhere).
    _claimed_through: int = -1
    # Batches through this one were refused when the log was full: the log holds none of
    # them whole, so it takes no more of their rows (None: none refused).
    _refused_through: int | None = None
    _full: bool = False  # the newest append was refused at the bounds
    _schema: pa.Schema | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- writing --------------------------------------------------------------------
    def append(self, barrier: int, batch_id: int, rows: pa.RecordBatch) -> LogEntry:
        """Hold ``rows`` of batch ``batch_id``; returns the entry with its seq."""
        return self.append_all(barrier, batch_id, [rows])[0]

    def append_all(
        self, barrier: int, batch_id: int, batches: list[pa.RecordBatch]
    ) -> list[LogEntry]:
        """Hold the record batches of one append of batch ``batch_id``, all or none;
        returns their entries with their seqs.

        Refused (409, nothing held) when the schema differs from the entries held, when
        the batch is already persisted (a straggling task of a committed batch: its rows
        are in the snapshot already), and (:class:`LogFull`) when the log cannot hold
        them within its bounds, or refused part of the batch before.
        """
        if not batches:
            return []
        with self._lock:
            self._check_appendable(batch_id, batches[0].schema)
            if self.complete_after is None:
                # A store that never saw this table: earlier parts of this batch may have
                # gone to a previous incarnation, so only the batches after it are whole.
                self.complete_after = batch_id
            entries = []
            for rows in batches:
                entry = LogEntry(barrier, batch_id, self._next_seq, rows, int(rows.nbytes))
                self._next_seq += 1
                self._entries.append(entry)
                self._bytes += entry.nbytes
                entries.append(entry)
            self._schema = batches[0].schema
            self._retain()
            if self._bytes > self.max_bytes:
                self._fall_behind(batch_id)
            self._full = False
            return entries

    def _check_appendable(self, batch_id: int, schema: pa.Schema) -> None:
        if self._entries and schema != self._schema:
            raise Conflict(
                f"table {self.name}: the rows' schema differs from the entries the log "
                "holds; a schema change takes a reset of the log (the writer's restart)",
                field="body",
                code="log_schema_changed",
            )
        if self._persisted_through is not None and batch_id <= self._persisted_through:
            raise Conflict(
                f"table {self.name}: batch {batch_id} is already persisted "
                f"(through batch {self._persisted_through}); its rows are in the table",
                field="batch_id",
                code="log_batch_persisted",
            )
        if self._refused_through is not None and batch_id <= self._refused_through:
            raise LogFull(
                f"table {self.name}: the log refused rows of batch {self._refused_through} "
                "when it was full, so it takes no more rows of it (the batch goes to the "
                "table only; readers read its snapshot)",
                field="batch_id",
            )

    def _fall_behind(self, batch_id: int) -> None:
        """The log is past its bounds with rows no snapshot holds yet: let batch
        ``batch_id`` and the unpersisted ones before it go (the table will have them),
        bump the epoch (readers following by seq re-read from their last snapshot), and
        refuse the rest of them. Raises :class:`LogFull`."""
        held = self._bytes
        persisted = self._persisted_through if self._persisted_through is not None else -1
        gone = [e for e in self._entries if persisted < e.batch_id <= batch_id]
        self._forget(gone)
        self._dropped_through_seq = max(self._dropped_through_seq, *(e.seq for e in gone))
        self.complete_after = max(self.complete_after or batch_id, batch_id)
        self._refused_through = batch_id
        self._full = True
        self.epoch += 1
        log.warning(
            "log of %s is full (%d bytes in memory past its bound of %d, %d of %d spilled): "
            "refused batch %d; the log falls behind, readers read the table's snapshots "
            "until it holds the batches after it",
            self.name, held, self.max_bytes, self._spilled_bytes, self.max_spill_bytes,
            batch_id,
        )  # fmt: skip
        raise LogFull(
            f"table {self.name}: the log is full ({held} bytes of rows not yet persisted "
            f"past its bound of {self.max_bytes}, spill space {self.max_spill_bytes}): "
            f"batch {batch_id} goes to the table only; the writer's commits free the log",
            field="body",
        )

    def persisted(self, barrier: int, batch_id: int, snapshot_id: int) -> PersistedMark:
        """Batch ``batch_id`` is committed in snapshot ``snapshot_id`` (idempotent)."""
        with self._lock:
            newest = self._marks[-1] if self._marks else None
            if newest is not None and batch_id <= newest.batch_id:
                return next((m for m in self._marks if m.batch_id == batch_id), newest)
            mark = PersistedMark(barrier, batch_id, snapshot_id, self._next_seq)
            self._marks.append(mark)
            self._retain()
            return mark

    def claim_spilled(self, batch_id: int) -> list[str]:
        """The files batch ``batch_id``'s spilled entries are in, for its snapshot summary
        (the writer asks right before the commit). From now on the batch is not spilled
        any more, and its files are the snapshot's: only the snapshot's expiry deletes
        them. Asking again gives the same list."""
        with self._lock:
            self._claimed_through = max(self._claimed_through, batch_id)
            files = [e.spilled for e in self._entries if e.batch_id == batch_id and e.spilled]
            for spilled in files:
                spilled.claimed = True
            return [f.path for f in files]

    def reset(self, after_batch_id: int | None, job: str | None = None) -> int:
        """A writer restarts after its last committed batch: drop what is past it and bump
        the epoch (returned). Readers of the old epoch re-read from their last snapshot.
        ``job`` is the writer's job: its batch ids are the ones the log holds from now on
        (None: not named, the log answers reads by batch alone). A job other than the one
        the log held drops everything first: the old batch ids mean nothing in the new
        job's.

        ``None``: the table's history restarts (a revision swapped another table in under
        its name): drop every entry, forget the persisted marks and the job (the next
        writer's batch ids are its own) and hold nothing in full until that writer's
        reset."""
        if after_batch_id is None:
            if job is not None:
                raise Invalid("a reset that keeps no batch names no job", field="job")
            return self._restart()
        with self._lock:
            if job is not None and self.job is not None and job != self.job:
                log.info(
                    "log of %s: job %s writes it now, not %s; dropping %s's entries",
                    self.name, job, self.job, self.job,
                )  # fmt: skip
                self._drop_all()
            self.job = job
            self._forget([e for e in self._entries if e.batch_id > after_batch_id])
            self._claimed_through = min(self._claimed_through, after_batch_id)
            while self._marks and self._marks[-1].batch_id > after_batch_id:
                self._marks.pop()  # a rollback: those batches are no longer committed
            if self.complete_after is None or self.complete_after > after_batch_id:
                # What the writer replays after this point will all come here.
                self.complete_after = after_batch_id
            self.epoch += 1
            self._refused_through = None  # the writer appends what is past after_batch_id again
            self._full = False
            log.info(
                "log of %s reset after batch %d of job %s: epoch %d",
                self.name, after_batch_id, job, self.epoch,
            )  # fmt: skip
            return self.epoch

    def _restart(self) -> int:
        with self._lock:
            self._drop_all()
            self.job = None
            self.epoch += 1
            self._refused_through = None
            self._full = False
            log.info("log of %s reset with no batch kept: epoch %d", self.name, self.epoch)
            return self.epoch

    def _drop_all(self) -> None:
        self._forget(list(self._entries))
        self._marks.clear()
        self._claimed_through = -1
        self.complete_after = None

    # -- reading --------------------------------------------------------------------
    def read(
        self,
        *,
        after_seq: int | None = None,
        epoch: int | None = None,
        after_batch: int | None = None,
        job: str | None = None,
        max_bytes: int | None = None,
        reader: str | None = None,
    ) -> ReadResult:
        """The entries after a position: ``after_seq`` in ``epoch``, or ``after_batch`` of
        ``job`` (the job that stamped the reader's snapshot; None: the log's job).

        Raises :class:`EpochChanged` when ``epoch`` is not the log's, :class:`LogGone`
        when the log no longer holds (or never held) everything after the position.
        ``max_bytes`` caps the answer (at least one entry is returned when any is due).
        """
        if (after_seq is None) == (after_batch is None):
            raise Invalid("give exactly one of after_seq and after_batch", field="after_seq")
        if job is not None and after_batch is None:
            raise Invalid("job names whose batch after_batch is; give it with it", field="job")
        with self._lock:
            if reader:
                self._seen(reader)
            if after_seq is not None:
                due = self._after_seq(after_seq, epoch)
            else:
                assert after_batch is not None
                due = self._after_batch(after_batch, job)
            taken = _cap(due, max_bytes)
            next_seq = taken[-1].seq if taken else self._position(after_seq)
            committed = self._committed_at(next_seq)
            return ReadResult(taken, self.epoch, next_seq, committed, self.job)

    def _seen(self, reader: str) -> None:
        now = self.now()
        self._readers[reader] = now
        if len(self._readers) > _READERS_KEPT:  # forget the ones gone quiet
            since = now - READERS_RECENT_S
            self._readers = {r: seen for r, seen in self._readers.items() if seen >= since}

    def _after_seq(self, after_seq: int, epoch: int | None) -> list[LogEntry]:
        if epoch is None:
            raise Invalid("after_seq needs the epoch it was handed out in", field="epoch")
        if epoch != self.epoch:
            raise EpochChanged(
                f"the log of {self.name} was reset (epoch {epoch} -> {self.epoch}): re-read "
                "from your last committed snapshot",
                field="epoch",
            )
        if after_seq >= self._next_seq:
            raise Invalid(
                f"after_seq {after_seq} is past the log's end ({self._next_seq - 1})",
                field="after_seq",
            )
        if after_seq < self._dropped_through_seq:
            raise LogGone(
                f"the log of {self.name} no longer holds the entries after seq {after_seq} "
                f"(it dropped them through seq {self._dropped_through_seq}): read the "
                "table's snapshots",
                field="after_seq",
            )
        return [e for e in self._entries if e.seq > after_seq]

    def _after_batch(self, after_batch: int, job: str | None) -> list[LogEntry]:
        if job is not None and self.job is not None and job != self.job:
            # Another job's batch: it says nothing of which of this job's batches the reader
            # has. Only every batch this job wrote is sure to cover them.
            if self.complete_after != -1:
                raise LogGone(
                    f"the log of {self.name} holds the batches of job {self.job}, not all of "
                    f"them (its batches after {self.complete_after}); batch {after_batch} is "
                    f"job {job}'s: read the table's snapshots until one is stamped by "
                    f"{self.job}",
                    field="job",
                )
            after_batch = -1
        if self.complete_after is None or after_batch < self.complete_after:
            held = (
                "nothing yet"
                if self.complete_after is None
                else (f"the batches after {self.complete_after}")
            )
            raise LogGone(
                f"the log of {self.name} does not hold every batch after {after_batch} "
                f"(it holds {held}): read the table's snapshots",
                field="after_batch",
            )
        return [e for e in self._entries if e.batch_id > after_batch]

    def _position(self, after_seq: int | None) -> int:
        # Nothing due: a seq reader stays put, a batch reader starts at the log's end.
        return after_seq if after_seq is not None else self._next_seq - 1

    def _committed_at(self, seq: int) -> PersistedMark | None:
        for mark in reversed(self._marks):
            if mark.through_seq <= seq + 1:
                return mark
        return None

    # -- retention ------------------------------------------------------------------
    @property
    def _persisted_through(self) -> int | None:
        return self._marks[-1].batch_id if self._marks else None

    def _retain(self) -> None:
        """Drop persisted entries past the barrier count, then past the byte bound."""
        through = self._persisted_through
        if through is not None:
            self._drop_persisted(through)
        self._check_bound()

    def _drop_persisted(self, through: int) -> None:
        kept_barriers = sorted({m.barrier for m in self._marks})[-self.keep_barriers :]
        oldest_kept = kept_barriers[0] if kept_barriers and self.keep_barriers > 0 else None
        while self._entries and self._entries[0].batch_id <= through:
            head = self._entries[0]
            too_old = oldest_kept is None or head.barrier < oldest_kept
            if not too_old and self._bytes <= self.max_bytes:
                break
            self._drop_batch(head.batch_id)

    def _drop_batch(self, batch_id: int) -> None:
        """Drop every entry of a persisted batch: the log holds a batch whole or not at all."""
        gone = [e for e in self._entries if e.batch_id == batch_id]
        self._forget(gone)
        self._dropped_through_seq = max(self._dropped_through_seq, *(e.seq for e in gone))
        self.complete_after = max(self.complete_after or batch_id, batch_id)

    def _forget(self, gone: list[LogEntry]) -> None:
        """Take ``gone`` out of the log. A spilled file goes with its entry unless a
        snapshot summary may list it (claimed): that snapshot's expiry deletes it."""
        if not gone:
            return
        seqs = {e.seq for e in gone}
        self._entries = deque(e for e in self._entries if e.seq not in seqs)
        for entry in gone:
            if entry.spilled is None:
                self._bytes -= entry.nbytes
                continue
            self._spilled_entries -= 1
            self._spilled_bytes -= entry.nbytes
            if not entry.spilled.claimed and self.spill is not None:
                self.spill.delete(entry.spilled)

    def _check_bound(self) -> None:
        if self._bytes > self.max_bytes and self.spill is not None:
            self._spill_oldest()

    def _spill_oldest(self) -> None:
        """Write the oldest unpersisted, unclaimed entries to files until within the bound."""
        assert self.spill is not None
        persisted = self._persisted_through if self._persisted_through is not None else -1
        newest_done = max(persisted, self._claimed_through)
        for i in range(len(self._entries)):
            if self._bytes <= self.max_bytes:
                return
            entry = self._entries[i]
            if entry.spilled is not None or entry.batch_id <= newest_done:
                continue
            if self._spilled_bytes + entry.nbytes > self.max_spill_bytes:
                return  # the spill space is full too
            assert entry.rows is not None
            try:
                spilled = self.spill.write(self.epoch, entry.batch_id, entry.seq, entry.rows)
            except OSError as exc:
                log.warning("log of %s could not spill to %s: %s", self.name, self.spill, exc)
                return
            self._entries[i] = replace(entry, rows=None, spilled=spilled)
            self._bytes -= entry.nbytes
            self._spilled_bytes += entry.nbytes
            self._spilled_entries += 1

    def rows_of(self, entry: LogEntry) -> pa.RecordBatch:
        """The entry's rows, read back from its file when it was spilled. Raises
        :class:`LogGone` when that file is gone (retention dropped the entry meanwhile)."""
        if entry.rows is not None:
            return entry.rows
        assert entry.spilled is not None
        if self.spill is None:
            raise LogGone(f"the log of {self.name} lost its spill folder", field="after_seq")
        try:
            return self.spill.read(entry.spilled)
        except FileNotFoundError:
            raise LogGone(
                f"the log of {self.name} no longer holds seq {entry.seq}: read the table's "
                "snapshots",
                field="after_seq",
            ) from None

    # -- status ---------------------------------------------------------------------
    def status(self) -> TableStatus:
        with self._lock:
            since = self.now() - READERS_RECENT_S
            first = self._entries[0] if self._entries else None
            last = self._entries[-1] if self._entries else None
            return TableStatus(
                table=self.name,
                epoch=self.epoch,
                entries=len(self._entries),
                bytes=self._bytes,
                first=_offset(first),
                last=_offset(last),
                persisted=self._marks[-1] if self._marks else None,
                complete_after=self.complete_after,
                over_bound=self._full,
                readers=sorted(r for r, seen in self._readers.items() if seen >= since),
                spilled_entries=self._spilled_entries,
                spilled_bytes=self._spilled_bytes,
                spill_folder=None if self.spill is None else self.spill.folder,
                job=self.job,
                refused_through=self._refused_through,
            )


def _check_bounds(keep_barriers: int, max_bytes: int, max_spill_bytes: int = 0) -> None:
    if keep_barriers < 0:
        raise ValueError("keep_barriers must be >= 0")
    if max_bytes < 0:
        raise ValueError("max_bytes must be >= 0")
    if max_spill_bytes < 0:
        raise ValueError("max_spill_bytes must be >= 0")


def _spill(folder: str, properties: dict[str, str]) -> Spill:
    from metaservice.logstore.spill import Spill

    return Spill(folder, properties)


def _offset(entry: LogEntry | None) -> tuple[int, int, int] | None:
    return None if entry is None else (entry.barrier, entry.batch_id, entry.seq)


def _cap(entries: list[LogEntry], max_bytes: int | None) -> list[LogEntry]:
    if max_bytes is None:
        return entries
    taken: list[LogEntry] = []
    size = 0
    for entry in entries:
        if taken and size + entry.nbytes > max_bytes:
            break
        taken.append(entry)
        size += entry.nbytes
    return taken


class LogStore:
    """Every table's log in one process, created on first append.

    ``spill_root``: rows past a table's ``max_bytes`` that no snapshot holds yet are
    spilled to Arrow files under ``<spill_root>/<table>/``, up to ``max_spill_bytes`` a
    table (through a pyiceberg FileIO built from ``spill_properties``: a local folder,
    ``s3://...``); None keeps them in memory. A writer in the same process may give a table its own bound and folder
    (:meth:`configure`).
    """

    def __init__(
        self,
        *,
        keep_barriers: int = DEFAULT_KEEP_BARRIERS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        now: Callable[[], float] = time.time,
        spill_root: str | None = None,
        spill_properties: dict[str, str] | None = None,
        max_spill_bytes: int = DEFAULT_MAX_SPILL_BYTES,
    ) -> None:
        _check_bounds(keep_barriers, max_bytes, max_spill_bytes)
        self.keep_barriers = keep_barriers
        self.max_bytes = max_bytes
        self.max_spill_bytes = max_spill_bytes
        self._now = now
        self.spill_root = spill_root.rstrip("/") if spill_root else None
        self.spill_properties = dict(spill_properties or {})
        self._tables: dict[str, TableLog] = {}
        self._lock = threading.Lock()

    def table(self, name: str) -> TableLog:
        """The table's log, created empty when the store has none yet (writers' calls)."""
        with self._lock:
            found = self._tables.get(name)
            if found is None:
                found = TableLog(
                    name, self.keep_barriers, self.max_bytes, self._now, self.max_spill_bytes
                )
                if self.spill_root is not None:
                    found.spill = _spill(f"{self.spill_root}/{name}", self.spill_properties)
                self._tables[name] = found
            return found

    def configure(
        self,
        name: str,
        *,
        max_bytes: int | None = None,
        keep_barriers: int | None = None,
        spill_folder: str | None = None,
        spill_properties: dict[str, str] | None = None,
        max_spill_bytes: int | None = None,
    ) -> TableLog:
        """Give one table its own bound and spill folder (an embedded log's writer does,
        from the table's properties and location); None leaves a setting as it is."""
        table_log = self.table(name)
        _check_bounds(
            table_log.keep_barriers if keep_barriers is None else keep_barriers,
            table_log.max_bytes if max_bytes is None else max_bytes,
            table_log.max_spill_bytes if max_spill_bytes is None else max_spill_bytes,
        )
        with table_log._lock:
            if max_bytes is not None:
                table_log.max_bytes = max_bytes
            if keep_barriers is not None:
                table_log.keep_barriers = keep_barriers
            if max_spill_bytes is not None:
                table_log.max_spill_bytes = max_spill_bytes
            if spill_folder is not None:
                table_log.spill = _spill(spill_folder, spill_properties or {})
        return table_log

    def existing(self, name: str) -> TableLog:
        """The table's log; 404 when nothing was ever written to it here (readers' calls)."""
        with self._lock:
            found = self._tables.get(name)
        if found is None:
            raise NotFound(
                f"this log service holds no log of table {name}: its writer has not "
                "appended or reset here",
                field="table",
                code=wire.TABLE_UNKNOWN_CODE,
            )
        return found

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._tables)
