"""A CDC batch whose files pyiceberg's writer writes, in one Spark job.

The general path of a CDC batch (``commit._batch_rows``) runs three Spark jobs before
its commit: the check of the records (a null key, an unknown op) with the changed
keys' bounds, the write of the last change per key, and the collection of the
changed keys that tells the driver which current files to rewrite. Each job costs
the driver its planning and scheduling whatever the batch's size: at a demo's few
hundred rows a second, most of a batch's time.

When the batch's files are written by pyiceberg's writer anyway (a batch expected to
be small: see :func:`~spark_barrier.iceberg.native_write.why_not_native`), the tasks
that write them do the rest in the same job: each task checks its records, writes
the upserted rows of its keys' last changes and sends the driver its changed keys
(up to ``MAX_KEYS`` in all; past that the driver asks Spark for the keys' bounds
and matches them in Spark, as the general path does). The tasks run in Python
workers, or, for a batch expected to be very small, as one task on the driver over
the batch's changes collected as Arrow (:func:`~spark_barrier.iceberg.files.run_write_task`).

The answer is the general path's: the same last change per key (the records are
partitioned by key, so a key's records, and whether any is bad, meet in one task),
the same files, keys and bounds. A batch with a bad record commits nothing: the
tasks that find one write no more, the driver deletes the batch's folder and raises
:class:`~spark_barrier.iceberg.cdc.CdcInputError` naming the first bad records (a
second Spark job, on that path only).
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import BooleanExpression
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import _dataframe_to_data_files, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadataUtil
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from spark_barrier.iceberg.cdc import (
    DELETE_OP,
    OP,
    CdcInputError,
    check_changes,
    normalized_op_sql,
)
from spark_barrier.iceberg.files import (
    _chunk_bytes,
    _chunks,
    _decode_data_file,
    _encode_data_file,
    _of_default_spec,
    _writer_metadata,
    column_names,
    run_write_task,
)
from spark_barrier.iceberg.key_bounds import (
    key_bound_aggregates,
    key_bounds,
    key_filter_from_bounds,
)
from spark_barrier.iceberg.upsert import ARRIVAL, DRIVER_MATCH_MAX_ROWS, RANK, last_first
from spark_barrier.jvm import quoted, sql_over

# The changed keys the tasks bring to the driver at most; past that, Spark matches them.
MAX_KEYS = DRIVER_MATCH_MAX_ROWS
_BAD = "__ms_bad"  # per record: whether its key's records hold a bad one (0 or 1)
# One row per written file (data_file), and one summary row per task: its changed keys
# as an Arrow IPC stream (null when none, or past the limit), how many, bad records.
_RESULT_TYPE = T.StructType(
    [
        T.StructField("data_file", T.BinaryType()),
        T.StructField("keys", T.BinaryType()),
        T.StructField("changed", T.LongType()),
        T.StructField("bad", T.LongType()),
    ]
)
_RESULT_SCHEMA = pa.schema(
    [
        pa.field("data_file", pa.binary()),
        pa.field("keys", pa.binary()),
        pa.field("changed", pa.int64()),
        pa.field("bad", pa.int64()),
    ]
)


@dataclass(frozen=True)
class CdcWritten:
    """What the one job of a CDC batch gives the driver."""

    files: list[DataFile]  # the upserted rows' files
    changed_keys: pa.Table | None  # every changed key; None: too many, ask Spark
    key_filter: BooleanExpression  # the range the changed keys lie in


def write_cdc_batch(
    records: DataFrame,
    folder: str,
    table: Table,
    keys: list[str],
    op_column: str,
    order_by: str | None,
    where: str,
    expected_rows: int | None = None,
) -> CdcWritten:
    """Check `records` (the table's columns, `op_column` and maybe `order_by`), write
    the last change per key of the upserted keys as data files of `table` under the
    new `folder` (Python workers, or the driver for a batch expected to be small: see
    :func:`~spark_barrier.iceberg.files.run_write_task`), and bring back the changed
    keys: one Spark job. Raises CdcInputError (files may be left in `folder`: the
    caller deletes it)."""
    max_keys = MAX_KEYS
    columns = column_names(table)
    changes = sql_over({"records": records}, _changes_query(columns, keys, op_column, order_by))
    task = functools.partial(
        _cdc_task,
        metadata_json=_writer_metadata(table, folder),
        io_properties=dict(table.io.properties),
        arrow_schema=schema_to_pyarrow(table.schema(), include_field_ids=False),
        key_positions=[columns.index(k) for k in keys],
        max_keys=max_keys,
    )
    results = run_write_task(changes, task, _RESULT_TYPE, table, expected_rows)
    if sum(row["bad"] or 0 for row in results):
        check_changes(records, keys, op_column, where)  # raises, naming the records
        raise CdcInputError(
            f"{where}: change records that cannot be applied; nothing was committed"
        )
    files = [_decode_data_file(r["data_file"]) for r in results if r["data_file"] is not None]
    changed = sum(row["changed"] or 0 for row in results)
    if changed > max_keys:
        bounds = records.agg(*key_bound_aggregates(table, keys)).collect()[0]
        return CdcWritten(
            _of_default_spec(files, table), None, key_filter_from_bounds(table, keys, bounds)
        )
    parts = [_from_ipc(r["keys"]) for r in results if r["keys"] is not None]
    found = pa.concat_tables(parts) if parts else None
    return CdcWritten(
        _of_default_spec(files, table),
        found,
        key_filter_from_bounds(table, keys, key_bounds(table, keys, found)),
    )


def _changes_query(
    columns: list[str], keys: list[str], op_column: str, order_by: str | None
) -> str:
    """The last change per key of ``{records}``, as cdc.last_changes takes it (the largest
    `order_by`, then the record that came last), with its normalized op and whether its
    key's records hold a bad one (a null key or op): one SQL query, so that building it
    costs the driver a few Py4J calls rather than one per column and operator."""
    table_columns = ", ".join(quoted(c) for c in columns)
    by_key = ", ".join(quoted(k) for k in keys)
    bad = " OR ".join([*(f"{quoted(k)} IS NULL" for k in keys), f"{OP} IS NULL"])
    return f"""
        SELECT {table_columns}, {OP}, {_BAD} FROM (
            SELECT {table_columns}, {OP},
                max(CAST(({bad}) AS BIGINT)) OVER (PARTITION BY {by_key}) AS {_BAD},
                row_number() OVER (PARTITION BY {by_key} ORDER BY {last_first(order_by)}) AS {RANK}
            FROM (
                SELECT *, {normalized_op_sql(op_column)} AS {OP},
                    monotonically_increasing_id() AS {ARRIVAL}
                FROM {{records}}
            )
        ) WHERE {RANK} = 1
    """


def _cdc_task(
    batches: Iterator[pa.RecordBatch],
    *,
    metadata_json: str,
    io_properties: dict[str, str],
    arrow_schema: pa.Schema,
    key_positions: Sequence[int],
    max_keys: int,
) -> Iterator[pa.RecordBatch]:
    """One Spark task of :func:`write_cdc_batch` (runs on an executor, or on the driver
    over a whole small batch). Its records arrive as the table's columns, then the op,
    then the bad-key flag."""
    metadata = TableMetadataUtil.parse_raw(metadata_json)
    io = load_file_io(io_properties, metadata.location)
    write_uuid, counter = uuid.uuid4(), itertools.count()
    width = len(arrow_schema)
    seen: dict[str, Any] = {"bad": 0, "changed": 0, "keys": []}

    def upserted() -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            bad = pc.sum(batch.column(width + 1)).as_py() or 0
            if bad:
                seen["bad"] += bad
                return  # nothing of the batch is committed: write no more
            seen["changed"] += batch.num_rows
            if seen["changed"] <= max_keys:
                seen["keys"].append(batch.select(list(key_positions)))
            kept = batch.filter(pc.not_equal(batch.column(width), DELETE_OP))
            if kept.num_rows:
                yield kept.select(list(range(width)))

    for chunk in _chunks(upserted(), arrow_schema, _chunk_bytes(metadata)):
        for data_file in _dataframe_to_data_files(metadata, chunk, io, write_uuid, counter):
            yield _result_row(data_file=_encode_data_file(data_file))
    keys = None
    if seen["keys"] and not seen["bad"] and seen["changed"] <= max_keys:
        keys = _to_ipc(pa.Table.from_batches(seen["keys"]))
    yield _result_row(keys=keys, changed=seen["changed"], bad=seen["bad"])


def _result_row(
    data_file: bytes | None = None, keys: bytes | None = None, changed: int = 0, bad: int = 0
) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([data_file], pa.binary()),
            pa.array([keys], pa.binary()),
            pa.array([changed], pa.int64()),
            pa.array([bad], pa.int64()),
        ],
        schema=_RESULT_SCHEMA,
    )


def _to_ipc(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return bytes(sink.getvalue().to_pybytes())


def _from_ipc(blob: Any) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(bytes(blob))).read_all()
