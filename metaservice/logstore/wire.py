"""What the log service and its clients agree on: paths, headers and offset columns (the
rows themselves travel as Arrow IPC streams: :mod:`metaservice.logstore.ipc`). Standard
library only, so ``metaservice log status`` loads it on the base install.
"""

from __future__ import annotations

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
JOB_HEADER = "X-Log-Job"  # the job whose batch ids the log holds (absent: not named)

ARROW_STREAM = "application/vnd.apache.arrow.stream"

# What one append may bring (the log service's defaults; ``metaservice log start`` flags).
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024  # as sent; 413 while it streams
DEFAULT_MAX_INFLATED_BYTES = 256 * 1024 * 1024  # its rows once decoded

# Error codes a reader acts on (the others are in docs/operations.md, "Errors").
GONE_CODE = "log_gone"  # 410: the position is older than what the log holds
RESET_CODE = "log_reset"  # 409: the log's epoch is not the reader's
TABLE_UNKNOWN_CODE = "log_table_unknown"  # 404: the service holds nothing of the table
FULL_CODE = "log_full"  # 409: at its bounds, the log refused the append (it falls behind)
