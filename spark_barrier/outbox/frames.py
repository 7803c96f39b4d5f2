"""Record framing: a record's header, CRC and JSON payload, written and checked (the
format is in the package docstring)."""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from spark_barrier.outbox.errors import OutboxCorruptError

Report = dict[str, Any]

HEADER_BYTES = 16
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024  # reports are small; anything bigger is damage or a bug

_HEADER = struct.Struct("<IIQ")  # length, crc, seq
_LEN_SEQ = struct.Struct("<IQ")  # the header fields the CRC covers besides the payload


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
