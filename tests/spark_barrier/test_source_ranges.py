"""What a batch (a, b] reads from an input, without Spark: the files the sink plans
from the MetaService's range (repros s8_upsert.py, s9_expired.py), and the barrier
source's part, which is no rows at all.

G1 on every path: an input range that replaces or deletes rows is refused with an
error that says how to read the table instead; a batch whose start snapshot does
not exist (a new reader, or an expired start) reads the input's full state; the
range is the MetaService's mapping, not the stamps (a zombie's late snapshot with
an old stamp does not change it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table
from pyspark.sql import types as T

from metaservice.barriers.schemas import InputRange
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.scan import NotAppendOnly, data_files
from spark_barrier.iceberg.stamps import SUMMARY_BARRIER, SUMMARY_BATCH, SUMMARY_JOB
from spark_barrier.iceberg.transaction import commit_files
from spark_barrier.inputs import StreamedInput, plan_input
from spark_barrier.source import BarrierStreamReader, NoRows

SCHEMA = pa.schema([pa.field("k", pa.int64(), True), pa.field("v", pa.string(), True)])
TABLE = "ods.up"


class Ranges:
    """The MetaService's mapping of barriers to snapshots of the input, fixed by the test."""

    def __init__(self) -> None:
        self.snapshots: dict[int, int | None] = {}  # barrier -> snapshot at it

    def span(self, after: int, to: int) -> InputRange:
        return InputRange(
            table=TABLE,
            from_barrier=after,
            to_barrier=to,
            from_snapshot=self.snapshots.get(after),
            to_snapshot=self.snapshots.get(to),
        )


@pytest.fixture
def table(catalog: Catalog) -> Table:
    return ensure_table(catalog, TABLE, SCHEMA)


@pytest.fixture
def ranges() -> Ranges:
    return Ranges()


def data_file(table: Table, name: str, keys: list[int], value: str) -> Any:
    path = f"{table.location()}/data/{name}.parquet"
    local = path.removeprefix("file://")
    os.makedirs(local.rsplit("/", 1)[0], exist_ok=True)
    pq.write_table(pa.table({"k": keys, "v": [value] * len(keys)}, schema=SCHEMA), local)
    return parquet_file_to_data_file(io=table.io, table_metadata=table.metadata, file_path=path)


def commit(table: Table, barrier: int, batch: int, added: list[Any], deleted: list[Any]) -> int:
    stamp = {SUMMARY_BARRIER: str(barrier), SUMMARY_JOB: "up", SUMMARY_BATCH: str(batch)}
    snapshot = commit_files(table, stamp, added, deleted)
    table.refresh()
    return snapshot


def names(paths: list[str]) -> list[str]:
    return sorted(Path(p).name for p in paths)


def planned(table: Table, ranges: Ranges, after: int, upto: int) -> list[str]:
    """The files the sink reads for the batch (after, upto] of ``job.source(TABLE)``."""
    return names(plan_input(table, StreamedInput(TABLE), ranges.span(after, upto)).files)


def changelog(table: Table, ranges: Ranges, after: int, upto: int) -> tuple[list[str], ...]:
    """(removed, added) files of the batch of ``job.source(TABLE, changelog=True)``."""
    plan = plan_input(table, StreamedInput(TABLE, changelog=True), ranges.span(after, upto))
    assert plan.changes is not None and not plan.files
    return names(plan.changes.removed), names(plan.changes.added)


def upsert(table: Table, barrier: int, batch: int) -> int:
    """Key 2 becomes "b", key 3 is new, key 1 is kept by rewriting its file."""
    live = data_files(table, None)
    added = [data_file(table, f"b{batch}", [2, 3], "b"), data_file(table, f"rw{batch}", [1], "a")]
    return commit(table, barrier, batch, added, live)


def test_a_range_with_an_upsert_is_refused_with_how_to_read_the_table(
    table: Table, ranges: Ranges
) -> None:
    s0 = commit(table, 1000, 0, [data_file(table, "b0", [1, 2], "a")], [])
    s1 = upsert(table, 2000, 1)
    ranges.snapshots = {1000: s0, 2000: s1}

    with pytest.raises(NotAppendOnly) as refused:
        planned(table, ranges, 1000, 2000)
    message = str(refused.value)
    assert f"table {TABLE} is not append-only" in message
    assert f"snapshot {s1} is a overwrite snapshot" in message
    assert f"job.source('{TABLE}', changelog=True)" in message
    assert f"lookups=['{TABLE}']" in message and f"ctx.read('{TABLE}')" in message
    # A first read of the same table is its state at the barrier, upsert included.
    assert planned(table, ranges, 0, 2000) == ["b1.parquet", "rw1.parquet"]


