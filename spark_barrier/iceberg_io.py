"""Iceberg tables written by Spark executors and committed through pyiceberg.

No Spark Iceberg jars are involved: executors read and write plain Parquet, the
driver only ever handles file paths and Parquet footers, and pyiceberg owns the
Iceberg metadata (manifests, snapshots, catalog commits).

Every snapshot committed here is stamped with the summary properties
`metaservice.barrier`, `metaservice.job` and `metaservice.batch` (and, when the
Spark query is known, `metaservice.query`), which is what makes replays detectable
(exactly-once) and lets the MetaService rebuild its barrier-to-snapshot mapping
from the tables themselves.

A batch reaches a table at most once, whatever the retries: pyiceberg's own
commit retries are turned off on the tables committed to here (table property
`commit.retry.num-retries=0`; pyiceberg would otherwise re-apply a fast append on
top of another driver's commit of the same batch), and our retry loop checks for
the batch's snapshot before every attempt, on the metadata the attempt commits on.

Limitations, by design of this layer:
- Data files are matched to columns by name (Spark's Parquet reader); column
  renames are not supported, added columns read as null in older files.
- Files are committed to unpartitioned tables only (Spark writes no Iceberg
  partition values); `ensure_table` creates unpartitioned tables.
- Merge-on-read delete files are not supported (nothing here writes them); reading
  a snapshot that has them raises `NotImplementedError`.
"""

from __future__ import annotations

import logging
import random
import re
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    LessThanOrEqual,
)
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.snapshots import Operation, Snapshot, ancestors_of
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_barrier.faults import crash_point
from spark_barrier.spark_session import PARQUET_TIMESTAMP_TYPE, PARQUET_TIMESTAMP_TYPE_KEY

log = logging.getLogger(__name__)

SUMMARY_BARRIER = "metaservice.barrier"
SUMMARY_JOB = "metaservice.job"
SUMMARY_BATCH = "metaservice.batch"
SUMMARY_QUERY = "metaservice.query"

Mode = Literal["append", "upsert"]

DEFAULT_COMMIT_ATTEMPTS = 5
_BACKOFF_BASE_S = 0.1
_BACKOFF_MAX_S = 2.0
_FOOTER_READ_THREADS = 8
# pyiceberg guarantees a commit failing with these did not land (it cleans up its
# manifests), so the commit may be retried and files written for it deleted. A
# ValidationException is a conflicting concurrent change: an upsert re-plans.
_NOT_LANDED = (CommitFailedException, ValidationException)
# Operations that only add rows (or rewrite them without changing content): an
# incremental append read over them is exact.
_APPEND_ONLY_OPERATIONS = frozenset({Operation.APPEND, Operation.REPLACE})
# Key types whose file-level min/max statistics are safe to prune with (floats
# are left out: NaN bounds make range pruning unreliable).
_PRUNABLE_KEY_TYPES = (
    IntegerType,
    LongType,
    StringType,
    DateType,
    TimestampType,
    TimestamptzType,
    DecimalType,
)


class StampedSnapshot(NamedTuple):
    """A snapshot carrying the MetaService stamp in its summary."""

    snapshot_id: int
    barrier: int
    job: str
    batch: int
    query: str | None = None  # the Spark query that committed it (None: not stamped)


class NotAppendOnly(ValueError):
    """A range of a table holds snapshots that replace or delete rows: reading only the
    files they add would silently miss rows."""


# --------------------------------------------------------------------------- catalog


def open_catalog(uri: str, warehouse: str, name: str = "metaservice") -> Catalog:
    """Open a pyiceberg `SqlCatalog` (Iceberg JDBC-catalog layout) at a SQLAlchemy URL.

    `uri` is e.g. `sqlite:////var/lib/ms.db` or `postgresql+psycopg://user@host/db`;
    the catalog tables are created when missing. `warehouse` is the root folder for
    table data: a URI (`file:///...`, `s3://...`) or a local path, which is turned
    into a `file://` URI because Spark and pyiceberg must agree on file paths.
    """
    return SqlCatalog(name, uri=uri, warehouse=_as_uri(warehouse))


