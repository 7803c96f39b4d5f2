"""Data files written by Spark's own Parquet writer: the fast path of `write_data_files`.

Spark writes Parquet on the executors without a Python worker, and writes each
column's Iceberg field id into the file when the column carries it as
``parquet.field.id`` metadata (``spark.sql.parquet.fieldId.write.enabled``, on by
default). The driver then lists the folder and reads each file's footer for the
statistics Iceberg keeps (pyiceberg's ``parquet_file_to_data_file``, which also checks
the file's schema against the table's). Rows never reach the driver.

A partitioned table's transforms are computed by Spark expressions into hidden columns
that Spark's `partitionBy` turns into folders, so each file holds one partition; the
file's partition values are inferred from its statistics (pyiceberg does it) and checked
against the folder's. The transforms done so are the order-preserving ones on numbers,
dates and timestamps with a time zone: identity of int, long and date, truncate of int
and long, year, month, day and hour.

Which tables it serves is the table property `spark-barrier.write.native`:

- `auto` (the default, also when unset): a batch expected to be large, of a table in a
  local folder. Spark's file commit protocol costs more than the Python round trip
  saves on small batches and less on large ones (`bench/bench_writer.py`), so the
  batch's expected rows (the caller's estimate: a sink's previous batch, the rows of
  the files an upsert rewrites) must reach `spark-barrier.write.native.min-rows`
  (default 300,000 for an unpartitioned table, 1,000,000 for a partitioned one, where
  Spark also sorts by partition); an unknown size is taken as small. Other file
  systems need `true`: there, Spark's Hadoop writes with its own settings, which the
  table's FileIO (which lists the written files) may not share.
- `true`: every batch; `false`: none.

Either way, only tables whose files Spark writes exactly as Iceberg expects them: every
required column one Spark's plan knows holds no null (so that Spark writes it REQUIRED;
a CDC table's keys are required, and a feed read from Kafka or files has nullable
columns, so its batches go to the Python workers), every column of a primitive type whose
Parquet encoding is the one the Iceberg spec names (decimals as INT32, INT64 or fixed
by precision, as Spark writes them; nested types need field ids Spark cannot set on
list elements and map entries), timestamps as INT64 micros, partitions as above, a
folder Spark's Hadoop can open. The other tables are written by pyiceberg's writer in
Python workers (`files.write_data_files`): bucket (Iceberg's murmur3 is not Spark's
hash) and string partitions among them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import MetricModeTypes, compute_statistics_plan, parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyiceberg.utils.properties import property_as_int
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_barrier.iceberg.read import spark_opens
from spark_barrier.iceberg.schemas import iceberg_schema_to_spark
from spark_barrier.spark_session import PARQUET_TIMESTAMP_TYPE, PARQUET_TIMESTAMP_TYPE_KEY

log = logging.getLogger(__name__)

# The table property that chooses Spark's writer for a table: auto (the default), true
# or false. Spark's file commit protocol costs more than it saves on small batches
# (measured by bench/bench_writer.py: slower at 500 and 100,000 rows, faster at
# 1,000,000), so `auto` asks for a large batch, of at least the min-rows property.
NATIVE_WRITER_PROPERTY = "spark-barrier.write.native"
NATIVE_MIN_ROWS_PROPERTY = "spark-barrier.write.native.min-rows"
_MODES = ("auto", "true", "false")
# Where Spark's writer pays, by bench_writer (2 cores, local[2]): unpartitioned 1.07 of
# the Python workers' time at 200,000 rows and 0.68 at 1,000,000 (even near 250,000); by
# day 1.57 and 0.76.
DEFAULT_MIN_ROWS = 300_000
DEFAULT_MIN_ROWS_PARTITIONED = 1_000_000
# File systems where `auto` may choose Spark's writer: the ones Spark's Hadoop and the
# table's FileIO both open by the path alone, with no settings of their own.
_AUTO_SCHEMES = ("file",)
# Hadoop settings of the write: the v2 commit algorithm moves each task's files once (v1
# moves them again at job commit), and no _SUCCESS marker (the snapshot is the marker).
_COMMITTER_OPTIONS = {
    "mapreduce.fileoutputcommitter.algorithm.version": "2",
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}
FIELD_ID_KEY = "parquet.field.id"  # the column metadata Spark's writer turns into field ids
FIELD_ID_WRITE_KEY = "spark.sql.parquet.fieldId.write.enabled"
_NATIVE_TYPES = (
    BooleanType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    StringType,
    BinaryType,
    DateType,
    DecimalType,
    TimestampType,
    TimestamptzType,
)
_TIMESTAMP_TYPES = (TimestampType, TimestamptzType)
_FOOTER_READERS = 8
_HIDDEN = "_iceberg_partition_{}"  # the hidden columns (and folders) of partition values
_NULL_FOLDER_VALUE = "__HIVE_DEFAULT_PARTITION__"  # Spark's folder for a null value
_MICROS_PER_DAY = 86_400_000_000
_MICROS_PER_HOUR = 3_600_000_000
_EPOCH_YEAR = 1970


def why_not_native(
    df: DataFrame, folder: str, table: Table, expected_rows: int | None = None
) -> str | None:
    """Why Spark's writer does not write `table`'s files into `folder`, or None if it
    does. `expected_rows`: the caller's estimate of the batch's rows (None: unknown),
    which decides under the table property's `auto`."""
    mode = table.properties.get(NATIVE_WRITER_PROPERTY, "auto").strip().lower()
    if mode not in _MODES:
        return f"the table property {NATIVE_WRITER_PROPERTY} is {mode!r}, not auto, true or false"
    if mode == "false":
        return f"the table property {NATIVE_WRITER_PROPERTY} is false"
    if mode == "auto":
        small = _small(folder, table, expected_rows)
        if small is not None:
            return small
    fields = table.schema().fields
    if any(not isinstance(f.field_type, _NATIVE_TYPES) for f in fields):
        return "the table has fixed, uuid, time or nested columns"
    if table.properties.get(TableProperties.WRITE_FILE_FORMAT, "parquet").lower() != "parquet":
        return "the table's file format is not Parquet"
    partitions = _partition_values(table)
    if isinstance(partitions, str):
        return partitions
    spark = df.sparkSession
    if str(spark.conf.get(FIELD_ID_WRITE_KEY, "true")).lower() != "true":
        return f"{FIELD_ID_WRITE_KEY} is off"
    has_timestamps = any(isinstance(f.field_type, _TIMESTAMP_TYPES) for f in fields)
    timestamp_type = spark.conf.get(PARQUET_TIMESTAMP_TYPE_KEY, "INT96")
    if has_timestamps and timestamp_type != PARQUET_TIMESTAMP_TYPE:
        return f"{PARQUET_TIMESTAMP_TYPE_KEY} is {timestamp_type}, not {PARQUET_TIMESTAMP_TYPE}"
    if any(f.required for f in fields):
        # Spark writes a column REQUIRED in Parquet when its plan promises no null (a
        # non-null source column), else OPTIONAL, which a required Iceberg column does
        # not take. (A filter on IS NOT NULL does not make the plan's column non-null.)
        typed = df.select(*_typed_columns(df, table.schema())).schema.fields
        maybe_null = [
            f.name for f, t in zip(fields, typed, strict=True) if f.required and t.nullable
        ]
        if maybe_null:
            return f"required columns {maybe_null} are not known to Spark to hold no null"
    if not spark_opens(spark, folder):
        return "Spark's Hadoop has no FileSystem for the warehouse"
    return None


