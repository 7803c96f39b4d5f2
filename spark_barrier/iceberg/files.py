"""Data files: written by the executors, and cleaned up.

Where Spark's own Parquet writer writes the table's files as Iceberg expects them
(tables of primitive columns, unpartitioned or partitioned by transforms Spark computes
as Iceberg does, on a file system Spark's Hadoop opens) and pays (a large batch, or a
table that asks for it: see `native_write`), it does. Otherwise each Spark task turns its rows into Arrow batches (`mapInArrow`), computes the
table's partition transforms and writes Parquet with pyiceberg's own writer
(`_dataframe_to_data_files`: the transforms and partition values Iceberg readers
expect; bucket is Iceberg's murmur3 through `pyiceberg-core`), through a FileIO
rebuilt from the table's properties, so a local folder and an object store are
written alike and nothing assumes the driver's file system. What comes back to the
driver is one small serialized `DataFile` per file (path, partition, statistics).

A batch known to be small (its table's previous batch wrote at most
`spark-barrier.write.driver.max-rows` rows, default 10,000) is instead collected by the
driver as Arrow, in one Spark job without a Python worker, and the same task runs once
on the driver over it (:func:`run_write_task`). A task on a Python worker costs the
batch its fixed round trip (the worker, the function's pickle, the Arrow stream both
ways): with the few hundred rows a streaming batch usually holds, 2-3 times the whole
write (`bench/README.md`). At most the limit's rows ever reach the driver: a batch
found larger is written by the executors after all.
"""

from __future__ import annotations

import functools
import itertools
import logging
import pickle
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import PyArrowFileIO, _dataframe_to_data_files, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.utils.properties import property_as_int
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from spark_barrier.iceberg.native_write import why_not_native, write_natively
from spark_barrier.log import LogTarget

log = logging.getLogger(__name__)

# The one column each write task returns: a pickled DataFile per written file.
_RESULT_SCHEMA = pa.schema([pa.field("data_file", pa.binary(), False)])
_RESULT_TYPE = T.StructType([T.StructField("data_file", T.BinaryType(), False)])

# The table property bounding the rows of a batch the driver writes itself (0: never);
# see run_write_task.
DRIVER_WRITE_MAX_ROWS_PROPERTY = "spark-barrier.write.driver.max-rows"
# Where the driver pays on 2 cores (local[2], 3 columns): 50 rows 108 against 254 ms in
# Python workers, 10,000 rows 108 against 207 ms, 200,000 rows 316 against 278 ms.
# Kept low so that the rows the driver holds stay small whatever their width.
DEFAULT_DRIVER_WRITE_MAX_ROWS = 10_000

# A task writes its rows in chunks of at most this many Arrow bytes (or the table's
# `write.target-file-size-bytes`, if smaller): it bounds a Python worker's memory
# (pyiceberg writes from a materialized table and copies it once per partition)
# at the price of a file per chunk and partition.
_MAX_CHUNK_BYTES = 128 * 1024 * 1024


def selected(df: DataFrame, columns: list[str]) -> DataFrame:
    """``df.select(*columns)``, or ``df`` itself when it has those columns in that order
    (the usual case: ``df.columns`` is two Py4J calls, a select about three a column)."""
    return df if df.columns == columns else df.select(*columns)


def write_data_files(
    df: DataFrame,
    folder: str,
    table: Table,
    *,
    log_target: LogTarget | None = None,
    expected_rows: int | None = None,
) -> list[DataFile]:
    """Write `df` as data files of `table` under the new `folder` (executors, or the
    driver for a small batch), and describe them.

    Columns are matched to the table's by name, in table order; rows are cast to the
    table's Arrow types (Spark's session time zone on timestamps is only a label,
    bytes and shorts widen to int), timestamps are written as micros. Partitioned
    tables get one file per partition value (and chunk) of each task, carrying its
    partition values. Returns one DataFile per written file; no file is empty, and no
    more rows reach the driver than :func:`run_write_task` lets it write. With
    `log_target`, each task appends its rows to the table's log store before writing
    them (so pyiceberg's writer writes: Spark's has no such hook). `expected_rows`: the
    caller's estimate of the rows (None: unknown), by which the writer is chosen (see
    :func:`~spark_barrier.iceberg.native_write.why_not_native` and :func:`run_write_task`).
    """
    rows = selected(df, column_names(table))
    reason = (
        "the table has a log store"
        if log_target
        else why_not_native(rows, folder, table, expected_rows)
    )
    if reason is None:
        files = write_natively(rows, folder, table, *_file_system(folder, table.io))
    else:
        log.debug("%s: files written by pyiceberg's writer (%s)", _name(table), reason)
        files = _write_with_pyiceberg(rows, folder, table, log_target, expected_rows)
    return _of_default_spec(files, table)