def ensure_table(
    catalog: Catalog, identifier: str, schema: pa.Schema | Schema | T.StructType
) -> Table:
    """Return table `identifier` (`ns.table`), creating its namespace and itself if missing.

    `schema` may be an Arrow schema, a pyiceberg schema or a Spark `StructType`
    (mapped with `spark_schema_to_arrow`). An existing table is returned as is; its
    schema is not evolved.
    """
    namespace = identifier.rsplit(".", 1)[0] if "." in identifier else None
    if namespace is None:
        raise ValueError(f"table identifier needs a namespace: {identifier!r}")
    catalog.create_namespace_if_not_exists(namespace)
    if isinstance(schema, T.StructType):
        schema = spark_schema_to_arrow(schema)
    return catalog.create_table_if_not_exists(
        identifier, schema=schema, properties={TableProperties.COMMIT_NUM_RETRIES: "0"}
    )


# --------------------------------------------------------------------------- schemas


def spark_schema_to_arrow(schema: T.StructType, *, keep_nullability: bool = False) -> pa.Schema:
    """Map a Spark schema to the Arrow schema of an Iceberg table Spark can write.

    Fields become nullable unless `keep_nullability`: Spark infers nullability per
    query (a literal is non-null, the same column from a join is nullable), and a
    required Iceberg column would reject later batches whose files say optional.
    Timestamps map to microsecond `timestamptz` (TimestampType) or `timestamp`
    (TimestampNTZType), matching what Spark writes with TIMESTAMP_MICROS.
    """
    return pa.schema(
        [
            pa.field(f.name, _spark_to_arrow_type(f.dataType), f.nullable or not keep_nullability)
            for f in schema.fields
        ]
    )