def _small(folder: str, table: Table, expected_rows: int | None) -> str | None:
    """Why `auto` leaves the batch to the Python workers, or None."""
    scheme = urlparse(folder).scheme or "file"
    if scheme not in _AUTO_SCHEMES:
        return (
            f"the table is on {scheme}://, where Spark's writer is used only when the table "
            f"property {NATIVE_WRITER_PROPERTY} is true"
        )
    least = min_rows(table)
    if expected_rows is None:
        return "the batch's size is not known"
    if expected_rows < least:
        return (
            f"the batch is small ({expected_rows:,} rows expected, Spark's writer from {least:,})"
        )
    return None


def min_rows(table: Table) -> int:
    """The expected rows from which `auto` has Spark write the table's batches."""
    default = DEFAULT_MIN_ROWS_PARTITIONED if table.spec().fields else DEFAULT_MIN_ROWS
    value = property_as_int(table.properties, NATIVE_MIN_ROWS_PROPERTY, default)
    return default if value is None or value < 0 else value


def write_natively(
    df: DataFrame, folder: str, table: Table, fs: pafs.FileSystem, fs_path: str
) -> list[DataFile]:
    """Write `df` (the table's columns, in table order) into the new `folder` with
    Spark's Parquet writer, and describe the written files; empty files are removed.
    `fs` and `fs_path` name `folder` for pyarrow (the table's FileIO file system).
    Call it only when :func:`why_not_native` says None."""
    partitions = _partition_values(table)
    assert not isinstance(partitions, str), partitions
    # Partition transforms read the columns as the table types them.
    typed = df.select(*_typed_columns(df, table.schema()))
    hidden = [value(typed).alias(_HIDDEN.format(i)) for i, value in enumerate(partitions)]
    codec = table.properties.get(TableProperties.PARQUET_COMPRESSION, "zstd")
    writer = typed.select("*", *hidden).write.mode("errorifexists")
    if hidden:
        writer = writer.partitionBy(*(_HIDDEN.format(i) for i in range(len(hidden))))
    writer.options(**_COMMITTER_OPTIONS).option("compression", codec).parquet(folder)
    return _describe(folder, table, fs, fs_path)


