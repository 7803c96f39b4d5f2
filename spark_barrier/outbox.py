"""Durable local outbox for reports from Spark jobs to the MetaService (guarantee G4).

A Spark job never waits for the MetaService. Each report (a JSON-able dict, e.g.
``{"job": ..., "batch_id": ..., "barrier": ..., "table": ..., "snapshot_id": ...}``)
is appended to a local write-ahead log and ``append`` returns once it is on disk
(or, with ``fsync="interval"``, once it is in the OS page cache and at most
``fsync_interval_s`` before it is on disk). A :class:`Deliverer` thread sends the
unacknowledged reports in order, in batches, retrying with exponential backoff while
the MetaService is unreachable, and acknowledges them in the log after each success.

Directory layout
----------------
``<dir>/<first-seq, 20 digits>.wal``
    Append-only segment files, named by the sequence number of their first record
    (``00000000000000000001.wal``). A new segment is started when the next record would
    push the current one past ``segment_bytes`` (a record larger than that gets a
    segment of its own). Consecutive segments are contiguous: a segment's name is the
    previous segment's last sequence number plus one.
``<dir>/ACKED``
    ``{"acked": N, "crc": crc32(str(N))}``: every record with ``seq <= N`` was
    acknowledged by the MetaService. Replaced atomically (temp file, fsync, rename,
    directory fsync). A segment is deleted only once all its records are acknowledged,
    so everything before the oldest remaining segment is acknowledged too.
``<dir>/LOCK``
    Held with ``flock`` while an :class:`Outbox` has the directory open, so two
    writers can never interleave records.
``<dir>/*.wal.damaged``
    Segments set aside on open because they follow damage (see below). They are never
    read again, do not count towards ``max_bytes`` and may be deleted by an operator.

Record framing (all integers little-endian)
-------------------------------------------
::

    offset  size  field
    0       4     length   payload length in bytes (u32, 1 .. MAX_PAYLOAD_BYTES)
    4       4     crc      zlib.crc32 over bytes 0..3 (length), 8..15 (seq) and the payload
    8       8     seq      sequence number (u64): +1 per record; new ones exceed the acked one
    16      len   payload  UTF-8 JSON object (compact separators, no NaN/Infinity)

The CRC covers the length and the sequence number as well as the payload, so a flipped
bit anywhere in a record is caught. A record is intact only if its header is complete,
its length is plausible and fits in the file, its CRC matches and its sequence number
is the one expected at that position.

Recovery on open
----------------
Segments are scanned in order. At the first damaged record (torn header or payload
after a crash, bad length, bad CRC, zero-filled region, unexpected sequence number) or
the first segment whose name does not continue the sequence, the log is cut: the
segment is truncated to its last intact record and every later segment is renamed to
``*.wal.damaged``, with a WARNING on logger ``spark_barrier.outbox``. Records after
damage are dropped rather than delivered with a gap, because delivery is in order; a
lost report is not lost knowledge either, since the MetaService can rebuild its
barrier-to-snapshot mapping from the snapshot summaries (G4). Opening never raises
because of a damaged file.

Delivery semantics
------------------
At-least-once, in sequence order. A batch is acknowledged in the log only after
``send`` returned. If the process dies (or the ACKED file cannot be written) after a
batch was sent but before its acknowledgement was recorded, that batch is sent again
after a restart: the receiver must be idempotent, which the MetaService's commit
reports are (G3). No record is ever skipped.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import io
import json
import logging
import os
import random
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple

__all__ = [
    "HEADER_BYTES",
    "MAX_PAYLOAD_BYTES",
    "Deliverer",
    "Entry",
    "Outbox",
    "OutboxClosedError",
    "OutboxCorruptError",
    "OutboxError",
    "OutboxFullError",
    "OutboxLockedError",
    "decode_frame_header",
    "encode_frame",
]

log = logging.getLogger("spark_barrier.outbox")

Report = dict[str, Any]
FsyncMode = Literal["always", "interval"]

HEADER_BYTES = 16
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024  # reports are small; anything bigger is damage or a bug
DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BYTES = 1024 * 1024 * 1024

_HEADER = struct.Struct("<IIQ")  # length, crc, seq
_LEN_SEQ = struct.Struct("<IQ")  # the header fields the CRC covers besides the payload
_SEGMENT_SUFFIX = ".wal"
_DAMAGED_SUFFIX = ".damaged"
_ACKED = "ACKED"
_ACKED_TMP = "ACKED.tmp"
_LOCK = "LOCK"
_SEQ_DIGITS = 20

# fdatasync skips metadata that is not needed to read the data back (e.g. mtime).
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class OutboxError(Exception):
    """Base class of the outbox's errors."""