def _spark_to_arrow_type(dt: T.DataType) -> pa.DataType:
    simple: dict[type[T.DataType], pa.DataType] = {
        T.BooleanType: pa.bool_(),
        T.ByteType: pa.int32(),  # Iceberg has no 8/16-bit ints
        T.ShortType: pa.int32(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.StringType: pa.string(),
        T.BinaryType: pa.binary(),
        T.DateType: pa.date32(),
        T.TimestampType: pa.timestamp("us", tz="UTC"),
        T.TimestampNTZType: pa.timestamp("us"),
    }
    if type(dt) in simple:
        return simple[type(dt)]
    if isinstance(dt, T.DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    if isinstance(dt, T.ArrayType):
        return pa.list_(pa.field("element", _spark_to_arrow_type(dt.elementType), True))
    if isinstance(dt, T.MapType):
        return pa.map_(_spark_to_arrow_type(dt.keyType), _spark_to_arrow_type(dt.valueType))
    if isinstance(dt, T.StructType):
        return pa.struct(
            [pa.field(f.name, _spark_to_arrow_type(f.dataType), True) for f in dt.fields]
        )
    raise TypeError(f"Spark type {dt.simpleString()} has no Iceberg mapping")


def iceberg_schema_to_spark(schema: Schema) -> T.StructType:
    """Map an Iceberg schema to the Spark schema used to read the table's Parquet files."""
    return T.StructType([_iceberg_to_spark_field(f) for f in schema.fields])


def _iceberg_to_spark_field(field: NestedField) -> T.StructField:
    return T.StructField(field.name, _iceberg_to_spark_type(field.field_type), not field.required)


def _iceberg_to_spark_type(it: IcebergType) -> T.DataType:
    simple: dict[type[IcebergType], T.DataType] = {
        BooleanType: T.BooleanType(),
        IntegerType: T.IntegerType(),
        LongType: T.LongType(),
        FloatType: T.FloatType(),
        DoubleType: T.DoubleType(),
        StringType: T.StringType(),
        BinaryType: T.BinaryType(),
        FixedType: T.BinaryType(),
        DateType: T.DateType(),
        TimestamptzType: T.TimestampType(),
        TimestampType: T.TimestampNTZType(),
    }
    if type(it) in simple:
        return simple[type(it)]
    if isinstance(it, DecimalType):
        return T.DecimalType(it.precision, it.scale)
    if isinstance(it, ListType):
        return T.ArrayType(_iceberg_to_spark_type(it.element_type), not it.element_required)
    if isinstance(it, MapType):
        return T.MapType(
            _iceberg_to_spark_type(it.key_type),
            _iceberg_to_spark_type(it.value_type),
            not it.value_required,
        )
    if isinstance(it, StructType):
        return T.StructType([_iceberg_to_spark_field(f) for f in it.fields])
    raise TypeError(f"Iceberg type {it} has no Spark mapping")


# --------------------------------------------------------------------------- snapshots


def list_stamped_snapshots(table: Table) -> list[StampedSnapshot]:
    """Every snapshot of `table` (commit order) whose summary carries the MetaService stamp."""
    return [s for snap in table.snapshots() if (s := _stamp_of(snap)) is not None]


def find_batch_commit(
    table: Table, job: str, batch_id: int, query_id: str | None = None
) -> StampedSnapshot | None:
    """The snapshot already committed by `job` for `batch_id` (with its barrier), or None.

    Used to skip a replayed batch (exactly-once). With `query_id`, a snapshot stamped
    by another Spark query (a reset checkpoint restarts batch ids at 0) is not this
    batch; snapshots stamped without a query match on job and batch alone. The latest
    match wins; there is only one unless an external tool re-committed a batch.
    """
    for stamped in reversed(list_stamped_snapshots(table)):
        if stamped.job != job or stamped.batch != batch_id:
            continue
        if query_id is None or stamped.query is None or stamped.query == query_id:
            return stamped
    return None


def find_batch_snapshot(
    table: Table, job: str, batch_id: int, query_id: str | None = None
) -> int | None:
    """The id of :func:`find_batch_commit`'s snapshot, or None."""
    found = find_batch_commit(table, job, batch_id, query_id)
    return found.snapshot_id if found is not None else None


def snapshot_barrier(table: Table, snapshot_id: int) -> int | None:
    """The barrier stamped on snapshot `snapshot_id`, or None (unknown or unstamped)."""
    snap = table.snapshot_by_id(snapshot_id)
    raw = snap.summary.get(SUMMARY_BARRIER) if snap is not None and snap.summary else None
    return int(raw) if raw is not None else None


def _stamp_of(snap: Snapshot) -> StampedSnapshot | None:
    summary = snap.summary
    if summary is None:
        return None
    barrier, job, batch = (summary.get(k) for k in (SUMMARY_BARRIER, SUMMARY_JOB, SUMMARY_BATCH))
    if barrier is None or job is None or batch is None:
        return None
    return StampedSnapshot(
        snap.snapshot_id, int(barrier), job, int(batch), summary.get(SUMMARY_QUERY)
    )


def data_file_paths(table: Table, snapshot_id: int | None = None) -> list[str]:
    """Paths of the live data files of a snapshot (default: current); [] for no snapshot."""
    return [f.file_path for f in _data_files(table, snapshot_id)]


def _data_files(
    table: Table, snapshot_id: int | None, row_filter: BooleanExpression = AlwaysTrue()
) -> list[DataFile]:
    if snapshot_id is None:
        current = table.current_snapshot()
        if current is None:
            return []
        snapshot_id = current.snapshot_id
    elif table.snapshot_by_id(snapshot_id) is None:
        raise ValueError(f"snapshot {snapshot_id} not found in table {table.name()}")
    tasks = list(table.scan(snapshot_id=snapshot_id, row_filter=row_filter).plan_files())
    if any(t.delete_files for t in tasks):
        raise NotImplementedError("snapshots with merge-on-read delete files are not supported")
    return [t.file for t in tasks]


# --------------------------------------------------------------------------- reads


def read_snapshot(spark: SparkSession, table: Table, snapshot_id: int | None) -> DataFrame:
    """The table as of `snapshot_id`, read by Spark from the snapshot's data files.

    None, or a table without snapshots, gives an empty DataFrame with the table's
    schema. The driver only plans file paths; rows are read by the executors.
    """
    if snapshot_id is None:
        return _read_files(spark, table, [])
    return _read_files(spark, table, data_file_paths(table, snapshot_id))


def read_appended(
    spark: SparkSession, table: Table, after_snapshot_id: int | None, upto_snapshot_id: int | None
) -> DataFrame:
    """Rows added by the snapshots in `(after, upto]` of an append-only table.

    Reads the files :func:`appended_file_paths` lists. An empty range (`upto` None or
    equal to `after`) gives an empty DataFrame.
    """
    return _read_files(
        spark, table, appended_file_paths(table, after_snapshot_id, upto_snapshot_id)
    )


def appended_file_paths(table: Table, after: int | None, upto: int | None) -> list[str]:
    """Paths of the data files added by the snapshots in `(after, upto]`, checked.

    Uses pyiceberg's incremental append scan: the data files whose manifest entry
    is ADDED by an append snapshot in the ancestor chain from `upto` back to (not
    including) `after` (`after=None`: from the first snapshot). Raises
    :class:`NotAppendOnly` if the range holds an overwrite or delete snapshot,
    because rows those removed or replaced would silently be missed, and ValueError
    if `after` is not an ancestor of `upto`.
    """
    if upto is None or upto == after:
        return []
    _require_append_only(table, after, upto)
    scan = table.incremental_append_scan(
        from_snapshot_id_exclusive=after, to_snapshot_id_inclusive=upto
    )
    return [t.file.file_path for t in scan.plan_files()]


def range_file_paths(table: Table, after: int | None, upto: int | None) -> list[str]:
    """The data files a batch reads for the snapshot range `(after, upto]` of an input.

    A first read (no start snapshot: a new reader, or a start that was expired since)
    reads the table's full state at `upto`: the increments of the snapshots that
    survived would miss what the expired ones added. Otherwise the files added in the
    range, which must be append-only (:func:`appended_file_paths`).
    """
    if upto is None or upto == after:
        return []
    if after is None or table.snapshot_by_id(after) is None:
        return data_file_paths(table, upto)
    return appended_file_paths(table, after, upto)


def _require_append_only(table: Table, after: int | None, upto: int) -> None:
    upto_snap = table.snapshot_by_id(upto)
    if upto_snap is None:
        raise ValueError(f"snapshot {upto} not found in table {table.name()}")
    for snap in ancestors_of(upto_snap, table.metadata):
        operation = snap.summary.operation if snap.summary else None
        if operation not in _APPEND_ONLY_OPERATIONS:
            name = ".".join(table.name())
            kind = operation.value if isinstance(operation, Operation) else operation
            raise NotAppendOnly(
                f"table {name} is not append-only between snapshots {after} and {upto}: "
                f"snapshot {snap.snapshot_id} is a {kind} snapshot (an upsert, overwrite or "
                "delete), and incremental reads need an append-only range (reading only "
                "the files it added would silently miss the rows it replaced or deleted). "
                f"Read {name} as of the batch's barrier instead: declare it in "
                f"register(..., lookups=['{name}']) and call ctx.read('{name}') in the "
                "transform (changelog reads of such tables are not supported yet)"
            )
        # Comparing with the parent also accepts an `after` that was since expired.
        if snap.parent_snapshot_id == after:
            return
    raise ValueError(f"snapshot {after} is not an ancestor of snapshot {upto}")


def _read_files(spark: SparkSession, table: Table, paths: Sequence[str]) -> DataFrame:
    # An explicit schema: no footer inference on the driver, stable types across
    # files, and the right columns for an empty read.
    schema = iceberg_schema_to_spark(table.schema())
    if not paths:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*paths)


# --------------------------------------------------------------------------- commits


def commit_batch(
    spark_df: DataFrame,
    table: Table,
    *,
    barrier: int,
    job: str,
    batch_id: int,
    mode: Mode = "append",
    key_columns: Sequence[str] | None = None,
    max_attempts: int = DEFAULT_COMMIT_ATTEMPTS,
    query_id: str | None = None,
) -> int | None:
    """Write one micro-batch from the executors and commit it as one stamped snapshot.

    The executors write the batch as Parquet into a fresh folder under the table's
    `data/`; the driver reads only the files' footers and commits them with
    pyiceberg. Returns the new snapshot id, or None when the batch had no rows (no
    snapshot is made). Idempotent per `(job, batch_id)` (and `query_id`, the Spark
    query stamped beside the batch id when given): when the table already holds a
    snapshot for that batch its id is returned and nothing is written. The batch
    reaches the table at most once even when two drivers run it at the same time
    (see the module docstring).

    `mode="upsert"` replaces rows by `key_columns`: the batch is reduced to its last
    row per key, the current data files holding any of its keys are rewritten
    without those keys (distributed, in Spark), and one overwrite snapshot deletes
    them and adds the rewritten files plus the batch. Files without batch keys are
    left untouched.

    `table` is refreshed in place first (a caller may hold it across batches).
    A concurrent commit to the table (`CommitFailedException`, or for upserts a
    conflicting concurrent change) is retried up to `max_attempts` times with
    exponential backoff, re-planning the upsert against the refreshed table.
    """
    keys = _check_mode(mode, key_columns, table)
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    table.refresh()
    _turn_off_pyiceberg_retries(table)
    # Every attempt commits on the metadata this check (or should_stop's) ran on: the
    # fast append asserts its parent snapshot, so another driver's commit of the batch
    # in between makes the attempt fail rather than land a second time.
    existing = find_batch_snapshot(table, job, batch_id, query_id)
    if existing is not None:
        log.info("%s batch %s already committed as snapshot %s", job, batch_id, existing)
        return existing
    stamp = {SUMMARY_BARRIER: str(barrier), SUMMARY_JOB: job, SUMMARY_BATCH: str(batch_id)}
    if query_id is not None:
        stamp[SUMMARY_QUERY] = query_id
    folder = f"{table.location()}/data/batch-{_safe(job)}-{batch_id}-{uuid.uuid4().hex}"

    rows = spark_df.select(*_check_columns(spark_df, table))
    if keys:
        rows = _last_row_per_key(rows, keys)
    added = _write_data_files(rows, folder, table)
    crash_point("after_write", batch_id)  # fault-injection tests only; a no-op otherwise
    if not added:
        _delete_folder(folder)
        return None

    def should_stop() -> int | None:
        # Another driver running the same batch (a zombie after failover) may have
        # won the race; re-checked on the refreshed table before every retry of ours.
        done = find_batch_snapshot(table, job, batch_id, query_id)
        if done is not None:
            _delete_folder(folder)  # our attempts did not land: nothing references it
        return done

    def attempt(n: int) -> int:
        if not keys:
            return _commit_files(table, stamp, added, [])
        rewrite_folder = f"{folder}/rewrite-{n}"
        return _upsert_attempt(spark_df.sparkSession, table, stamp, added, keys, rewrite_folder)

    try:
        return _with_retries(table, max_attempts, should_stop, attempt)
    except _NOT_LANDED:
        _delete_folder(folder)
        raise


def _check_mode(mode: str, key_columns: Sequence[str] | None, table: Table) -> list[str]:
    if not table.spec().is_unpartitioned():
        # Spark writes plain files with no Iceberg partition values to commit them under.
        raise ValueError(f"table {table.name()} is partitioned; only unpartitioned is supported")
    if mode == "append":
        if key_columns:
            raise ValueError("key_columns are only used with mode='upsert'")
        return []
    if mode != "upsert":
        raise ValueError(f"mode must be 'append' or 'upsert', not {mode!r}")
    if not key_columns:
        raise ValueError("mode='upsert' needs key_columns")
    missing = set(key_columns) - set(_column_names(table))
    if missing:
        raise ValueError(f"key columns not in table {table.name()}: {sorted(missing)}")
    return list(key_columns)


def _check_columns(df: DataFrame, table: Table) -> list[str]:
    # Refuse rather than drop or null-fill: a mismatch is a pipeline bug, and this
    # layer does not evolve table schemas.
    columns = _column_names(table)
    extra, missing = set(df.columns) - set(columns), set(columns) - set(df.columns)
    if extra or missing:
        raise ValueError(
            f"batch columns do not match table {table.name()}: "
            f"not in the table {sorted(extra)}, missing from the batch {sorted(missing)}"
        )
    return columns


def _turn_off_pyiceberg_retries(table: Table) -> None:
    """Make pyiceberg fail a commit whose base is stale instead of retrying it itself.

    pyiceberg's retry (``Transaction.commit_transaction``) re-applies a fast append on
    the refreshed table without asking whether the batch landed meanwhile, so two
    drivers committing one batch would both succeed. Our own loop (`_with_retries`)
    checks that first. Tables made by `ensure_table` have the property already; others
    get it once, in a commit of their own (which leaves `table` current).
    """
    if table.properties.get(TableProperties.COMMIT_NUM_RETRIES) == "0":
        return
    with table.transaction() as txn:
        txn.set_properties({TableProperties.COMMIT_NUM_RETRIES: "0"})


def _with_retries(
    table: Table,
    max_attempts: int,
    should_stop: Callable[[], int | None],
    attempt: Callable[[int], int],
) -> int:
    for n in range(max_attempts):
        try:
            return attempt(n)
        except _NOT_LANDED as exc:
            if n + 1 >= max_attempts:
                raise
            delay = min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2**n) * random.uniform(1.0, 1.5)
            log.warning(
                "commit to %s failed (%s), retry %d/%d in %.2fs",
                table.name(),
                exc,
                n + 1,
                max_attempts - 1,
                delay,
            )
            time.sleep(delay)
            table.refresh()
            if (done := should_stop()) is not None:
                return done
    raise AssertionError("unreachable: the last attempt returns or raises")


