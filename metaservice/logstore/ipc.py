"""Rows on the wire: Arrow IPC streams, and the offset columns a read adds to them."""

from __future__ import annotations

import struct
from collections.abc import Iterable

import pyarrow as pa

from metaservice.logstore.wire import OFFSET_COLUMNS


def encode(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> bytes:
    """Record batches as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def decode(body: bytes) -> list[pa.RecordBatch]:
    """The record batches of an Arrow IPC stream; ValueError when it is not one."""
    try:
        return list(pa.ipc.open_stream(pa.py_buffer(body)))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"the body is not an Arrow IPC stream: {exc}") from None


def with_offsets(rows: pa.RecordBatch, barrier: int, batch_id: int, seq: int) -> pa.RecordBatch:
    """``rows`` with the offset columns of their entry appended."""
    n = rows.num_rows
    columns = [*rows.columns, *(pa.array([v] * n, pa.int64()) for v in (barrier, batch_id, seq))]
    names = [*rows.schema.names, *OFFSET_COLUMNS]
    return pa.RecordBatch.from_arrays(columns, names=names)


def as_table(body: bytes) -> pa.Table | None:
    """A read's rows with their offset columns; None for an answer with no rows."""
    if not body:
        return None
    return pa.Table.from_batches(decode(body))


class TooLarge(ValueError):
    """An Arrow IPC stream whose record batches would inflate past a bound."""


# Arrow's IPC format (Message.fbs, Schema.fbs): a message's header is a flatbuffer
# ``Message`` whose union ``header`` is a ``RecordBatch`` (type 3) or a ``DictionaryBatch``
# (type 2, its ``data`` a RecordBatch). A RecordBatch lists its buffers as (offset,
# length) in the body; with ``compression`` set, each buffer starts with its
# uncompressed length as an int64 (-1: stored uncompressed).
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3


def inflated_size(body: bytes) -> int:
    """What the record batches of an Arrow IPC stream take once decoded, read from their
    headers without decompressing anything (ValueError when it is not such a stream)."""
    try:
        messages = list(pa.ipc.MessageReader.open_stream(pa.py_buffer(body)))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"the body is not an Arrow IPC stream: {exc}") from None
    total = 0
    for message in messages:
        if message.type not in ("record batch", "dictionary"):
            continue
        total += _batch_size(message.metadata.to_pybytes(), message.body)
    return total


def _batch_size(metadata: bytes, body: pa.Buffer | None) -> int:
    try:
        message = _u32(metadata, 0)
        header_type = _field_scalar(metadata, message, 1, "<B", 0)
        batch = _field_table(metadata, message, 2)
        if header_type == _DICTIONARY_BATCH and batch is not None:
            batch = _field_table(metadata, batch, 1)
        elif header_type != _RECORD_BATCH:
            return 0
        if batch is None:
            return 0
        compressed = _field_table(metadata, batch, 3) is not None
        buffers = _field_vector(metadata, batch, 2)
    except struct.error:
        raise ValueError("the body is not an Arrow IPC stream: a broken message header") from None
    if buffers is None:
        return 0
    start, count = buffers
    data = body.to_pybytes() if (compressed and body is not None) else b""
    size = 0
    for i in range(count):
        offset, length = struct.unpack_from("<qq", metadata, start + 16 * i)
        if compressed and length >= 8:
            if not 0 <= offset <= len(data) - 8:
                raise ValueError("the body is not an Arrow IPC stream: a buffer past its body")
            (uncompressed,) = struct.unpack_from("<q", data, offset)
            size += length if uncompressed < 0 else uncompressed
        else:
            size += max(length, 0)
    return size


def _u32(buf: bytes, at: int) -> int:
    return int(struct.unpack_from("<I", buf, at)[0])


def _field_offset(buf: bytes, table: int, index: int) -> int:
    """Where field ``index`` of the flatbuffer table at ``table`` is (0: absent)."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    vtable_size = struct.unpack_from("<H", buf, vtable)[0]
    slot = 4 + 2 * index
    if slot >= vtable_size:
        return 0
    relative = struct.unpack_from("<H", buf, vtable + slot)[0]
    return table + relative if relative else 0


def _field_scalar(buf: bytes, table: int, index: int, fmt: str, default: int) -> int:
    at = _field_offset(buf, table, index)
    return int(struct.unpack_from(fmt, buf, at)[0]) if at else default


def _field_table(buf: bytes, table: int, index: int) -> int | None:
    at = _field_offset(buf, table, index)
    return at + _u32(buf, at) if at else None


def _field_vector(buf: bytes, table: int, index: int) -> tuple[int, int] | None:
    """A vector field as (where its first element is, how many)."""
    at = _field_offset(buf, table, index)
    if not at:
        return None
    vector = at + _u32(buf, at)
    return vector + 4, _u32(buf, vector)
