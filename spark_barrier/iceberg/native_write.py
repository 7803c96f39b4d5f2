"""Data files written by Spark's own Parquet writer: the fast path of `write_data_files`.

Spark writes Parquet on the executors without a Python worker, and writes each
column's Iceberg field id into the file when the column carries it as
``parquet.field.id`` metadata (``spark.sql.parquet.fieldId.write.enabled``, on by
default). The driver then lists the folder and reads each file's footer for the
statistics Iceberg keeps (pyiceberg's ``parquet_file_to_data_file``, which also checks
the file's schema against the table's). Rows never reach the driver.

It serves the tables whose files Spark writes exactly as Iceberg expects them:
unpartitioned (Spark's own partitioned layout leaves the partition columns out of the
files and knows no Iceberg transform), every column optional (Spark does not promise
a non-null column), of a primitive type whose Parquet encoding is the one the Iceberg
spec names (decimals as INT32, INT64 or fixed by precision, as Spark writes them;
nested types need field ids Spark cannot set on list elements and map entries),
timestamps as INT64 micros, a folder Spark's Hadoop can open. The other tables are written by pyiceberg's
writer in Python workers (`files.write_data_files`).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import DataFrame

from spark_barrier.iceberg.read import spark_opens
from spark_barrier.iceberg.schemas import iceberg_schema_to_spark
from spark_barrier.spark_session import PARQUET_TIMESTAMP_TYPE, PARQUET_TIMESTAMP_TYPE_KEY

log = logging.getLogger(__name__)

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


def why_not_native(df: DataFrame, folder: str, table: Table) -> str | None:
    """Why Spark's writer cannot write `table`'s files into `folder`, or None if it can."""
    fields = table.schema().fields
    if not table.spec().is_unpartitioned():
        return "the table is partitioned"
    if any(f.required for f in fields):
        return "the table has required columns"
    if any(not isinstance(f.field_type, _NATIVE_TYPES) for f in fields):
        return "the table has fixed, uuid, time or nested columns"
    if table.properties.get(TableProperties.WRITE_FILE_FORMAT, "parquet").lower() != "parquet":
        return "the table's file format is not Parquet"
    spark = df.sparkSession
    if str(spark.conf.get(FIELD_ID_WRITE_KEY, "true")).lower() != "true":
        return f"{FIELD_ID_WRITE_KEY} is off"
    has_timestamps = any(isinstance(f.field_type, _TIMESTAMP_TYPES) for f in fields)
    timestamp_type = spark.conf.get(PARQUET_TIMESTAMP_TYPE_KEY, "INT96")
    if has_timestamps and timestamp_type != PARQUET_TIMESTAMP_TYPE:
        return f"{PARQUET_TIMESTAMP_TYPE_KEY} is {timestamp_type}, not {PARQUET_TIMESTAMP_TYPE}"
    if not spark_opens(spark, folder):
        return "Spark's Hadoop has no FileSystem for the warehouse"
    return None


def write_natively(
    df: DataFrame, folder: str, table: Table, fs: pafs.FileSystem, fs_path: str
) -> list[DataFile]:
    """Write `df` (the table's columns, in table order) into the new `folder` with
    Spark's Parquet writer, and describe the written files; empty files are removed.
    `fs` and `fs_path` name `folder` for pyarrow (the table's FileIO file system)."""
    spark_fields = iceberg_schema_to_spark(table.schema()).fields
    columns = [
        df[i].cast(field.dataType).alias(field.name, metadata={FIELD_ID_KEY: iceberg.field_id})
        for i, (field, iceberg) in enumerate(zip(spark_fields, table.schema().fields, strict=True))
    ]
    codec = table.properties.get(TableProperties.PARQUET_COMPRESSION, "zstd")
    df.select(*columns).write.mode("errorifexists").option("compression", codec).parquet(folder)
    return _describe(folder, table, fs, fs_path)


def _describe(folder: str, table: Table, fs: pafs.FileSystem, path: str) -> list[DataFile]:
    """A DataFile per non-empty Parquet file under `folder`; Spark's other files (the
    `_SUCCESS` marker, local checksums) and empty data files are deleted."""
    names = [info.base_name for info in fs.get_file_info(pafs.FileSelector(path))]
    data = sorted(n for n in names if n.endswith(".parquet") and not n.startswith((".", "_")))
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
        else:
            files.append(data_file)
    return files