def _commit_files(
    table: Table, stamp: dict[str, str], added: list[DataFile], deleted: list[DataFile]
) -> int:
    """One transaction: fast append, or an overwrite when files are replaced."""
    txn = table.transaction()
    _ensure_name_mapping(txn)
    update = txn.update_snapshot(snapshot_properties=stamp)
    # An overwrite validates against concurrent commits (serializable: any data
    # file added meanwhile, or any of `deleted` gone, is a ValidationException);
    # a fast append needs no validation.
    producer: Any = update.overwrite() if deleted else update.fast_append()
    with producer:
        for data_file in deleted:
            producer.delete_data_file(data_file)
        for data_file in added:
            producer.append_data_file(data_file)
    txn.commit_transaction()
    return int(producer.snapshot_id)


def _ensure_name_mapping(txn: Transaction) -> None:
    # Spark's files carry no Iceberg field ids; readers (pyiceberg, other engines)
    # resolve their columns through the table's default name mapping.
    if txn.table_metadata.name_mapping() is None:
        mapping = txn.table_metadata.schema().name_mapping.model_dump_json()
        txn.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})


# --------------------------------------------------------------------------- upsert


def _last_row_per_key(df: DataFrame, keys: list[str]) -> DataFrame:
    # monotonically_increasing_id follows the batch's partition and row order, so
    # "largest id" is the row that came last in the batch.
    order, rank = "__ms_order", "__ms_rank"
    window = Window.partitionBy(*keys).orderBy(F.col(order).desc())
    return (
        df.withColumn(order, F.monotonically_increasing_id())
        .withColumn(rank, F.row_number().over(window))
        .where(F.col(rank) == 1)
        .drop(order, rank)
    )