class OutboxFullError(OutboxError):
    """The outbox reached ``max_bytes``; the report was not written."""


class OutboxLockedError(OutboxError):
    """Another process (or Outbox object) has the outbox directory open."""


class OutboxClosedError(OutboxError):
    """The outbox was closed."""


class OutboxCorruptError(OutboxError):
    """A record went bad after the outbox was opened; reopening cuts it."""


class Entry(NamedTuple):
    """One record of the log: its sequence number and the report."""

    seq: int
    record: Report


# --------------------------------------------------------------------------- framing


def _crc(length: int, seq: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(_LEN_SEQ.pack(length, seq)))


def encode_frame(seq: int, payload: bytes) -> bytes:
    """The on-disk bytes of one record (header + payload)."""
    return _HEADER.pack(len(payload), _crc(len(payload), seq, payload), seq) + payload


def decode_frame_header(header: bytes) -> tuple[int, int, int]:
    """``(length, crc, seq)`` of a 16-byte record header."""
    length, crc, seq = _HEADER.unpack(header)
    return length, crc, seq


def _encode_payload(record: Mapping[str, Any]) -> bytes:
    if not isinstance(record, Mapping):
        raise TypeError(f"an outbox record must be a dict, not {type(record).__name__}")
    # allow_nan=False: NaN/Infinity are not JSON and the service would refuse them forever.
    text = json.dumps(dict(record), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    payload = text.encode("utf-8")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"report of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES} bytes")
    return payload


def _frame_problem(data: bytes, offset: int, expected_seq: int) -> tuple[int, str | None]:
    """Check the record at ``offset``; return (frame size, None) or (0, what is wrong)."""
    left = len(data) - offset
    if left < HEADER_BYTES:
        return 0, f"torn header ({left} of {HEADER_BYTES} bytes)"
    length, crc, seq = _HEADER.unpack_from(data, offset)
    if length == 0:
        zero_tail = not any(data[offset:])
        return 0, "zero-filled tail" if zero_tail else "zero length (zero-filled region?)"
    if length > MAX_PAYLOAD_BYTES:
        return 0, f"implausible length {length}"
    if length > left - HEADER_BYTES:
        return 0, f"torn record (needs {length} payload bytes, {left - HEADER_BYTES} left)"
    payload = data[offset + HEADER_BYTES : offset + HEADER_BYTES + length]
    if crc != _crc(length, seq, payload):
        return 0, "CRC mismatch"
    if seq != expected_seq:
        return 0, f"sequence number {seq} where {expected_seq} was expected"
    return HEADER_BYTES + length, None


def _read_frame(f: io.BufferedReader, path: Path, offset: int, end: int) -> tuple[int, bytes, int]:
    """Read and verify the record at ``offset``; return (seq, payload, frame size)."""
    header = f.read(HEADER_BYTES)
    if len(header) == HEADER_BYTES:
        length, crc, seq = _HEADER.unpack(header)
        if 0 < length <= end - offset - HEADER_BYTES:
            payload = f.read(length)
            if len(payload) == length and crc == _crc(length, seq, payload):
                return seq, payload, HEADER_BYTES + length
    raise OutboxCorruptError(
        f"outbox segment {path} is damaged at byte {offset}; reopen the outbox to cut it"
    )


# --------------------------------------------------------------------------- files