def _write_with_pyiceberg(
    rows: DataFrame,
    folder: str,
    table: Table,
    log_target: LogTarget | None,
    expected_rows: int | None,
) -> list[DataFile]:
    write = functools.partial(
        _write_task,
        metadata_json=_writer_metadata(table, folder),
        io_properties=dict(table.io.properties),
        arrow_schema=schema_to_pyarrow(table.schema(), include_field_ids=False),
        log_target=log_target,
    )
    written = run_write_task(rows, write, _RESULT_TYPE, table, expected_rows)
    return [_decode_data_file(row["data_file"]) for row in written]


def run_write_task(
    rows: DataFrame,
    task: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    result_type: T.StructType,
    table: Table,
    expected_rows: int | None,
) -> list[Mapping[str, Any]]:
    """The rows `task` yields over the batch `rows`, whose size the caller expects to
    be `expected_rows` (None: unknown): ``rows.mapInArrow(task, result_type).collect()``,
    a task per partition in Python workers; or, when the batch is expected to hold at
    most the table's `spark-barrier.write.driver.max-rows` and does, one task on the
    driver over the batch collected as Arrow. The task must give the same answer
    however the rows are split between tasks (a write task does: a file per chunk)."""
    limit = driver_write_max_rows(table)
    if limit > 0 and expected_rows is not None and expected_rows <= limit:
        # The limit bounds what reaches the driver if the guess was wrong; Spark
        # stops reading once it has that many rows, where the plan lets it.
        collected = rows.limit(limit + 1).toArrow()
        if collected.num_rows <= limit:
            log.debug("%s: %d rows written by the driver", _name(table), collected.num_rows)
            return [row for out in task(iter(collected.to_batches())) for row in out.to_pylist()]
        log.info(
            "%s: a batch of more than %d rows (expected %d): written by the executors",
            _name(table), limit, expected_rows,
        )  # fmt: skip
    return [row.asDict() for row in rows.mapInArrow(task, result_type).collect()]


def _name(table: Table) -> str:
    return ".".join(table.name())


def driver_write_max_rows(table: Table) -> int:
    """The most rows of a batch the driver writes itself (the table property
    `spark-barrier.write.driver.max-rows`; 0 turns it off)."""
    value = property_as_int(
        table.properties, DRIVER_WRITE_MAX_ROWS_PROPERTY, DEFAULT_DRIVER_WRITE_MAX_ROWS
    )
    return max(0, value if value is not None else DEFAULT_DRIVER_WRITE_MAX_ROWS)


def _of_default_spec(files: list[DataFile], table: Table) -> list[DataFile]:
    for data_file in files:
        # Written with the table's default spec; the spec id is not part of the file's
        # own record (nor of its pickle, nor set by DataFile.from_args), and pyiceberg's
        # readers look it up.
        data_file.spec_id = table.metadata.default_spec_id
    return files


def write_arrow_files(rows: pa.Table, folder: str, table: Table) -> list[DataFile]:
    """Write a few rows already on the driver as data files of `table` under the new
    `folder`, as the executors' tasks of :func:`write_data_files` would (no Spark job:
    for the small rewrites of an upsert, see ``upsert``)."""
    if rows.num_rows == 0:
        return []
    arrow_schema = schema_to_pyarrow(table.schema(), include_field_ids=False)
    conformed = _conform(rows.select(column_names(table)).to_batches(), arrow_schema)
    metadata = TableMetadataUtil.parse_raw(_writer_metadata(table, folder))
    files = _dataframe_to_data_files(metadata, conformed, table.io, uuid.uuid4(), itertools.count())
    return _of_default_spec(list(files), table)


def _writer_metadata(table: Table, folder: str) -> str:
    """The table metadata the executors write with, serialized once on the driver.

    `write.data.path` points pyiceberg's location provider at `folder`, so every file
    lands under it (a failed commit deletes the folder). The snapshot history is left
    out: writers need the schema, spec and properties, and a long-lived table's
    history would be shipped with every task.
    """
    properties = {**table.metadata.properties, TableProperties.WRITE_DATA_PATH: folder}
    probe = load_location_provider(table.location(), properties).new_data_location("probe")
    if not probe.startswith(f"{folder}/"):
        raise ValueError(
            f"table {table.name()}'s location provider writes outside the batch folder "
            f"({probe!r} for {folder!r}); a failed commit could not clean such files up. "
            f"Unset the table property {TableProperties.WRITE_PY_LOCATION_PROVIDER_IMPL}"
        )
    metadata = table.metadata.model_copy(
        update={
            "properties": properties,
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "statistics": [],
            "partition_statistics": [],
        }
    )
    return metadata.model_dump_json()


