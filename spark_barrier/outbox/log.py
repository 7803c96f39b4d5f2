"""The outbox itself: a durable, size-bounded, thread-safe write-ahead log of reports
(appending, fsync with group commit, acknowledging, reading in order)."""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from spark_barrier.outbox.errors import (
    OutboxClosedError,
    OutboxError,
    OutboxFullError,
)
from spark_barrier.outbox.frames import (
    HEADER_BYTES,
    Entry,
    _encode_payload,
    _read_frame,
    encode_frame,
)
from spark_barrier.outbox.segments import (
    _ACKED_TMP,
    _Cursor,
    _datasync,
    _fsync_dir,
    _human,
    _list_segments,
    _lock_directory,
    _read_acked,
    _recover_segments,
    _Segment,
    _segment_name,
    _write_acked,
    _write_all,
)

log = logging.getLogger("spark_barrier.outbox")  # one logger for the whole package

FsyncMode = Literal["always", "interval"]

DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BYTES = 1024 * 1024 * 1024

# --------------------------------------------------------------------------- outbox


class Outbox:
    """A durable, size-bounded, thread-safe write-ahead log of reports.

    ``append`` assigns strictly increasing sequence numbers; ``ack`` records the
    MetaService's acknowledgement durably and deletes fully acknowledged segments;
    ``pending``/``read_batch`` read the unacknowledged records in order.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        fsync: FsyncMode = "always",
        fsync_interval_s: float = 1.0,
    ) -> None:
        if fsync not in ("always", "interval"):
            raise ValueError(f"fsync must be 'always' or 'interval', not {fsync!r}")
        if segment_bytes <= HEADER_BYTES or max_bytes <= HEADER_BYTES or fsync_interval_s <= 0:
            raise ValueError("segment_bytes, max_bytes and fsync_interval_s must be positive")
        self._dir = Path(directory)
        self._segment_bytes = segment_bytes
        self._max_bytes = max_bytes
        self._fsync_mode: FsyncMode = fsync
        self._fsync_interval_s = fsync_interval_s
        self._lock = threading.Lock()  # guards all state below
        self._changed = threading.Condition(self._lock)  # appends, acks, close
        self._sync_lock = threading.Lock()  # one fsync at a time (group commit)
        self._ack_lock = threading.Lock()  # one ACKED rewrite at a time
        self._segments: list[_Segment] = []
        self._fd: int | None = None  # of the last segment, while it is open for append
        self._next_seq = 1
        self._acked = 0
        self._durable = 0
        self._total_bytes = 0
        self._cursor: _Cursor | None = None
        self._failed: BaseException | None = None
        self._closed = False
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_directory(self._dir)
        try:
            self._open_log()
        except BaseException:
            self._release()
            raise
        self._stop_flusher = threading.Event()
        self._flusher: threading.Thread | None = None
        if fsync == "interval":
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"outbox-fsync:{self._dir.name}", daemon=True
            )
            self._flusher.start()

    # -- opening

    def _open_log(self) -> None:
        files = _list_segments(self._dir)
        # Segments are deleted only once acknowledged, so all before the oldest one were.
        floor = files[0][0] - 1 if files else 0
        self._acked = max(_read_acked(self._dir), floor)
        with contextlib.suppress(FileNotFoundError):
            (self._dir / _ACKED_TMP).unlink()
        segments = _recover_segments(files)
        last = max([s.last for s in segments if s.last is not None], default=0)
        # Past `acked` even if the log lost its tail (OS crash in interval mode): a
        # reused number at or below `acked` would count as delivered and be skipped.
        self._next_seq = max(last, self._acked) + 1
        self._segments = [s for s in segments if s.last is not None and s.last > self._acked]
        self._delete([s for s in segments if s not in self._segments])
        self._total_bytes = sum(s.size for s in self._segments)
        if self._segments:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)
            _datasync(self._fd)  # what the previous process left in the page cache
        _fsync_dir(self._dir)
        self._durable = self._next_seq - 1

    # -- properties

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def last_seq(self) -> int:
        """Sequence number of the latest record appended (0 if none ever was)."""
        with self._lock:
            return self._next_seq - 1

    @property
    def acked_seq(self) -> int:
        """Every record with a sequence number up to this one is acknowledged."""
        with self._lock:
            return self._acked

    @property
    def durable_seq(self) -> int:
        """Every record up to this one is fsynced (survives an OS crash)."""
        with self._lock:
            return self._durable

    @property
    def backlog(self) -> int:
        """Number of records appended but not acknowledged."""
        with self._lock:
            return self._next_seq - 1 - self._acked

    @property
    def size_bytes(self) -> int:
        """Bytes of the segment files, the figure ``max_bytes`` bounds."""
        with self._lock:
            return self._total_bytes

    @property
    def segments(self) -> list[Path]:
        with self._lock:
            return [s.path for s in self._segments]

    # -- appending

    def append(self, record: Mapping[str, Any], *, reserve_bytes: int = 0) -> int:
        """Append a report; return its sequence number once it is durable per the fsync mode.

        Raises ``OutboxFullError`` (nothing written) when the log would exceed
        ``max_bytes``, or leave less than ``reserve_bytes`` for the records that must
        follow this one; ``TypeError``/``ValueError`` for a report that is not a JSON
        object.
        """
        payload = _encode_payload(record)
        with self._lock:
            self._check_writable()
            seq = self._next_seq
            frame = encode_frame(seq, payload)
            self._ensure_room(len(frame), reserve_bytes)
            self._write(self._segment_for(len(frame)), seq, frame)
            self._next_seq = seq + 1
            self._changed.notify_all()
        if self._fsync_mode == "always":
            self._sync_upto(seq)
        return seq

    def _check_writable(self) -> None:
        if self._closed:
            raise OutboxClosedError(f"outbox {self._dir} is closed")
        if self._failed is not None:
            raise OutboxError(
                f"outbox {self._dir} failed earlier ({self._failed}); reopen it to recover"
            ) from self._failed

    def _ensure_room(self, frame_bytes: int, reserve_bytes: int) -> None:
        if self._total_bytes + frame_bytes + reserve_bytes <= self._max_bytes:
            return
        backlog = self._next_seq - 1 - self._acked
        needs = f"{frame_bytes} more bytes" + (
            f" and {reserve_bytes} kept free for the reports that follow it"
            if reserve_bytes
            else ""
        )
        raise OutboxFullError(
            f"outbox {self._dir} is full: {_human(self._total_bytes)} of "
            f"max_bytes={_human(self._max_bytes)} used by {backlog} reports the MetaService "
            f"has not acknowledged, and this report needs {needs}; it was "
            "not written. Bring the MetaService back (check that it is running and reachable "
            "from this driver) so the backlog drains, or raise max_bytes."
        )

    def _segment_for(self, frame_bytes: int) -> _Segment:
        active = self._segments[-1] if self._fd is not None else None
        if active is not None and (
            active.size == 0 or active.size + frame_bytes <= self._segment_bytes
        ):
            return active
        self._close_active()
        path = self._dir / _segment_name(self._next_seq)
        # O_EXCL: never append to a file this object does not know the contents of.
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        segment = _Segment(self._next_seq, path, 0, None)
        self._segments.append(segment)
        try:
            _fsync_dir(self._dir)
        except OSError as exc:
            self._failed = exc
            raise
        return segment

    def _close_active(self) -> None:
        """Make the active segment durable and close it (called with the lock held)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            _datasync(fd)
        except OSError as exc:
            self._failed = exc
            raise
        finally:
            os.close(fd)
        last = self._segments[-1].last
        if last is not None:
            self._durable = max(self._durable, last)

    def _write(self, segment: _Segment, seq: int, frame: bytes) -> None:
        assert self._fd is not None
        try:
            _write_all(self._fd, frame)
        except OSError:
            self._undo_partial_write(segment)
            raise
        segment.size += len(frame)
        segment.last = seq
        self._total_bytes += len(frame)

    def _undo_partial_write(self, segment: _Segment) -> None:
        # A half-written frame (e.g. ENOSPC) would make every later record unreadable.
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, segment.size)
        except OSError as exc:
            self._failed = exc  # reopening cuts the torn tail

    # -- durability

    def sync(self) -> None:
        """fsync everything appended so far."""
        self._sync_upto(self.last_seq)

    def _sync_upto(self, seq: int) -> None:
        # Group commit: appenders that arrive while an fsync runs are covered by the next
        # one, so N concurrent appenders cost far fewer than N fsyncs.
        with self._sync_lock:
            with self._lock:
                if self._durable >= seq:
                    return
                self._check_writable()
                target = self._next_seq - 1
                # A duplicate stays valid if the segment is rotated or deleted meanwhile.
                fd = os.dup(self._fd) if self._fd is not None else None
            try:
                if fd is not None:
                    _datasync(fd)
            except OSError as exc:
                # After a failed fsync the page cache state is unknown (it may claim to be
                # clean); refuse further appends rather than pretend they are durable.
                with self._lock:
                    self._failed = exc
                raise OutboxError(f"fsync of outbox {self._dir} failed: {exc}") from exc
            finally:
                if fd is not None:
                    os.close(fd)
            with self._lock:
                # No fd: the active segment was deleted because all of it is acknowledged.
                self._durable = max(self._durable, target)

    def _flush_loop(self) -> None:
        while not self._stop_flusher.wait(self._fsync_interval_s):
            try:
                self._sync_upto(self.last_seq)
            except OutboxClosedError:
                return
            except Exception:
                log.exception("background fsync of outbox %s failed; appends now fail", self._dir)
                return

    # -- acknowledging

    def ack(self, upto_seq: int) -> None:
        """Record durably that every record up to ``upto_seq`` was acknowledged."""
        with self._ack_lock:
            with self._lock:
                if self._closed:
                    raise OutboxClosedError(f"outbox {self._dir} is closed")
                if upto_seq > self._next_seq - 1:
                    raise ValueError(
                        f"cannot ack {upto_seq}: the last appended record is {self._next_seq - 1}"
                    )
                if upto_seq <= self._acked:
                    return
            _write_acked(self._dir, upto_seq)  # slow (fsyncs): outside the lock
            with self._lock:
                self._acked = upto_seq
                doomed = self._detach_acked()
                self._changed.notify_all()
            self._delete(doomed)

    def _detach_acked(self) -> list[_Segment]:
        doomed = [s for s in self._segments if s.last is not None and s.last <= self._acked]
        if not doomed:
            return []
        if doomed[-1] is self._segments[-1] and self._fd is not None:
            # The active segment is fully acknowledged: no need to fsync what is delivered.
            os.close(self._fd)
            self._fd = None
        self._segments = self._segments[len(doomed) :]
        self._total_bytes -= sum(s.size for s in doomed)
        return doomed

    @staticmethod
    def _delete(segments: list[_Segment]) -> None:
        # No directory fsync: a deletion lost in a crash is redone on open (it is acked).
        for s in segments:
            try:
                s.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not delete acknowledged outbox segment %s: %s", s.path, exc)

    # -- reading

    def pending(self) -> Iterator[Entry]:
        """Iterate over the unacknowledged records in sequence order."""
        after = self.acked_seq
        while batch := self.read_batch(after, 512):
            yield from batch
            after = batch[-1].seq

    __iter__ = pending

    def read_batch(self, after_seq: int, limit: int) -> list[Entry]:
        """Up to ``limit`` unacknowledged records with ``seq > after_seq``, in order."""
        with self._lock:
            if self._closed:
                raise OutboxClosedError(f"outbox {self._dir} is closed")
            after_seq = max(after_seq, self._acked)
            # Sizes snapshot = bytes fully written; a record being appended is not read.
            segments = [(s.first, s.path, s.size) for s in self._segments]
            cursor = self._cursor
        start, offset = self._start_position(segments, after_seq, cursor)
        out: list[Entry] = []
        reached: tuple[int, int] | None = None
        for first, path, size in segments[start:]:
            try:
                end = _read_segment(path, offset, size, after_seq, limit, out)
            except FileNotFoundError:
                continue  # acknowledged and deleted meanwhile
            reached, offset = (first, end), 0
            if len(out) >= limit:
                break
        if out and reached is not None:
            self._cursor = _Cursor(out[-1].seq + 1, *reached)
        return out

    @staticmethod
    def _start_position(
        segments: list[tuple[int, Path, int]], after_seq: int, cursor: _Cursor | None
    ) -> tuple[int, int]:
        """Index of the segment holding ``after_seq + 1`` and the byte offset to start at."""
        firsts = [first for first, _, _ in segments]
        if cursor is not None and cursor.next_seq == after_seq + 1:
            i = bisect.bisect_left(firsts, cursor.segment_first)
            if i < len(firsts) and firsts[i] == cursor.segment_first:
                return i, cursor.offset
        return max(bisect.bisect_right(firsts, after_seq + 1) - 1, 0), 0

    def wait_for_records(
        self, after_seq: int, timeout: float | None, cancel: threading.Event | None = None
    ) -> bool:
        """Wait until a record with ``seq > after_seq`` exists; False on timeout/cancel/close."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._next_seq - 1 > after_seq or self._stop_waiting(cancel), timeout
            )
            return self._next_seq - 1 > after_seq

    def wait_acked(
        self, seq: int, timeout: float | None, cancel: threading.Event | None = None
    ) -> bool:
        """Wait until everything up to ``seq`` is acknowledged; False on timeout/cancel/close."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._acked >= seq or self._stop_waiting(cancel), timeout
            )
            return self._acked >= seq

    def _stop_waiting(self, cancel: threading.Event | None) -> bool:
        return self._closed or (cancel is not None and cancel.is_set())

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # -- closing

    def close(self) -> None:
        """fsync, close the files and release the directory lock (idempotent)."""
        with self._lock:
            if self._closed:
                return
        self._stop_flusher.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._sync_lock, self._lock:
            try:
                if self._failed is None:
                    self._close_active()
            except OSError as exc:
                log.error("final fsync of outbox %s failed: %s", self._dir, exc)
            finally:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
                self._closed = True
                self._changed.notify_all()
        self._release()

    def _release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)

    def __enter__(self) -> Outbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Outbox({str(self._dir)!r}, last_seq={self.last_seq}, acked={self.acked_seq})"


def _read_segment(
    path: Path, start: int, end: int, after_seq: int, limit: int, out: list[Entry]
) -> int:
    """Append records with ``seq > after_seq`` from bytes [start, end) to ``out`` (up to
    ``limit`` in total); return the offset reached."""
    offset = start
    with path.open("rb") as f:
        f.seek(start)
        while offset < end and len(out) < limit:
            seq, payload, size = _read_frame(f, path, offset, end)
            offset += size
            if seq > after_seq:
                out.append(Entry(seq, json.loads(payload)))
    return offset