@dataclass
class _Segment:
    first: int  # sequence number in the file name
    path: Path
    size: int  # bytes of intact records (readers never look past it)
    last: int | None  # sequence number of the last record, None while empty


@dataclass(frozen=True)
class _Cursor:
    """Where the record ``next_seq`` starts, so sequential reads need not rescan."""

    next_seq: int
    segment_first: int
    offset: int


def _segment_name(first_seq: int) -> str:
    return f"{first_seq:0{_SEQ_DIGITS}d}{_SEGMENT_SUFFIX}"


def _list_segments(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        stem = path.name[: -len(_SEGMENT_SUFFIX)]
        if path.name.endswith(_SEGMENT_SUFFIX) and len(stem) == _SEQ_DIGITS and stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(directory: Path) -> None:
    # A new or renamed file is only durable once its directory entry is.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _acked_crc(seq: int) -> int:
    return zlib.crc32(str(seq).encode())


def _read_acked(directory: Path) -> int:
    path = directory / _ACKED
    try:
        doc = json.loads(path.read_bytes())
        seq, crc = doc["acked"], doc["crc"]
        if isinstance(seq, int) and seq >= 0 and crc == _acked_crc(seq):
            return seq
        raise ValueError("checksum mismatch")
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # Falling back redelivers acknowledged reports (harmless, the receiver is
        # idempotent); trusting a damaged number could skip unacknowledged ones.
        log.warning("ignoring unreadable %s (%s); acknowledged reports may be resent", path, exc)
        return 0


def _write_acked(directory: Path, seq: int) -> None:
    tmp = directory / _ACKED_TMP
    data = json.dumps({"acked": seq, "crc": _acked_crc(seq)}).encode() + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / _ACKED)
    _fsync_dir(directory)


def _lock_directory(directory: Path) -> int:
    fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OutboxLockedError(
            f"outbox {directory} is already open (another process or Outbox object); "
            "each Spark driver needs its own outbox directory"
        ) from None
    return fd


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- recovery


