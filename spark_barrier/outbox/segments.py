"""Segment files, the ACKED file and the directory lock, and recovery on open: the
log cut at the first damage (see the package docstring)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spark_barrier.outbox.errors import OutboxLockedError
from spark_barrier.outbox.frames import _frame_problem

log = logging.getLogger("spark_barrier.outbox")  # one logger for the whole package

_SEGMENT_SUFFIX = ".wal"
_DAMAGED_SUFFIX = ".damaged"
_ACKED = "ACKED"
_ACKED_TMP = "ACKED.tmp"
_LOCK = "LOCK"
_SEQ_DIGITS = 20

# fdatasync skips metadata that is not needed to read the data back (e.g. mtime).
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)

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