def _upsert_attempt(
    spark: SparkSession,
    table: Table,
    stamp: dict[str, str],
    batch_files: list[DataFile],
    keys: list[str],
    rewrite_folder: str,
) -> int:
    """Plan against the table's current snapshot, rewrite affected files, commit."""
    schema = iceberg_schema_to_spark(table.schema())
    # The batch is read back from its written files rather than recomputed from the
    # caller's DataFrame, whose lineage may re-read a source.
    batch = spark.read.schema(schema).parquet(*[f.file_path for f in batch_files])
    batch_keys = batch.select(*[F.col(k).alias(_key_alias(i)) for i, k in enumerate(keys)])
    candidates = _data_files(table, None, _key_range_filter(table, batch_files, keys))
    affected = _files_with_keys(spark, schema, candidates, batch_keys, keys)
    if not affected:
        return _commit_files(table, stamp, batch_files, [])
    try:
        kept = (
            spark.read.schema(schema)
            .parquet(*[f.file_path for f in affected])
            .join(batch_keys, _key_match(keys), "left_anti")
        )
        rewritten = _write_data_files(kept, rewrite_folder, table)
        return _commit_files(table, stamp, batch_files + rewritten, affected)
    except _NOT_LANDED:
        _delete_folder(rewrite_folder)
        raise