def _typed_columns(df: DataFrame, schema: Schema) -> list[Column]:
    """The batch's columns (by position) cast to the table's types, with their field ids."""
    spark_fields = iceberg_schema_to_spark(schema).fields
    return [
        df[i].cast(field.dataType).alias(field.name, metadata={FIELD_ID_KEY: iceberg.field_id})
        for i, (field, iceberg) in enumerate(zip(spark_fields, schema.fields, strict=True))
    ]


# --------------------------------------------------------------------------- partitions

# One partition field's value of each row, as a Spark expression over the typed batch.
_SparkTransform = Callable[[DataFrame], Column]
_TIME_TRANSFORMS = (YearTransform, MonthTransform, DayTransform, HourTransform)


def _partition_values(table: Table) -> list[_SparkTransform] | str:
    """Spark expressions of the table's partition values, or why there are none."""
    schema = table.schema()
    values: list[_SparkTransform] = []
    metrics = compute_statistics_plan(schema, table.properties)
    for field in table.spec().fields:
        source = schema.find_field(field.source_id)
        position = [f.field_id for f in schema.fields].index(field.source_id)
        value = _in_spark(field, position, source.field_type)
        if value is None:
            return f"its partition field {field.name} is computed by pyiceberg ({field.transform})"
        collector = metrics.get(field.source_id)
        if collector is None or collector.mode.type in (
            MetricModeTypes.NONE,
            MetricModeTypes.COUNTS,
        ):
            # A file's partition is read back from its bounds: they must be kept.
            return f"column {source.name} has no bounds in its metrics mode"
        if _HIDDEN.format(len(values)) in {f.name for f in schema.fields}:
            return f"a column is named {_HIDDEN.format(len(values))}"
        values.append(value)
    return values


def _in_spark(field: PartitionField, column: int, kind: IcebergType) -> _SparkTransform | None:
    """The transform of the batch's column at position `column` (by position: a name may
    hold dots), or None when Spark cannot compute it as Iceberg does."""
    transform = field.transform
    numbers = isinstance(kind, (IntegerType, LongType))
    if isinstance(transform, IdentityTransform) and numbers:
        return lambda df: df[column]
    if isinstance(transform, IdentityTransform) and isinstance(kind, DateType):
        return lambda df: F.unix_date(df[column])
    if isinstance(transform, TruncateTransform) and numbers:
        width = F.lit(transform.width)
        return lambda df: df[column] - F.pmod(df[column], width)
    if isinstance(transform, _TIME_TRANSFORMS):
        return _time_transform(transform, column, kind)
    return None