def test_a_changelog_read_of_an_upsert_reads_the_replaced_and_the_new_files(
    table: Table, ranges: Ranges
) -> None:
    s0 = commit(table, 1000, 0, [data_file(table, "b0", [1, 2], "a")], [])
    s1 = upsert(table, 2000, 1)
    ranges.snapshots = {1000: s0, 2000: s1}

    assert changelog(table, ranges, 1000, 2000) == (["b0.parquet"], ["b1.parquet", "rw1.parquet"])
    # A first read: everything live at the end, nothing removed.
    assert changelog(table, ranges, 0, 2000) == ([], ["b1.parquet", "rw1.parquet"])
    assert changelog(table, ranges, 2000, 2000) == ([], [])


def test_files_added_and_removed_inside_a_changelog_range_cancel_out(
    table: Table, ranges: Ranges
) -> None:
    s0 = commit(table, 1000, 0, [data_file(table, "b0", [1, 2], "a")], [])
    upsert(table, 1500, 1)  # b0 -> b1 + rw1
    s2 = upsert(table, 2000, 2)  # b1 + rw1 -> b2 + rw2
    s3 = commit(table, 3000, 3, [data_file(table, "b3", [7], "c")], [])
    ranges.snapshots = {1000: s0, 2000: s2, 3000: s3}

    # b1 and rw1 came and went inside (1000, 2000]: only b0 before, b2 and rw2 after.
    assert changelog(table, ranges, 1000, 2000) == (["b0.parquet"], ["b2.parquet", "rw2.parquet"])
    # An append-only range: only added files.
    assert changelog(table, ranges, 2000, 3000) == ([], ["b3.parquet"])
    assert changelog(table, ranges, 1000, 3000) == (
        ["b0.parquet"],
        ["b2.parquet", "b3.parquet", "rw2.parquet"],
    )


def test_a_changelog_read_of_a_delete_reads_the_removed_file(table: Table, ranges: Ranges) -> None:
    s0 = commit(table, 1000, 0, [data_file(table, "b0", [1, 2], "a")], [])
    s1 = commit(table, 2000, 1, [], data_files(table, None))  # a delete snapshot
    ranges.snapshots = {1000: s0, 2000: s1}

    assert table.snapshot_by_id(s1).summary.operation.value == "delete"  # type: ignore[union-attr]
    assert changelog(table, ranges, 1000, 2000) == (["b0.parquet"], [])
    with pytest.raises(NotAppendOnly, match="is a delete snapshot"):
        planned(table, ranges, 1000, 2000)


def test_a_reader_added_after_expiry_reads_the_full_state(table: Table, ranges: Ranges) -> None:
    ids = [
        commit(table, 1000 * (i + 1), i, [data_file(table, f"f{i}", [i], "x")], [])
        for i in range(3)
    ]
    table.maintenance.expire_snapshots().by_ids(ids[:2]).commit()
    table.refresh()
    ranges.snapshots = {1000: ids[0], 2000: ids[1], 3000: ids[2]}

    # A new reader: no start snapshot.
    assert planned(table, ranges, 0, 3000) == ["f0.parquet", "f1.parquet", "f2.parquet"]
    # A reader whose start snapshot was expired since.
    assert planned(table, ranges, 1000, 3000) == ["f0.parquet", "f1.parquet", "f2.parquet"]
    assert changelog(table, ranges, 1000, 3000) == (
        [],
        ["f0.parquet", "f1.parquet", "f2.parquet"],
    )
    # Its start still exists: the increments only.
    s3 = commit(table, 4000, 3, [data_file(table, "f3", [3], "x")], [])
    ranges.snapshots[4000] = s3
    assert planned(table, ranges, 3000, 4000) == ["f3.parquet"]


def test_a_range_is_the_metaservices_mapping_not_a_late_stamp(table: Table, ranges: Ranges) -> None:
    s0 = commit(table, 1000, 0, [data_file(table, "f0", [0], "x")], [])
    s1 = commit(table, 2000, 1, [data_file(table, "f1", [1], "x")], [])
    # A zombie driver commits a late snapshot stamped with an old barrier; the
    # MetaService refused its report, so its mapping still says s1 at 2000.
    commit(table, 1500, 9, [data_file(table, "zombie", [9], "x")], [])
    ranges.snapshots = {1000: s0, 2000: s1}

    assert planned(table, ranges, 1000, 2000) == ["f1.parquet"]
    assert changelog(table, ranges, 1000, 2000) == ([], ["f1.parquet"])


def test_an_empty_range_reads_nothing(table: Table, ranges: Ranges) -> None:
    assert planned(table, ranges, 5000, 5000) == []


def test_the_barrier_source_plans_one_empty_partition_and_asks_nothing() -> None:
    options = {"url": "http://unused", "job": "reader", "table": TABLE, "catalog": "{}"}
    stream = BarrierStreamReader(options, T.StructType([T.StructField("k", T.LongType())]))
    stream._client = object()  # any call to the MetaService would fail

    parts = stream.partitions({"barrier": 1000}, {"barrier": 5000})
    assert len(parts) == 1 and isinstance(parts[0], NoRows)
    assert list(stream.read(parts[0])) == []
