"""A batch known to be small is written by the driver: collected as Arrow in one Spark
job and written by the same pyiceberg task the Python workers run
(spark_barrier.iceberg.files.run_write_task), with the same rows in the table."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession

from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.commit import commit_batch
from spark_barrier.iceberg.files import DRIVER_WRITE_MAX_ROWS_PROPERTY
from spark_barrier.iceberg.read import read_snapshot
from tests.spark_barrier.test_native_write import WIDE, _added_files, _wide_rows

pytestmark = pytest.mark.spark

FILES_LOG = "spark_barrier.iceberg.files"


def _commit(df: DataFrame, table: Table, batch: int) -> int:
    snapshot = commit_batch(df, table, barrier=1_000 * batch, job="job", batch_id=batch)
    assert snapshot is not None
    return snapshot


def _files(table: Table, snapshot_id: int) -> int:
    return len(_added_files(table, snapshot_id))


def _set_limit(table: Table, rows: int) -> None:
    with table.transaction() as txn:
        txn.set_properties({DRIVER_WRITE_MAX_ROWS_PROPERTY: str(rows)})
    table.refresh()


def _batch_rows(spark: SparkSession, table: Table, snapshot_id: int) -> list[tuple[Any, ...]]:
    rows = read_snapshot(spark, table, snapshot_id).collect()
    return sorted(tuple(r) for r in rows)


def test_a_small_batch_after_a_small_one_is_written_by_the_driver_with_the_same_rows(
    spark: SparkSession, catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    by_workers = ensure_table(catalog, "dw.by_workers", WIDE)
    by_driver = ensure_table(catalog, "dw.by_driver", WIDE)
    _set_limit(by_workers, 0)  # 0: never the driver
    first = spark.createDataFrame(_wide_rows(range(4)), WIDE).repartition(2)
    second = spark.createDataFrame(_wide_rows(range(4, 30)), WIDE).repartition(2)

    with caplog.at_level(logging.DEBUG, logger=FILES_LOG):
        # The first batch's size is unknown: the Python workers write it, a file a task.
        assert _files(by_driver, _commit(first, by_driver, 1)) == 2
        assert not [r for r in caplog.records if "written by the driver" in r.message]
        # The second follows a small one: the driver writes all of it, in one file.
        driver_snapshot = _commit(second, by_driver, 2)
        assert [r.message for r in caplog.records if "written by the driver" in r.message] == [
            "dw.by_driver: 26 rows written by the driver"
        ]
    workers_snapshot = _commit(second, by_workers, 1)

    assert _files(by_driver, driver_snapshot) == 1
    assert _files(by_workers, workers_snapshot) == 2
    # Every type of the wide schema (timestamps with and without a zone, dates, shorts,
    # binary) reads back the same however it was written.
    expected = sorted(tuple(r) for r in second.collect())
    assert _batch_rows(spark, by_workers, workers_snapshot) == expected
    assert [r for r in _batch_rows(spark, by_driver, driver_snapshot) if r[0] >= 4] == expected


def test_a_batch_larger_than_the_limit_is_written_by_the_executors_after_all(
    spark: SparkSession, catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    table = ensure_table(catalog, "dw.grows", WIDE)
    _set_limit(table, 5)
    _commit(spark.createDataFrame(_wide_rows(range(3)), WIDE), table, 1)
    small = _commit(spark.createDataFrame(_wide_rows(range(3, 6)), WIDE).repartition(2), table, 2)
    big_rows = spark.createDataFrame(_wide_rows(range(6, 26)), WIDE).repartition(2)

    with caplog.at_level(logging.INFO, logger=FILES_LOG):
        big = _commit(big_rows, table, 3)  # expected 3 rows, holds 20

    assert _files(table, small) == 1  # the driver's
    assert _files(table, big) == 2  # the executors': the driver kept none of its rows
    assert "more than 5 rows (expected 3): written by the executors" in caplog.text
    assert [r[0] for r in _batch_rows(spark, table, big)] == list(range(26))