def _files_with_keys(
    spark: SparkSession,
    schema: T.StructType,
    candidates: list[DataFile],
    batch_keys: DataFrame,
    keys: list[str],
) -> list[DataFile]:
    """The candidate files holding at least one batch key (a distributed semi join)."""
    if not candidates:
        return []
    by_path = {_path_key(f.file_path): f for f in candidates}
    current = (
        spark.read.schema(schema)
        .parquet(*[f.file_path for f in candidates])
        .select(*keys, F.col("_metadata.file_path").alias("__ms_file"))
    )
    hits = (
        current.join(batch_keys, _key_match(keys), "left_semi")
        .select("__ms_file")
        .distinct()
        .collect()
    )
    return [by_path[_path_key(row["__ms_file"])] for row in hits]


def _key_alias(i: int) -> str:
    return f"__ms_key_{i}"


def _key_match(keys: list[str]) -> Column:
    # Null-safe: a null key is a key like any other (upserting it replaces the old row).
    cond: Column | None = None
    for i, k in enumerate(keys):
        term = F.col(k).eqNullSafe(F.col(_key_alias(i)))
        cond = term if cond is None else cond & term
    assert cond is not None
    return cond


def _key_range_filter(
    table: Table, batch_files: list[DataFile], keys: list[str]
) -> BooleanExpression:
    """Prune files whose key min/max statistics cannot overlap the batch's keys.

    The bounds come from the batch files' Parquet statistics, so this costs no
    Spark job. Columns with null batch keys, missing bounds or float types are not
    pruned on (the expression then degenerates to AlwaysTrue).
    """
    expr: BooleanExpression = AlwaysTrue()
    schema = table.schema()
    for key in keys:
        field = schema.find_field(key)
        if not isinstance(field.field_type, _PRUNABLE_KEY_TYPES):
            continue
        bounds = _column_bounds(batch_files, field)
        if bounds is not None:
            # mypy sees pydantic's generated signature, not the (term, literal) __init__.
            low = GreaterThanOrEqual(key, bounds[0])  # type: ignore[call-arg]
            high = LessThanOrEqual(key, bounds[1])  # type: ignore[call-arg]
            expr = And(expr, low, high)
    return expr


