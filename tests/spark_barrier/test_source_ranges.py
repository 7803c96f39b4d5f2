"""What a barrier source reads for a batch (a, b], without Spark: the files its
``partitions`` plans from the MetaService's ranges (repros s8_upsert.py, s9_expired.py).

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
from spark_barrier.iceberg_io import (
    SUMMARY_BARRIER,
    SUMMARY_BATCH,
    SUMMARY_JOB,
    NotAppendOnly,
    _commit_files,
    _data_files,
    ensure_table,
)
from spark_barrier.source import BarrierStreamReader, FilePartition

SCHEMA = pa.schema([pa.field("k", pa.int64(), True), pa.field("v", pa.string(), True)])
TABLE = "ods.up"


class Ranges:
    """The MetaService's answer to GET /jobs/{job}/ranges, fixed by the test."""

    def __init__(self) -> None:
        self.snapshots: dict[int, int | None] = {}  # barrier -> snapshot at it
        self.asked: list[tuple[str, int, int]] = []

    def input_ranges(self, job: str, *, after: int, to: int) -> list[InputRange]:
        self.asked.append((job, after, to))
        return [
            InputRange(
                table=TABLE,
                from_barrier=after,
                to_barrier=to,
                from_snapshot=self.snapshots.get(after),
                to_snapshot=self.snapshots.get(to),
            )
        ]


@pytest.fixture
def table(catalog: Catalog) -> Table:
    return ensure_table(catalog, TABLE, SCHEMA)


@pytest.fixture
def reader(tmp_path: Path, warehouse: Path) -> tuple[BarrierStreamReader, Ranges]:
    options = {
        "url": "http://unused",
        "job": "reader",
        "table": TABLE,
        "catalog_uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": str(warehouse),
    }
    columns = T.StructType([T.StructField("k", T.LongType()), T.StructField("v", T.StringType())])
    stream = BarrierStreamReader(options, columns)
    ranges = Ranges()
    stream._client = ranges
    return stream, ranges


def data_file(table: Table, name: str, keys: list[int], value: str) -> Any:
    path = f"{table.location()}/data/{name}.parquet"
    local = path.removeprefix("file://")
    os.makedirs(local.rsplit("/", 1)[0], exist_ok=True)
    pq.write_table(pa.table({"k": keys, "v": [value] * len(keys)}, schema=SCHEMA), local)
    return parquet_file_to_data_file(io=table.io, table_metadata=table.metadata, file_path=path)


def commit(table: Table, barrier: int, batch: int, added: list[Any], deleted: list[Any]) -> int:
    stamp = {SUMMARY_BARRIER: str(barrier), SUMMARY_JOB: "up", SUMMARY_BATCH: str(batch)}
    snapshot = _commit_files(table, stamp, added, deleted)
    table.refresh()
    return snapshot


def planned(stream: BarrierStreamReader, after: int, upto: int) -> list[str]:
    parts = stream.partitions({"barrier": after}, {"barrier": upto})
    return sorted(
        Path(p.path).name for p in parts if isinstance(p, FilePartition) and p.path is not None
    )


def test_a_range_with_an_upsert_is_refused_with_how_to_read_the_table(
    table: Table, reader: tuple[BarrierStreamReader, Ranges]
) -> None:
    stream, ranges = reader
    s0 = commit(table, 1000, 0, [data_file(table, "b0", [1, 2], "a")], [])
    # An upsert: key 2 becomes "b", key 3 is new, key 1 kept by rewriting its file.
    live = _data_files(table, None)
    added = [data_file(table, "b1", [2, 3], "b"), data_file(table, "rw1", [1], "a")]
    s1 = commit(table, 2000, 1, added, live)
    ranges.snapshots = {1000: s0, 2000: s1}

    with pytest.raises(NotAppendOnly) as refused:
        planned(stream, 1000, 2000)
    message = str(refused.value)
    assert f"table {TABLE} is not append-only" in message
    assert f"snapshot {s1} is a overwrite snapshot" in message
    assert f"lookups=['{TABLE}']" in message and f"ctx.read('{TABLE}')" in message
    # A first read of the same table is its state at the barrier, upsert included.
    assert planned(stream, 0, 2000) == ["b1.parquet", "rw1.parquet"]


def test_a_reader_added_after_expiry_reads_the_full_state(
    table: Table, reader: tuple[BarrierStreamReader, Ranges]
) -> None:
    stream, ranges = reader
    ids = [
        commit(table, 1000 * (i + 1), i, [data_file(table, f"f{i}", [i], "x")], [])
        for i in range(3)
    ]
    table.maintenance.expire_snapshots().by_ids(ids[:2]).commit()
    table.refresh()
    ranges.snapshots = {1000: ids[0], 2000: ids[1], 3000: ids[2]}

    # A new reader: no start snapshot.
    assert planned(stream, 0, 3000) == ["f0.parquet", "f1.parquet", "f2.parquet"]
    # A reader whose start snapshot was expired since.
    assert planned(stream, 1000, 3000) == ["f0.parquet", "f1.parquet", "f2.parquet"]
    # Its start still exists: the increments only.
    s3 = commit(table, 4000, 3, [data_file(table, "f3", [3], "x")], [])
    ranges.snapshots[4000] = s3
    assert planned(stream, 3000, 4000) == ["f3.parquet"]


def test_a_range_is_the_metaservices_mapping_not_a_late_stamp(
    table: Table, reader: tuple[BarrierStreamReader, Ranges]
) -> None:
    stream, ranges = reader
    s0 = commit(table, 1000, 0, [data_file(table, "f0", [0], "x")], [])
    s1 = commit(table, 2000, 1, [data_file(table, "f1", [1], "x")], [])
    # A zombie driver commits a late snapshot stamped with an old barrier; the
    # MetaService refused its report, so its mapping still says s1 at 2000.
    commit(table, 1500, 9, [data_file(table, "zombie", [9], "x")], [])
    ranges.snapshots = {1000: s0, 2000: s1}

    assert planned(stream, 1000, 2000) == ["f1.parquet"]
    assert ranges.asked == [("reader", 1000, 2000)]


def test_an_empty_range_asks_nothing(reader: tuple[BarrierStreamReader, Ranges]) -> None:
    stream, ranges = reader
    assert planned(stream, 5000, 5000) == []
    assert ranges.asked == []