def _scan_segment(path: Path, first_seq: int) -> tuple[int, int, str | None]:
    """(intact records, intact bytes, problem or None) of one segment file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return 0, 0, f"unreadable ({exc})"
    offset, seq = 0, first_seq
    while offset < len(data):
        size, problem = _frame_problem(data, offset, seq)
        if problem is not None:
            return seq - first_seq, offset, f"{problem} at byte {offset}"
        offset, seq = offset + size, seq + 1
    return seq - first_seq, offset, None


def _truncate(path: Path, size: int) -> bool:
    try:
        with path.open("r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        log.error("could not truncate damaged outbox segment %s: %s", path, exc)
        return False
    return True


def _set_aside(paths: list[Path]) -> None:
    for path in paths:
        try:
            os.replace(path, path.with_name(path.name + _DAMAGED_SUFFIX))
        except OSError as exc:
            log.error("could not set aside outbox segment %s: %s", path, exc)


def _recover_segments(files: list[tuple[int, Path]]) -> list[_Segment]:
    """Scan segments in order; cut the log at the first damage."""
    kept: list[_Segment] = []
    expected: int | None = None
    for i, (first, path) in enumerate(files):
        if expected is not None and first != expected:
            _cut(path, f"segment starts at {first} but {expected} was expected", files[i:])
            break
        count, good, problem = _scan_segment(path, first)
        if problem is not None:
            if not _truncate(path, good):
                _cut(path, problem, files[i:])
                break
            kept.append(_Segment(first, path, good, first + count - 1 if count else None))
            _cut(path, problem, files[i + 1 :], truncated_at=good)
            break
        kept.append(_Segment(first, path, good, first + count - 1 if count else None))
        expected = first + count
    return kept


def _cut(path: Path, problem: str, dropped: list[tuple[int, Path]], truncated_at: int = -1) -> None:
    names = [p.name for _, p in dropped]
    what = f"truncated it to {truncated_at} bytes" if truncated_at >= 0 else "kept nothing of it"
    log.warning(
        "outbox segment %s is damaged (%s): %s and set aside %d later segment file(s) %s as "
        "*%s; reports after the damage are dropped (the MetaService can rebuild them from "
        "snapshot summaries)",
        path, problem, what, len(names), names, _DAMAGED_SUFFIX,
    )  # fmt: skip
    _set_aside([p for _, p in dropped])


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


# --------------------------------------------------------------------------- delivery


class Deliverer:
    """Background thread delivering an outbox's records in order through ``send``.

    ``send(batch)`` gets up to ``batch_size`` reports in sequence order and must raise
    on failure, in which case the same batch is retried with exponential backoff
    (``initial_backoff_s`` doubling up to ``max_backoff_s``, each delay shortened by a
    random fraction up to ``jitter`` so that many drivers do not retry in lockstep).
    It should raise only for failures worth retrying: a report the service refuses for
    good (e.g. a 409 conflict) must be logged and swallowed by ``send``, or it would
    block every later report. After a success the batch is acknowledged in the outbox.
    Delivery is at-least-once (see the module docstring).

    Another delivery path (a barrier request carrying the job's reports, see
    ``spark_barrier/carry.py``) may deliver records too: :meth:`hold` keeps records
    back for a while so that it can carry them, :meth:`take` hands it the records not
    yet sent (never while ``send`` is sending them), and :meth:`settle` says whether
    they were acknowledged (then they count as delivered, and are acknowledged in the
    outbox) or not (then this thread sends them at once, as any other).
    """

    def __init__(
        self,
        outbox: Outbox,
        send: Callable[[list[Report]], object],
        *,
        batch_size: int = 100,
        initial_backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        jitter: float = 0.5,
        name: str = "outbox-deliverer",
    ) -> None:
        if batch_size < 1 or initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("need batch_size >= 1 and 0 < initial_backoff_s <= max_backoff_s")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        self._outbox = outbox
        self._send = send
        self._batch_size = batch_size
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._jitter = jitter
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._delivered = outbox.acked_seq  # sent successfully (acked or about to be)
        self._failures = 0  # consecutive failed attempts
        self._failing_since = 0.0
        # The other delivery path: records from _held_from on wait until _held_until
        # (time.monotonic) for it; records up to _carrying are in its hands; _sending
        # while this thread's send has a batch.
        self._state = threading.Lock()
        self._wakeup = threading.Event()
        self._held_from = 0
        self._held_until = 0.0
        self._carrying = 0
        self._sending = False

    @property
    def delivered_seq(self) -> int:
        return self._delivered

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def start(self) -> Deliverer:
        self._thread.start()
        return self

    # -- the other delivery path

    def hold(self, seq: int, seconds: float) -> None:
        """Keep record ``seq`` and the later ones back for up to ``seconds`` (from now),
        for another path to deliver; a hold already running keeps its (earlier) end."""
        with self._state:
            if self._held_until > time.monotonic() and self._held_from <= seq:
                return
            self._held_from, self._held_until = seq, time.monotonic() + seconds
        self._wakeup.set()

    def take(self, limit: int, accept: Callable[[Report], bool]) -> list[Entry]:
        """The oldest records not sent yet that ``accept`` takes, up to ``limit``, in
        order, handed to the caller until :meth:`settle` (none while this thread is
        sending, or while an earlier take is not settled)."""
        with self._state:
            if self._sending or self._carrying:
                return []
            try:
                batch = self._outbox.read_batch(self._delivered, limit)
            except OutboxError:
                return []
            taken: list[Entry] = []
            for entry in batch:  # a prefix: delivery stays in order
                if not accept(entry.record):
                    break
                taken.append(entry)
            if taken:
                self._carrying = taken[-1].seq
            return taken

    def settle(self, upto_seq: int, acknowledged: bool) -> None:
        """The records taken up to ``upto_seq`` were acknowledged by the MetaService
        (they count as delivered), or not (this thread sends them now)."""
        with self._state:
            if self._carrying == upto_seq:
                self._carrying = 0
            if acknowledged:
                self._delivered = max(self._delivered, upto_seq)
            # The hold was for what was taken; a later record starts a hold of its own,
            # and one appended meanwhile (rare) is sent now.
            self._held_until = 0.0
        self._wakeup.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything appended so far is acknowledged; False on timeout."""
        with self._state:
            self._held_until = 0.0  # nothing waits for another path any more
        self._wakeup.set()
        target = self._outbox.last_seq
        done = self._outbox.wait_acked(target, timeout, cancel=self._stop)
        return done or self._outbox.acked_seq >= target

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the thread; a ``send`` in progress is allowed to finish within ``timeout``."""
        self._stop.set()
        self._wakeup.set()
        self._outbox._wake()  # out of wait_for_records / wait_acked at once
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("outbox deliverer still busy in send() after %s s", timeout)

    def __enter__(self) -> Deliverer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._step()
            self._try_ack()  # do not resend after a restart what was already delivered
        except OutboxClosedError:
            pass

    def _step(self) -> None:
        self._wakeup.clear()  # a wake-up from here on ends the wait below at once
        with self._state:
            self._delivered = max(self._delivered, self._outbox.acked_seq)
            wait = self._carrying > 0  # in the other path's hands: wait for its answer
            held = self._held_until - time.monotonic() if self._held_until else 0.0
            batch: list[Entry] = []
            if not wait:
                try:
                    batch = self._outbox.read_batch(self._delivered, self._batch_size)
                except OutboxClosedError:
                    raise
                except Exception as exc:
                    self._failed(exc, "cannot read the outbox")
                    return
                if held > 0:
                    batch = [e for e in batch if e.seq < self._held_from]
                self._sending = bool(batch)
        if not batch:
            self._try_ack()
            if wait or held > 0:
                self._wakeup.wait(min(1.0, held) if held > 0 else 1.0)
            else:
                self._outbox.wait_for_records(self._delivered, 1.0, cancel=self._stop)
            return
        delivered = False
        try:
            delivered = self._deliver([e.record for e in batch])
        finally:
            with self._state:
                self._sending = False
                if delivered:
                    self._delivered = max(self._delivered, batch[-1].seq)
        if delivered:
            self._try_ack()

    def _deliver(self, records: list[Report]) -> bool:
        while not self._stop.is_set():
            try:
                self._send(records)
            except Exception as exc:
                self._failed(exc, "cannot deliver reports to the MetaService")
                continue
            self._recovered()
            return True
        return False

    def _try_ack(self) -> None:
        if self._delivered <= self._outbox.acked_seq:
            return
        try:
            self._outbox.ack(self._delivered)
        except OutboxClosedError:
            raise
        except Exception as exc:
            # Retried with the next ack (acks are cumulative); until then, a restart
            # would resend these reports, which the idempotent receiver tolerates.
            log.warning("could not record the acknowledgement of %d: %s", self._delivered, exc)

    def _failed(self, exc: Exception, what: str) -> None:
        self._failures += 1
        if self._failures == 1:
            self._failing_since = time.monotonic()
            log.warning(
                "%s (%s: %s); %d reports waiting in outbox %s; retrying with backoff up to %g s",
                what, type(exc).__name__, exc, self._outbox.backlog, self._outbox.directory,
                self._max_backoff_s,
            )  # fmt: skip
        else:
            log.debug("%s, attempt %d: %s", what, self._failures, exc)
        self._stop.wait(self._backoff(self._failures))

    def _recovered(self) -> None:
        if self._failures:
            log.info(
                "delivery to the MetaService recovered after %d failed attempts over %.1f s; "
                "%d reports waiting in outbox %s",
                self._failures, time.monotonic() - self._failing_since, self._outbox.backlog,
                self._outbox.directory,
            )  # fmt: skip
        self._failures = 0

    def _backoff(self, attempt: int) -> float:
        delay = min(self._max_backoff_s, self._initial_backoff_s * 2.0 ** min(attempt - 1, 62))
        return delay * (1 - self._jitter * random.random())
