"""What the log service and its clients agree on: paths, headers, offset columns and the
Arrow IPC stream format of rows. Imports pyarrow only, so a Spark executor's Python worker
loads it without the server.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

API_PREFIX = "/v1"

# Offset columns a read adds to every row (the rows' own columns come first).
BARRIER_COLUMN = "_log_barrier"
BATCH_COLUMN = "_log_batch"
SEQ_COLUMN = "_log_seq"
OFFSET_COLUMNS = (BARRIER_COLUMN, BATCH_COLUMN, SEQ_COLUMN)

# Headers of a read's answer.
EPOCH_HEADER = "X-Log-Epoch"
NEXT_SEQ_HEADER = "X-Log-Next-Seq"
COMMITTED_BATCH_HEADER = "X-Log-Committed-Batch"
COMMITTED_SNAPSHOT_HEADER = "X-Log-Committed-Snapshot"

ARROW_STREAM = "application/vnd.apache.arrow.stream"


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
