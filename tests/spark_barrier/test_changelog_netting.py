"""How a changelog read nets the files a range removed against those it added: carry-over
rows cancel, duplicates count, updates pair by key (spark_barrier.iceberg.changelog)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.changelog import ChangelogFiles, read_changelog
from spark_barrier.iceberg.scan import data_files

pytestmark = pytest.mark.spark

KV = T.StructType([T.StructField("k", T.LongType()), T.StructField("v", T.StringType())])
BEFORE = [(1, "a"), (2, "b"), (2, "b"), (3, "c"), (5, None), (6, "x"), (6, "x")]
AFTER = [(1, "a"), (2, "b"), (3, "d"), (4, "e"), (5, None), (6, "x"), (6, "x"), (6, "x")]


def file_of(table: Table, rows: list[tuple[int, str | None]]) -> str:
    """Append `rows` as one data file of `table`; its path."""
    known = {f.file_path for f in data_files(table, None)}
    arrow = pa.table(
        {"k": [r[0] for r in rows], "v": [r[1] for r in rows]},
        schema=pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.string())]),
    )
    table.append(arrow)
    table.refresh()
    (path,) = {f.file_path for f in data_files(table, None)} - known
    return path


@pytest.fixture
def files(catalog: Catalog) -> tuple[Table, ChangelogFiles]:
    table = ensure_table(catalog, "dw.kv", KV)
    return table, ChangelogFiles(removed=[file_of(table, BEFORE)], added=[file_of(table, AFTER)])


def changes(spark: SparkSession, table: Table, files: ChangelogFiles, keys: Any) -> Counter[Any]:
    rows = read_changelog(spark, table, files, keys).collect()
    return Counter((r["k"], r["v"], r["_change_type"]) for r in rows)


def test_without_keys_rows_net_as_a_multiset_difference(
    spark: SparkSession, files: tuple[Table, ChangelogFiles]
) -> None:
    table, planned = files
    assert changes(spark, table, planned, ()) == Counter(
        {
            (2, "b", "DELETE"): 1,  # one of two copies gone
            (3, "c", "DELETE"): 1,
            (3, "d", "INSERT"): 1,
            (4, "e", "INSERT"): 1,
            (6, "x", "INSERT"): 1,  # a third copy
        }
    )


def test_with_keys_a_key_deleted_and_inserted_is_an_update(
    spark: SparkSession, files: tuple[Table, ChangelogFiles]
) -> None:
    table, planned = files
    assert changes(spark, table, planned, ["k"]) == Counter(
        {
            (2, "b", "DELETE"): 1,
            (3, "c", "UPDATE_BEFORE"): 1,
            (3, "d", "UPDATE_AFTER"): 1,
            (4, "e", "INSERT"): 1,
            (6, "x", "INSERT"): 1,
        }
    )


def test_a_range_that_only_adds_or_only_removes_is_inserts_or_deletes(
    spark: SparkSession, files: tuple[Table, ChangelogFiles]
) -> None:
    table, planned = files
    added = ChangelogFiles(removed=[], added=planned.added)
    removed = ChangelogFiles(removed=planned.removed, added=[])
    assert changes(spark, table, added, ["k"]) == Counter((k, v, "INSERT") for k, v in AFTER)
    assert changes(spark, table, removed, ["k"]) == Counter((k, v, "DELETE") for k, v in BEFORE)