def _write_task(
    batches: Iterator[pa.RecordBatch],
    *,
    metadata_json: str,
    io_properties: dict[str, str],
    arrow_schema: pa.Schema,
    log_target: LogTarget | None = None,
) -> Iterator[pa.RecordBatch]:
    """One Spark task's part of `write_data_files` (runs on an executor, or on the
    driver over a whole small batch)."""
    metadata = TableMetadataUtil.parse_raw(metadata_json)
    io = load_file_io(io_properties, metadata.location)
    write_uuid, counter = uuid.uuid4(), itertools.count()
    for chunk in _chunks(batches, arrow_schema, _chunk_bytes(metadata)):
        if log_target is not None:
            log_target.append(chunk)  # readers of the log see the rows before the commit
        files = _dataframe_to_data_files(metadata, chunk, io, write_uuid, counter)
        encoded = [_encode_data_file(f) for f in files]
        yield pa.RecordBatch.from_arrays([pa.array(encoded, pa.binary())], schema=_RESULT_SCHEMA)


def _chunk_bytes(metadata: TableMetadata) -> int:
    target = property_as_int(
        metadata.properties,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
    )
    return min(target or _MAX_CHUNK_BYTES, _MAX_CHUNK_BYTES)


def _chunks(
    batches: Iterator[pa.RecordBatch], schema: pa.Schema, max_bytes: int
) -> Iterator[pa.Table]:
    """Non-empty tables of consecutive batches, renamed and cast to the table's `schema`."""
    buffer: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        buffer.append(batch)
        size += batch.nbytes
        if size >= max_bytes:
            yield _conform(buffer, schema)
            buffer, size = [], 0
    if buffer:
        yield _conform(buffer, schema)


def _conform(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    # Columns arrive in table order (write_data_files selects them so); Spark may spell
    # a name in another case, so names are taken by position. The cast is safe: a
    # value that does not fit the table's type fails the task instead of changing.
    return pa.Table.from_batches(batches).rename_columns(schema.names).cast(schema)


def _encode_data_file(data_file: DataFile) -> bytes:
    return pickle.dumps(data_file)


def _decode_data_file(blob: Any) -> DataFile:
    # Executors and driver run the same pyiceberg: the pickle is read by its writer's code.
    data_file = pickle.loads(bytes(blob))
    if not isinstance(data_file, DataFile):
        raise TypeError(f"a write task returned {type(data_file).__name__}, not a DataFile")
    return data_file


def delete_folder(folder: str, io: FileIO | None = None) -> None:
    """Best-effort removal of files no snapshot references.

    Through `io`'s file system when it is pyiceberg's pyarrow FileIO (the table's: an
    object store's endpoint and credentials are in its properties), else pyarrow's
    default one for the URI (which knows no custom endpoint)."""
    try:
        fs, path = _file_system(folder, io)
        fs.delete_dir(path)
    except FileNotFoundError:
        pass  # no file was written into it: nothing to remove
    except (OSError, pa.ArrowException) as exc:
        log.warning("could not delete %s: %s", folder, exc)


def _file_system(folder: str, io: FileIO | None) -> tuple[pafs.FileSystem, str]:
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = io.parse_location(folder, io.properties)
        return io.fs_by_scheme(scheme, netloc), path
    fs, path = pafs.FileSystem.from_uri(folder)
    return fs, str(path)


def path_key(path: str) -> tuple[str, str, str]:
    """A data file's identity regardless of URI spelling (`file:/x`, `file:///x`, `/x`).

    For paths as Iceberg metadata holds them, whose characters are literal: pyiceberg's
    FileIO does not percent-decode, so the folder of partition value `x/y`, `x%2Fy`, is
    named so on storage. Spark reports files as URIs: key those with `spark_path_key`.
    """
    parsed = urlparse(path)
    return (parsed.scheme or "file", parsed.netloc, parsed.path)


def spark_path_key(uri: str) -> tuple[str, str, str]:
    """:func:`path_key` of a file as Spark reports it (`_metadata.file_path`: percent-encoded)."""
    parsed = urlparse(uri)
    return (parsed.scheme or "file", parsed.netloc, unquote(parsed.path))


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def column_names(table: Table) -> list[str]:
    return [f.name for f in table.schema().fields]
