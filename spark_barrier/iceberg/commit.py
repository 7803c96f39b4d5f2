"""Committing a micro-batch as one stamped snapshot, at most once whatever the retries."""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from metaservice.contract import encode_log_files, encode_stamp
from spark_barrier.faults import crash_point
from spark_barrier.iceberg.cdc import (
    DELETE_OP,
    OP,
    CdcInputError,
    changed_keys_on_driver,
    check_changes,
    check_key_types,
    last_changes,
    normalized_op,
)
from spark_barrier.iceberg.cdc_write import write_cdc_batch
from spark_barrier.iceberg.files import (
    column_names,
    delete_folder,
    safe_name,
    selected,
    write_data_files,
)
from spark_barrier.iceberg.key_bounds import key_bound_aggregates, key_filter_from_bounds
from spark_barrier.iceberg.native_write import why_not_native
from spark_barrier.iceberg.stamps import find_batch_snapshot
from spark_barrier.iceberg.transaction import NOT_LANDED, commit_files
from spark_barrier.iceberg.upsert import (
    last_row_per_key,
    may_check_keys_on_driver,
    replace_keys_attempt,
    unique_keys,
    unique_rows,
    upsert_attempt,
)
from spark_barrier.log import LogTarget
from spark_barrier.steps import step

log = logging.getLogger(__name__)

Mode = Literal["append", "upsert", "cdc"]
MODES = ("append", "upsert", "cdc")


DEFAULT_COMMIT_ATTEMPTS = 5

# The snapshot summary key of the rows a batch wrote (beside the stamp): the next batch's
# expected size, by which its files' writer is chosen (see files.write_data_files).
BATCH_ROWS_KEY = "spark-barrier.batch-rows"
# The snapshot summary key saying whether an upsert batch's keys were unique as it came
# ("true"/"false"): after "false" the next batches are reduced to their last row per key
# before they are written (see _upsert_rows).
UNIQUE_KEYS_KEY = "spark-barrier.batch-keys-unique"


_BACKOFF_BASE_S = 0.1


_BACKOFF_MAX_S = 2.0


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
    op_column: str | None = None,
    order_by: str | None = None,
    log_target: LogTarget | None = None,
) -> int | None:
    """Write one micro-batch from the executors and commit it as one stamped snapshot.

    The executors write the batch as Parquet into a fresh folder under the table's
    `data/` (the driver itself for a batch known to be small: see
    :func:`~spark_barrier.iceberg.files.run_write_task`) and the driver commits the
    files with pyiceberg. Returns the new snapshot id, or None when the batch had no rows (no
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

    `mode="cdc"` applies change records (see :mod:`spark_barrier.iceberg.cdc`): the
    batch has the table's columns plus `op_column` (and `order_by`, if it is not a
    table column); per key its last change wins (largest `order_by`, else last in the
    batch); deleted keys leave the table and the others are upserted, in one snapshot
    that rewrites only the files holding changed keys (a delete snapshot when it only
    removes files; none when nothing changes). A null key or an unknown op raises
    `CdcInputError` before anything is written.

    `log_target`: the write tasks also append the batch's rows to the table's log store, chunk
    by chunk, before writing each chunk's file (see :mod:`spark_barrier.log`).

    `table` is refreshed in place first (a caller may hold it across batches).
    A concurrent commit to the table (`CommitFailedException`, or for upserts a
    conflicting concurrent change) is retried up to `max_attempts` times with
    exponential backoff, re-planning the upsert against the refreshed table.
    """
    keys = check_mode(mode, key_columns, table, op_column, order_by)
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
    stamp = encode_stamp(barrier, job, batch_id, query_id)
    folder = f"{table.location()}/data/batch-{safe_name(job)}-{batch_id}-{uuid.uuid4().hex}"

    where = f"job '{job}' batch {batch_id}"
    # A stream's batches are alike in size: the previous one's is this one's guess.
    expected = previous_batch_rows(table)
    with _batch_rows(
        spark_df, table, keys, op_column, order_by, where, folder, expected, log_target
    ) as batch:
        if batch.written is not None:
            added = batch.written
        else:
            assert batch.rows is not None
            with step("write"):
                added = write_data_files(
                    batch.rows, folder, table, log_target=log_target, expected_rows=expected
                )
        if batch.dedupe is not None:
            with step("write"):  # its parts: write.keys, and write.deduped when needed
                added = _unique_or_deduped(
                    batch, batch.dedupe, added, table, keys, folder, expected
                )
            stamp = {**stamp, UNIQUE_KEYS_KEY: str(batch.changed_key_rows is not None).lower()}
        elif keys and op_column is None and previous_unique_keys(table) is False:
            stamp = {**stamp, UNIQUE_KEYS_KEY: "false"}  # still reduced first, next time too
        crash_point("after_write", batch_id)  # fault-injection tests only; a no-op otherwise
        if batch.changed_keys is None and not added:
            delete_folder(folder, table.io)
            return None
        stamp = {**stamp, BATCH_ROWS_KEY: str(sum(f.record_count for f in added))}
        if log_target is not None:  # the rows the log spilled are the snapshot's to expire
            stamp = {**stamp, **encode_log_files(log_target.claim_spilled())}
        attempt = _attempt(spark_df.sparkSession, table, stamp, folder, added, keys, batch)

        def should_stop() -> int | None:
            # Another driver running the same batch (a zombie after failover) may have
            # won the race; re-checked on the refreshed table before every retry of ours.
            done = find_batch_snapshot(table, job, batch_id, query_id)
            if done is not None:
                delete_folder(folder, table.io)  # our attempts did not land: nothing references it
            return done

        try:
            with step("commit"):
                snapshot = _with_retries(table, max_attempts, should_stop, attempt)
        except NOT_LANDED:
            delete_folder(folder, table.io)
            raise
    if snapshot is None:
        delete_folder(folder, table.io)  # changes that changed nothing: no snapshot
    return snapshot


