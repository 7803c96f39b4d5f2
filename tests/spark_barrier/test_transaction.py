"""The stamped commit's transaction (spark_barrier.iceberg.transaction), without Spark:
its staged metadata, computed once per staged update, is the one pyiceberg computes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table, Transaction

from spark_barrier.iceberg.files import write_arrow_files
from spark_barrier.iceberg.transaction import MetadataOnceTransaction, commit_files

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.string())])


@pytest.fixture
def table(catalog: Catalog) -> Table:
    catalog.create_namespace("ods")
    table = catalog.create_table("ods.t", schema=SCHEMA)
    for i in range(3):
        _commit(table, i)
    return table


def _commit(table: Table, i: int) -> int:
    rows = pa.table({"k": [i, i + 10], "v": [str(i), None]}, schema=SCHEMA)
    files = write_arrow_files(rows, f"{table.location()}/data/batch-{i}", table)
    return commit_files(table, {"batch": str(i)}, files, [])


def _staged(txn: Transaction, table: Table) -> None:
    txn.set_properties({"a": "1"})
    update = txn.update_snapshot(snapshot_properties={"batch": "9"}).fast_append()
    with update:
        for data_file in write_arrow_files(
            pa.table({"k": [9], "v": ["x"]}, schema=SCHEMA), f"{table.location()}/data/b9", table
        ):
            update.append_data_file(data_file)


def test_the_staged_metadata_is_pyicebergs_and_follows_every_staged_update(
    table: Table,
) -> None:
    once, plain = MetadataOnceTransaction(table), Transaction(table)
    assert once.table_metadata is once.table_metadata  # nothing staged since: kept
    assert once.table_metadata == plain.table_metadata

    before = once.table_metadata
    _staged(once, table)
    _staged(plain, table)
    staged = once.table_metadata
    assert staged is not before and staged.properties["a"] == "1"
    # The same metadata pyiceberg computes, but for the new snapshot's id and time.
    assert len(staged.snapshots) == len(plain.table_metadata.snapshots) == 4
    assert staged.model_dump(exclude={"snapshots", "refs", "current_snapshot_id",
                                      "snapshot_log", "last_updated_ms"}) == (
        plain.table_metadata.model_dump(exclude={"snapshots", "refs", "current_snapshot_id",
                                                 "snapshot_log", "last_updated_ms"})
    )  # fmt: skip


def test_commits_through_it_land_one_stamped_snapshot_each(table: Table) -> None:
    snapshot_id = _commit(table, 3)
    table.refresh()
    assert table.current_snapshot().snapshot_id == snapshot_id  # type: ignore[union-attr]
    assert [s.summary["batch"] for s in table.snapshots()] == ["0", "1", "2", "3"]  # type: ignore[index]
    assert table.scan().to_arrow().num_rows == 8