def _column_bounds(files: list[DataFile], field: NestedField) -> tuple[Any, Any] | None:
    fid, ftype = field.field_id, field.field_type
    lows, highs = [], []
    for f in files:
        nulls = (f.null_value_counts or {}).get(fid)
        low, high = (f.lower_bounds or {}).get(fid), (f.upper_bounds or {}).get(fid)
        if nulls is None or nulls > 0 or low is None or high is None:
            return None
        lows.append(from_bytes(ftype, low))  # type: ignore[arg-type]
        highs.append(from_bytes(ftype, high))  # type: ignore[arg-type]
    return (min(lows), max(highs)) if lows else None


# --------------------------------------------------------------------------- files


def _write_data_files(df: DataFrame, folder: str, table: Table) -> list[DataFile]:
    """Write `df` as Parquet into the new `folder` (executors) and describe the files.

    Returns one DataFile per non-empty written file, built from its Parquet footer
    on the driver; no rows reach the driver.
    """
    spark = df.sparkSession
    if spark.conf.get(PARQUET_TIMESTAMP_TYPE_KEY) != PARQUET_TIMESTAMP_TYPE:
        # Left set rather than restored: foreachBatch runs on several threads of one
        # session, and a restore racing another writer would produce INT96 files.
        log.info("setting %s=%s for Iceberg", PARQUET_TIMESTAMP_TYPE_KEY, PARQUET_TIMESTAMP_TYPE)
        spark.conf.set(PARQUET_TIMESTAMP_TYPE_KEY, PARQUET_TIMESTAMP_TYPE)
    df.write.mode("errorifexists").parquet(folder)
    files = _list_parquet_files(spark, df.schema, folder)
    with ThreadPoolExecutor(max_workers=_FOOTER_READ_THREADS) as pool:
        data_files = list(
            pool.map(
                lambda p: parquet_file_to_data_file(
                    io=table.io, table_metadata=table.metadata, file_path=p
                ),
                files,
            )
        )
    # Spark writes one empty file for an empty result; Iceberg has no use for it.
    return [f for f in data_files if f.record_count > 0]


