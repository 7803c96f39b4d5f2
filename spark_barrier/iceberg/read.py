"""Reading planned data files with Spark, on the executors.

The driver plans file paths; executors read the rows. Spark's native Parquet reader
reads every file whose URI scheme Spark's Hadoop has a FileSystem for (local files,
``hdfs://``, ``s3a://`` with hadoop-aws...). Files it cannot open, such as ``s3://``
without hadoop-aws (no Maven jars needed here), are read on the executors by Python
workers through the table's pyiceberg FileIO (endpoint and credentials from the
catalog's properties), with the same schema and column matching by name.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pyarrow as pa
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_barrier.iceberg.filters import RowFilter, spark_condition
from spark_barrier.iceberg.scan import appended_file_paths, data_file_paths
from spark_barrier.iceberg.schemas import iceberg_schema_to_spark, spark_schema_to_arrow
from spark_barrier.jvm import empty_frame, hadoop_reads_scheme, read_parquet

log = logging.getLogger(__name__)


def read_snapshot(
    spark: SparkSession, table: Table, snapshot_id: int | None, row_filter: RowFilter | None = None
) -> DataFrame:
    """The table as of `snapshot_id`, read by Spark from the snapshot's data files.

    None, or a table without snapshots, gives an empty DataFrame with the table's
    schema. The driver only plans file paths; rows are read by the executors.
    `row_filter` (a pyiceberg expression or its string form, e.g. `"region = 'eu'"`)
    skips the files whose partition values or statistics rule it out, and the rows of
    the other files that do not match it.
    """
    if snapshot_id is None:
        return read_files(spark, table, [])
    rows = read_files(spark, table, data_file_paths(table, snapshot_id, row_filter))
    return rows if row_filter is None else rows.where(spark_condition(row_filter, table.schema()))


def read_appended(
    spark: SparkSession, table: Table, after_snapshot_id: int | None, upto_snapshot_id: int | None
) -> DataFrame:
    """Rows added by the snapshots in `(after, upto]` of an append-only table.

    Reads the files :func:`appended_file_paths` lists. An empty range (`upto` None or
    equal to `after`) gives an empty DataFrame.
    """
    return read_files(spark, table, appended_file_paths(table, after_snapshot_id, upto_snapshot_id))


def read_files(
    spark: SparkSession, table: Table, paths: Sequence[str], file_uri_column: str | None = None
) -> DataFrame:
    """The rows of `table`'s data files `paths`, read on the executors, with the
    table's schema (columns matched by name; a column a file lacks reads as null).

    Spark reads natively the files its Hadoop can open; the others go through Python
    workers and the table's FileIO (see the module docstring). `file_uri_column`
    adds a column naming each row's file as Spark's `_metadata.file_path` does (a
    percent-encoded URI: key it with `files.spark_path_key`), whichever reader read it.
    """
    # An explicit schema: no footer inference on the driver, stable types across
    # files, and the right columns for an empty read.
    schema = iceberg_schema_to_spark(table.schema())
    if not paths:
        if file_uri_column is not None:
            schema = schema.add(file_uri_column, T.StringType())
        return empty_frame(spark, schema)
    opens = {scheme: spark_opens(spark, f"{scheme}://") for scheme in {_scheme(p) for p in paths}}
    foreign = [p for p in paths if not opens[_scheme(p)]]
    elsewhere = set(foreign)
    native = [p for p in paths if p not in elsewhere]
    parts = []
    if native:
        rows = read_parquet(spark, schema, native)
        if file_uri_column is not None:
            rows = rows.withColumn(file_uri_column, F.col("_metadata.file_path"))
        parts.append(rows)
    if foreign:
        parts.append(_read_with_file_io(spark, table, foreign, schema, file_uri_column))
    return functools.reduce(DataFrame.unionByName, parts)


# Scheme -> whether Spark's Hadoop reads it, per Spark application: asked once each.
_hadoop_schemes: dict[tuple[str, str], bool] = {}
_hadoop_lock = threading.Lock()


def _scheme(path: str) -> str:
    return urlsplit(path).scheme.lower() if "://" in path else "file"


def spark_opens(spark: SparkSession, path: str) -> bool:
    """Whether Spark's own Parquet reader and writer can open `path` (its Hadoop has a
    FileSystem for the scheme); asked of the JVM once per scheme and application."""
    scheme = _scheme(path)
    key = (spark.sparkContext.applicationId, scheme)
    with _hadoop_lock:
        known = _hadoop_schemes.get(key)
    if known is None:
        known = hadoop_reads_scheme(spark, scheme)
        with _hadoop_lock:
            first = key not in _hadoop_schemes
            _hadoop_schemes[key] = known
        if first and not known:
            log.warning(
                "Spark's Hadoop has no FileSystem for %s:// files: their rows are read and "
                "written by Python workers through pyiceberg's FileIO, which is slower than "
                "Spark's Parquet reader and writer. To have Spark do it, add hadoop-aws (and its "
                "AWS SDK) to the Spark classpath and set spark.hadoop.fs.%s.impl="
                "org.apache.hadoop.fs.s3a.S3AFileSystem with the endpoint and credentials "
                "in spark.hadoop.fs.s3a.*",
                scheme,
                scheme,
            )
    return known


# Python tasks per file read through the FileIO, at most this many per core: each
# task reads its share of the files one after the other.
_TASKS_PER_CORE = 4


def _read_with_file_io(
    spark: SparkSession,
    table: Table,
    paths: Sequence[str],
    schema: T.StructType,
    file_uri_column: str | None = None,
) -> DataFrame:
    """`paths` read by Python workers: task `i` reads every file whose index is `i`
    modulo the number of tasks, through a FileIO built from the table's properties."""
    files = list(paths)
    properties = dict(table.io.properties)  # the catalog's, with the S3 endpoint and keys
    location = table.location()
    arrow_schema = spark_schema_to_arrow(schema)
    tasks = min(len(files), _TASKS_PER_CORE * spark.sparkContext.defaultParallelism)
    out_schema = schema if file_uri_column is None else schema.add(file_uri_column, T.StringType())

    def read(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyiceberg.io import load_file_io

        io = load_file_io(properties, location)
        for batch in ids:
            for index in batch.column(0).to_pylist():
                for rows in _file_batches(io, files[index], arrow_schema):
                    if file_uri_column is not None:
                        uri = pa.array([spark_style_uri(files[index])] * rows.num_rows, pa.string())
                        rows = rows.append_column(file_uri_column, uri)
                    yield rows

    return spark.range(len(files), numPartitions=tasks).mapInArrow(read, out_schema)


def spark_style_uri(path: str) -> str:
    """`path` (as Iceberg metadata spells it: literal characters) as Spark reports a
    file in `_metadata.file_path`: its path percent-encoded."""
    parsed = urlsplit(path)
    return urlunsplit((parsed.scheme or "file", parsed.netloc, quote(parsed.path), "", ""))


def _file_batches(io: Any, path: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The record batches of Parquet file `path` conformed to `schema`: columns by
    name, in its order, cast to its types; a column the file lacks is null."""
    import pyarrow.parquet as pq

    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        present = set(parquet.schema_arrow.names)
        wanted = [name for name in schema.names if name in present]
        for batch in parquet.iter_batches(columns=wanted):
            yield pa.RecordBatch.from_arrays(
                [
                    batch.column(field.name).cast(field.type)
                    if field.name in present
                    else pa.nulls(batch.num_rows, field.type)
                    for field in schema
                ],
                schema=schema,
            )