def _time_transform(transform: Any, column: int, kind: IcebergType) -> _SparkTransform | None:
    """Year, month, day or hour since the epoch, in UTC, as Iceberg counts them."""

    def micros(df: DataFrame) -> Column:
        if isinstance(kind, DateType):
            return F.unix_date(df[column]).cast("long") * _MICROS_PER_DAY
        return F.unix_micros(df[column])

    def day(df: DataFrame) -> Column:  # the UTC date
        return F.date_from_unix_date(_floor_div(micros(df), _MICROS_PER_DAY))

    if not isinstance(kind, (TimestamptzType, DateType)):
        return None  # a timestamp without zone: Spark's date functions would apply one
    if isinstance(transform, HourTransform):
        return (
            None
            if isinstance(kind, DateType)
            else lambda df: _floor_div(micros(df), _MICROS_PER_HOUR)
        )
    if isinstance(transform, DayTransform):
        return lambda df: _floor_div(micros(df), _MICROS_PER_DAY)
    if isinstance(transform, YearTransform):
        return lambda df: F.year(day(df)) - _EPOCH_YEAR
    return lambda df: (F.year(day(df)) - _EPOCH_YEAR) * 12 + F.month(day(df)) - 1


def _floor_div(value: Column, divisor: int) -> Column:
    """Integer division rounding down, as Iceberg's time transforms count before 1970 too:
    the dividend less its remainder is a multiple of `divisor`, which Spark's integral
    `div` (rounding towards zero) divides exactly, in longs."""
    exact = value - F.pmod(value, F.lit(divisor))
    return F.call_function("div", exact, F.lit(divisor)).cast("int")


# --------------------------------------------------------------------------- the files


def _describe(folder: str, table: Table, fs: pafs.FileSystem, path: str) -> list[DataFile]:
    """A DataFile per non-empty Parquet file under `folder`; Spark's other files (the
    `_SUCCESS` marker, local checksums) and empty data files are deleted."""
    found = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    names = [i.path[len(path) + 1 :] for i in found if i.type == pafs.FileType.File]
    data = sorted(n for n in names if _is_data_file(n))
    for name in set(names) - set(data):
        fs.delete_file(f"{path}/{name}")
    with ThreadPoolExecutor(min(_FOOTER_READERS, max(1, len(data)))) as pool:
        described = list(
            pool.map(
                lambda name: parquet_file_to_data_file(
                    table.io, table.metadata, f"{folder}/{name}"
                ),
                data,
            )
        )
    files = []
    for name, data_file in zip(data, described, strict=True):
        if data_file.record_count == 0:  # Spark writes one for an empty DataFrame
            fs.delete_file(f"{path}/{name}")
            continue
        _check_partition(name, data_file, table.schema())
        files.append(data_file)
    return files


def _is_data_file(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith(".parquet") and not base.startswith((".", "_"))


def _check_partition(name: str, data_file: DataFile, schema: Schema) -> None:
    """The partition pyiceberg inferred from the file's bounds is the one Spark's folders
    name: the transforms computed in Spark agree with Iceberg's, row by row."""
    folders = dict(part.split("=", 1) for part in name.split("/")[:-1])
    expected = [
        None if value == _NULL_FOLDER_VALUE else int(value)
        for _, value in sorted(folders.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))
    ]
    inferred = [data_file.partition[i] for i in range(len(expected))]
    if inferred != expected:
        raise RuntimeError(
            f"{name}: Spark computed the partition {expected}, its rows' bounds give "
            f"{inferred} (schema {schema}); this is a bug in spark_barrier's transforms"
        )