def _unique_or_deduped(
    batch: _BatchRows,
    dedupe: Callable[[], DataFrame],
    added: list[DataFile],
    table: Table,
    keys: list[str],
    folder: str,
    expected: int | None,
) -> list[DataFile]:
    """The files of an upsert batch written as it came (`added`), when its keys are
    unique (read back by the driver, and kept in `batch.changed_key_rows` for the
    match); else the batch is written again, reduced to its last row per key."""
    with step("write.keys"):
        batch.changed_key_rows = unique_keys(table, added, keys)
    if batch.changed_key_rows is not None:
        return added
    delete_folder(folder, table.io)
    with step("write.deduped"):
        return write_data_files(dedupe(), folder, table, expected_rows=expected)


def previous_unique_keys(table: Table) -> bool | None:
    """Whether the upsert batch of the table's current snapshot had unique keys (None:
    not known)."""
    value = _current_summary(table, UNIQUE_KEYS_KEY)
    return None if value is None else value == "true"


def previous_batch_rows(table: Table) -> int | None:
    """The rows the batch of the table's current snapshot wrote, when a batch made it."""
    value = _current_summary(table, BATCH_ROWS_KEY)
    return int(value) if value is not None and value.isdigit() else None


def _current_summary(table: Table, key: str) -> str | None:
    """A value of the table's current snapshot's summary (None: no snapshot, or no such key)."""
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return None
    return snapshot.summary.get(key)


def _attempt(
    spark: SparkSession,
    table: Table,
    stamp: dict[str, str],
    folder: str,
    added: list[DataFile],
    keys: list[str],
    batch: _BatchRows,
) -> Callable[[int], int | None]:
    """One commit attempt of the written files `added` (attempt `n` rewrites into its
    own folder): a fast append, an upsert, or the changes of a CDC batch (whose keys
    lie within `batch.key_filter`)."""

    def attempt(n: int) -> int | None:
        rewrite_folder = f"{folder}/rewrite-{n}"
        if batch.changed_keys is not None and batch.key_filter is not None:
            return replace_keys_attempt(
                spark,
                table,
                stamp,
                added,
                batch.changed_keys,
                keys,
                batch.key_filter,
                rewrite_folder,
                changed_key_rows=batch.changed_key_rows,
            )
        if not keys:
            return commit_files(table, stamp, added, [])
        return upsert_attempt(
            spark, table, stamp, added, keys, rewrite_folder, batch.changed_key_rows
        )

    return attempt


@dataclass
class _BatchRows:
    """A batch made ready to commit: the rows to write (or the files already written
    with them), and for a CDC batch its changed keys (a DataFrame built on demand,
    and the keys themselves when the driver holds them) and the range they lie in."""

    rows: DataFrame | None = None
    written: list[DataFile] | None = None
    changed_keys: Callable[[], DataFrame] | None = None
    changed_key_rows: pa.Table | None = None
    key_filter: BooleanExpression | None = None
    # An upsert batch written as it came: its last row per key, written instead when
    # its keys turn out not to be unique.
    dedupe: Callable[[], DataFrame] | None = None


