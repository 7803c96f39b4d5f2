"""G3: a batch reaches a table at most once: two drivers committing one batch leave
one snapshot (repro s7_zombie.py), and a reset checkpoint's batch ids are not replays.

pyiceberg retries a commit whose base went stale by re-applying the fast append on
the refreshed table, without asking whether the batch landed meanwhile. These tests
run commit_batch's own path (check, write, commit, retries) without Spark: the
batch's files are written with pyarrow and handed to it in place of Spark's write.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table

from spark_barrier.iceberg import commit as commit_module
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.commit import commit_batch
from spark_barrier.iceberg.stamps import (
    SUMMARY_BARRIER,
    SUMMARY_BATCH,
    SUMMARY_JOB,
    SUMMARY_QUERY,
    find_batch_commit,
    list_stamped_snapshots,
)
from spark_barrier.iceberg.transaction import commit_files

SCHEMA = pa.schema([pa.field("k", pa.int64(), True)])


class Frame:
    """The part of a DataFrame commit_batch touches before it writes."""

    columns = ("k",)
    sparkSession = None

    def select(self, *columns: str) -> Frame:
        return self


def write_file(table: Table, name: str, rows: list[int]) -> Any:
    path = f"{table.location()}/data/{name}.parquet"
    local = path.removeprefix("file://")
    os.makedirs(local.rsplit("/", 1)[0], exist_ok=True)
    pq.write_table(pa.table({"k": rows}, schema=SCHEMA), local)
    return parquet_file_to_data_file(io=table.io, table_metadata=table.metadata, file_path=path)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each commit_batch call takes its "written" files from this list (a callable
    returning them), in place of Spark's write."""
    queue: list[Any] = []

    def fake_write(df: Any, folder: str, table: Table, **_options: Any) -> list[Any]:
        return queue.pop(0)(table)  # type: ignore[no-any-return]

    monkeypatch.setattr(commit_module, "write_data_files", fake_write)
    monkeypatch.setattr(commit_module, "_BACKOFF_BASE_S", 0.01)
    return queue


def _zombie_race(catalog: Catalog, table: Table, writes: list[Any]) -> None:
    # Two drivers run batch 5; both have the table open before either commits.
    first, second = catalog.load_table("ns.t"), catalog.load_table("ns.t")
    winner: list[int | None] = []

    def second_driver_writes(tbl: Table) -> list[Any]:
        # While this driver writes its files (it already saw no snapshot of batch 5),
        # the other driver commits the batch.
        writes.insert(0, lambda t: [write_file(t, "first", [1, 2, 3])])
        winner.append(commit_batch(Frame(), first, barrier=1000, job="j", batch_id=5))  # type: ignore[arg-type]
        return [write_file(tbl, "second", [1, 2, 3])]

    writes.append(second_driver_writes)
    loser = commit_batch(Frame(), second, barrier=1000, job="j", batch_id=5)  # type: ignore[arg-type]

    table.refresh()
    stamped = list_stamped_snapshots(table)
    assert [s.batch for s in stamped] == [5], f"batch 5 committed {len(stamped)} times"
    assert loser == winner[0] == stamped[0].snapshot_id
    assert table.scan().to_arrow().num_rows == 3


def test_two_drivers_committing_one_batch_leave_one_snapshot(
    catalog: Catalog, writes: list[Any]
) -> None:
    table = ensure_table(catalog, "ns.t", SCHEMA)
    _zombie_race(catalog, table, writes)


def test_ensure_table_of_an_existing_table_writes_no_metadata_file(catalog: Catalog) -> None:
    table = ensure_table(catalog, "ns.t", SCHEMA)
    folder = table.metadata_location.removeprefix("file://").rsplit("/", 1)[0]
    before = sorted(os.listdir(folder))

    again = ensure_table(catalog, "ns.t", SCHEMA)

    assert again.metadata_location == table.metadata_location
    assert sorted(os.listdir(folder)) == before == [table.metadata_location.rsplit("/", 1)[1]]


def test_a_table_not_made_by_ensure_table_gets_pyiceberg_retries_turned_off(
    catalog: Catalog, writes: list[Any]
) -> None:
    catalog.create_namespace_if_not_exists("ns")
    table = catalog.create_table("ns.t", schema=SCHEMA)  # pyiceberg's default: 4 retries
    assert "commit.retry.num-retries" not in table.properties
    _zombie_race(catalog, table, writes)
    assert table.properties["commit.retry.num-retries"] == "0"


def test_a_batch_id_of_another_spark_query_is_not_a_replay(catalog: Catalog) -> None:
    table = ensure_table(catalog, "ns.t", SCHEMA)
    stamp = {SUMMARY_BARRIER: "1000", SUMMARY_JOB: "j", SUMMARY_BATCH: "0"}
    legacy = commit_files(table, stamp, [write_file(table, "legacy", [1])], [])
    table.refresh()
    assert find_batch_commit(table, "j", 0, "q-new") == (legacy, 1000, "j", 0, None)

    stamp = {**stamp, SUMMARY_BATCH: "1", SUMMARY_QUERY: "q-old"}
    stamped = commit_files(table, stamp, [write_file(table, "stamped", [2])], [])
    table.refresh()
    assert find_batch_commit(table, "j", 1, "q-old") == (stamped, 1000, "j", 1, "q-old")
    assert find_batch_commit(table, "j", 1) is not None  # the query unknown: as before
    assert find_batch_commit(table, "j", 1, "q-new") is None  # a reset checkpoint's batch 1
