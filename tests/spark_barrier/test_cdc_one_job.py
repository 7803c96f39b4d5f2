"""A small CDC batch is checked, reduced to its last change per key, written and its
changed keys collected in one Spark job (spark_barrier.iceberg.cdc_write), with the
same result as the general path (check, write and keys in separate jobs), whether its
task runs in Python workers or, for a batch known to be small, on the driver."""

from __future__ import annotations

from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from spark_barrier.iceberg import cdc_write
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.commit import commit_batch
from spark_barrier.iceberg.files import DRIVER_WRITE_MAX_ROWS_PROPERTY as DRIVER_MAX
from spark_barrier.iceberg.native_write import NATIVE_WRITER_PROPERTY as NATIVE
from tests.spark_barrier.test_cdc import FEED, TABLE, rows_of

pytestmark = pytest.mark.spark

# Batches of (id, status, qty, op, seq): inserts, then updates and deletes of keys in
# several files, a key changed twice in one batch, a delete of a missing key.
BATCHES: list[list[tuple[Any, ...]]] = [
    [(i, "placed", i, "I", i) for i in range(1, 9)],
    [(i, "placed", i, "I", i) for i in range(20, 26)],
    [
        (2, "shipped", 20, "U", 100),
        (2, "returned", 21, "U", 101),
        (3, "gone", 0, "D", 102),
        (21, "shipped", 5, "update", 103),
        (99, "gone", 0, "delete", 104),
        (30, "placed", 3, "insert", 105),
    ],
    [(25, "x", 0, "D", 200), (4, "x", 0, "D", 201), (7, "again", 7, "I", 202)],
]


def apply(spark: SparkSession, table: Table, batches: list[list[tuple[Any, ...]]]) -> list[int]:
    """Commit the batches; the number of Spark jobs each one ran."""
    jobs = []
    tracker = spark.sparkContext.statusTracker()
    for batch_id, records in enumerate(batches):
        group = f"cdc-one-job-{table.name()[-1]}-{batch_id}"
        spark.sparkContext.setJobGroup(group, group)
        try:
            commit_batch(
                spark.createDataFrame(records, FEED).repartition(2),
                table,
                barrier=1000 * (batch_id + 1),
                job="cdc",
                batch_id=batch_id,
                mode="cdc",
                key_columns=["id"],
                op_column="op",
                order_by="seq",
            )
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        jobs.append(len(tracker.getJobIdsForGroup(group)))
    return jobs


EXPECTED = {
    1: ("placed", 1),
    2: ("returned", 21),
    5: ("placed", 5),
    6: ("placed", 6),
    7: ("again", 7),
    8: ("placed", 8),
    20: ("placed", 20),
    21: ("shipped", 5),
    22: ("placed", 22),
    23: ("placed", 23),
    24: ("placed", 24),
    30: ("placed", 3),
}


def test_a_small_cdc_batch_runs_fewer_spark_jobs_with_the_same_result(
    spark: SparkSession, catalog: Catalog
) -> None:
    # The batches after the first follow small ones: the driver runs their one task.
    on_driver = ensure_table(catalog, "ods.on_driver", TABLE)
    in_workers = _with_property(ensure_table(catalog, "ods.in_workers", TABLE), DRIVER_MAX, "0")
    # Spark's own writer for every batch: the general path (check, write, keys apart).
    general = _with_property(ensure_table(catalog, "ods.general", TABLE), NATIVE, "true")

    driver_jobs = apply(spark, on_driver, BATCHES)
    workers_jobs = apply(spark, in_workers, BATCHES)
    general_jobs = apply(spark, general, BATCHES)

    assert rows_of(on_driver) == rows_of(in_workers) == rows_of(general) == EXPECTED
    assert _operations(on_driver) == _operations(in_workers) == _operations(general)
    # One job against the general path's check, write and keys (under adaptive
    # execution each shuffle stage, the feed's and the window's, counts as a job too).
    for merged_jobs in (driver_jobs, workers_jobs):
        assert all(m < g for m, g in zip(merged_jobs, general_jobs, strict=True)), (
            merged_jobs,
            general_jobs,
        )


def _with_property(table: Table, name: str, value: str) -> Table:
    with table.transaction() as txn:
        txn.set_properties({name: value})
    table.refresh()
    return table


def _operations(table: Table) -> list[str]:
    return [s.summary.operation.value for s in table.snapshots()]  # type: ignore[union-attr]


def test_more_changed_keys_than_the_driver_takes_are_matched_by_spark(
    spark: SparkSession, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cdc_write, "MAX_KEYS", 2)
    table = ensure_table(catalog, "ods.many_keys", TABLE)
    apply(spark, table, BATCHES)
    assert rows_of(table) == EXPECTED
