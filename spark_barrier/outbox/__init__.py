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

The package is one module per responsibility: :mod:`.frames` (the record codec),
:mod:`.segments` (segment files, the ACKED file, the lock and recovery on open),
:mod:`.log` (:class:`Outbox`, the log) and :mod:`.delivery` (:class:`Deliverer`).
"""

from __future__ import annotations

from spark_barrier.outbox.delivery import Deliverer
from spark_barrier.outbox.errors import (
    OutboxClosedError,
    OutboxCorruptError,
    OutboxError,
    OutboxFullError,
    OutboxLockedError,
)
from spark_barrier.outbox.frames import (
    HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    Entry,
    Report,
    decode_frame_header,
    encode_frame,
)
from spark_barrier.outbox.log import DEFAULT_MAX_BYTES, DEFAULT_SEGMENT_BYTES, FsyncMode, Outbox

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_SEGMENT_BYTES",
    "HEADER_BYTES",
    "MAX_PAYLOAD_BYTES",
    "Deliverer",
    "Entry",
    "FsyncMode",
    "Outbox",
    "OutboxClosedError",
    "OutboxCorruptError",
    "OutboxError",
    "OutboxFullError",
    "OutboxLockedError",
    "Report",
    "decode_frame_header",
    "encode_frame",
]