def _list_parquet_files(spark: SparkSession, schema: T.StructType, folder: str) -> list[str]:
    # Listing through pyarrow costs well under a millisecond; planning a Spark read
    # just to call inputFiles() cost 65-145 ms a batch (bench/bench_spark.py). Spark's
    # listing remains the fallback for filesystems pyarrow cannot open. Either way,
    # keep only the names and re-root them at `folder`, the spelling of the table's
    # location (Spark answers `file:/x` where the table says `file:///x`).
    try:
        fs, path = pafs.FileSystem.from_uri(folder)
        listed = [info.path for info in fs.get_file_info(pafs.FileSelector(path))]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        listed = spark.read.schema(schema).parquet(folder).inputFiles()
    names = sorted({Path(unquote(urlparse(p).path)).name for p in listed})
    return [f"{folder}/{n}" for n in names if n.endswith(".parquet")]


def _delete_folder(folder: str) -> None:
    """Best-effort removal of files no snapshot references."""
    try:
        fs, path = pafs.FileSystem.from_uri(folder)
        fs.delete_dir(path)
    except (OSError, pa.ArrowException) as exc:
        log.warning("could not delete %s: %s", folder, exc)


def _path_key(path: str) -> tuple[str, str, str]:
    """A path's identity regardless of URI spelling (`file:/x`, `file:///x`, `/x`)."""
    parsed = urlparse(path)
    return (parsed.scheme or "file", parsed.netloc, unquote(parsed.path))


def _as_uri(location: str) -> str:
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", location):
        return location.rstrip("/")
    return Path(location).expanduser().resolve().as_uri()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _column_names(table: Table) -> list[str]:
    return [f.name for f in table.schema().fields]
