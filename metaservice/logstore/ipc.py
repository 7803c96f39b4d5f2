"""Rows on the wire: Arrow IPC streams, and the offset columns a read adds to them."""

from __future__ import annotations

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