@contextmanager
def _batch_rows(
    spark_df: DataFrame,
    table: Table,
    keys: list[str],
    op_column: str | None,
    order_by: str | None,
    where: str,
    folder: str,
    expected_rows: int | None,
    log_target: LogTarget | None,
) -> Iterator[_BatchRows]:
    """The rows to write; for a CDC batch also its last change per key (cached while
    the batch commits: its keys are read by every attempt) and the range its keys lie
    in, found in the same Spark job as the check of its records. A CDC batch whose
    files pyiceberg's writer writes is written here, in one Spark job with its check and
    its changed keys (see :mod:`spark_barrier.iceberg.cdc_write`)."""
    if op_column is None:
        columns = _check_columns(spark_df, table)
        if keys:
            yield _upsert_rows(spark_df, table, keys, columns, expected_rows, log_target)
        else:
            yield _BatchRows(rows=selected(spark_df, columns))
        return
    extra = [c for c in (op_column, order_by) if c and c not in column_names(table)]
    records = selected(spark_df, [*_check_columns(spark_df, table, extra), *extra])
    if log_target is None and why_not_native(records, folder, table, expected_rows):
        # (A log store sees the rows as they are written: only after the check.)
        try:
            with step("write"):  # reads, transforms, checks and writes the batch
                written = write_cdc_batch(
                    records, folder, table, keys, op_column, order_by, where, expected_rows
                )
        except CdcInputError:
            delete_folder(folder, table.io)
            raise
        yield _BatchRows(
            written=written.files,
            changed_keys=lambda: records.select(*keys).distinct(),
            changed_key_rows=written.changed_keys,
            key_filter=written.key_filter,
        )
        return
    # Cached: the feed is read once for the check and once for the changes.
    records = records.persist()
    try:
        with step("cdc_check"):  # the first action: reads and transforms the batch
            bounds = check_changes(
                records, keys, op_column, where, key_bound_aggregates(table, keys)
            )
            key_filter = key_filter_from_bounds(table, keys, bounds)
            with step("cdc_check.keys"):  # (a part of cdc_check, as dotted steps are)
                key_rows = changed_keys_on_driver(table, records, keys, bounds)
        if key_rows is not None and unique_rows(key_rows, keys):
            # Each key's one record is its last change: no reduction to write.
            upserts = records.where(normalized_op(op_column) != DELETE_OP)
            yield _BatchRows(
                rows=upserts.select(*column_names(table)),
                changed_keys=lambda: records.select(*keys),
                changed_key_rows=key_rows,
                key_filter=key_filter,
            )
        else:
            yield from _last_changes(
                records, table, keys, op_column, order_by, key_filter, key_rows
            )
    finally:
        records.unpersist()


def _last_changes(
    records: DataFrame,
    table: Table,
    keys: list[str],
    op_column: str,
    order_by: str | None,
    key_filter: BooleanExpression,
    key_rows: pa.Table | None = None,
) -> Iterator[_BatchRows]:
    """The upserts of the last change per key of the (checked) `records`, whose keys
    the driver may hold already (`key_rows`)."""
    changes = last_changes(records, keys, op_column, order_by).persist()
    try:
        upserts = changes.where(F.col(OP) != DELETE_OP).select(*column_names(table))
        yield _BatchRows(
            rows=upserts,
            changed_keys=lambda: changes.select(*keys),
            changed_key_rows=key_rows,
            key_filter=key_filter,
        )
    finally:
        changes.unpersist()


def _upsert_rows(
    spark_df: DataFrame,
    table: Table,
    keys: list[str],
    columns: list[str],
    expected_rows: int | None,
    log_target: LogTarget | None,
) -> _BatchRows:
    """An upsert batch's rows: its last row per key (a sort of the batch by key, about
    as costly as writing it: 450 ms of 1M rows on 2 cores), or, when the driver can
    check its keys afterwards (see :func:`~spark_barrier.iceberg.upsert.unique_keys`)
    and the table's previous batch had unique keys, the batch as it came, reduced and
    written again only if a key turns out twice in it. Not with a log store, which
    sees the rows as they are written."""

    def deduped() -> DataFrame:  # (selects the table's columns itself)
        return last_row_per_key(spark_df, keys, columns=columns)

    if (
        log_target is None
        and expected_rows is not None
        and may_check_keys_on_driver(table, keys, expected_rows)
        and previous_unique_keys(table) is not False
    ):
        return _BatchRows(rows=selected(spark_df, columns), dedupe=deduped)
    return _BatchRows(rows=deduped())


def check_mode(
    mode: str,
    key_columns: Sequence[str] | None,
    table: Table,
    op_column: str | None = None,
    order_by: str | None = None,
) -> list[str]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode != "cdc" and (op_column or order_by):
        raise ValueError("op_column and order_by are only used with mode='cdc'")
    if mode == "append":
        if key_columns:
            raise ValueError("key_columns are only used with mode='upsert' or mode='cdc'")
        return []
    if not key_columns:
        raise ValueError(f"mode={mode!r} needs key_columns")
    missing = set(key_columns) - set(column_names(table))
    if missing:
        raise ValueError(f"key columns not in table {table.name()}: {sorted(missing)}")
    if mode == "cdc":
        _check_cdc(table, key_columns, op_column)
    return list(key_columns)


def _check_cdc(table: Table, key_columns: Sequence[str], op_column: str | None) -> None:
    if not op_column:
        raise ValueError("mode='cdc' needs op_column, the column that holds each record's op")
    if op_column in column_names(table):
        raise ValueError(
            f"op_column {op_column!r} is a column of table {table.name()}; the op is not "
            "stored, so name the feed's op column differently"
        )
    check_key_types(table, key_columns)


def _check_columns(df: DataFrame, table: Table, allowed: Sequence[str] = ()) -> list[str]:
    # Refuse rather than drop or null-fill: a mismatch is a pipeline bug, and this
    # layer does not evolve table schemas. `allowed`: extra columns a mode consumes.
    columns = column_names(table)
    extra = set(df.columns) - set(columns) - set(allowed)
    missing = set(columns) - set(df.columns)
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
    attempt: Callable[[int], int | None],
) -> int | None:
    for n in range(max_attempts):
        try:
            return attempt(n)
        except NOT_LANDED as exc:
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
