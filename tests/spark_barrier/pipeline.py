"""Building blocks of the pipeline tests: an embedded MetaService whose database is also
the Iceberg catalog, and a source job driven from the test itself."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from examples.embedded import EmbeddedMetaService
from metaservice.client import MetaServiceClient
from metaservice.settings import Settings
from spark_barrier.iceberg.catalog import open_catalog
from spark_barrier.iceberg.commit import commit_batch

NUMBERS_SCHEMA = T.StructType(
    [T.StructField("id", T.LongType()), T.StructField("barrier", T.LongType())]
)


@dataclass
class Service:
    url: str
    db_url: str
    warehouse: str
    state_dir: Path
    client: MetaServiceClient
    catalog: Catalog

    @property
    def catalog_properties(self) -> dict[str, str]:
        """The pyiceberg properties of the catalog: SQL, in the MetaService's database."""
        return {"type": "sql", "uri": self.db_url, "warehouse": self.warehouse}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    """A real MetaService over HTTP on a free loopback port (port=0: not the default
    8765, which a test on another pytest worker may hold); its SQLite file is the catalog."""
    db_url = f"sqlite:///{tmp_path / 'metaservice.db'}"
    warehouse = str(tmp_path / "tables")
    settings = Settings(db_url=db_url, warehouse=warehouse, barrier_interval_ms=500, port=0)
    with EmbeddedMetaService(settings) as url, MetaServiceClient(url) as client:
        yield Service(
            url, db_url, warehouse, tmp_path / "state", client, open_catalog(db_url, warehouse)
        )


class DrivenSource:
    """A source job whose batches the test commits by hand: Iceberg snapshot + report."""

    def __init__(self, spark: SparkSession, service: Service, job: str, table: str) -> None:
        self.spark = spark
        self.service = service
        self.job = job
        self.table = table
        self.batch_id = 0
        self.next_id = 0
        self.rows: list[tuple[int, int]] = []  # (id, barrier) of every committed row

    def open_batch(self) -> int:
        """Ask for the next batch's barrier (the batch stays open until ``commit``)."""
        return self.service.client.batch_barrier(self.job, self.batch_id).barrier

    def commit(self, barrier: int, rows: int) -> None:
        ids = list(range(self.next_id, self.next_id + rows))
        frame: DataFrame = self.spark.createDataFrame([(i, barrier) for i in ids], NUMBERS_SCHEMA)
        table = self.service.catalog.load_table(self.table)
        snapshot = commit_batch(frame, table, barrier=barrier, job=self.job, batch_id=self.batch_id)
        self.service.client.report_commit(self.job, self.batch_id, barrier, self.table, snapshot)
        self.rows.extend((i, barrier) for i in ids)
        self.next_id += rows
        self.batch_id += 1

    def batch(self, rows: int) -> int:
        barrier = self.open_batch()
        self.commit(barrier, rows)
        return barrier


def rate_numbers(spark: SparkSession, rows_per_second: int) -> DataFrame:
    """A rate stream as NUMBERS_SCHEMA rows: ids 0, 1, 2... (barrier 0: the sink stamps)."""
    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rows_per_second)
        .load()
        .select(F.col("value").alias("id"), F.lit(0).cast("long").alias("barrier"))
    )


def ids_of(frame: DataFrame) -> list[int]:
    return sorted(r.id for r in frame.select("id").collect())


def labelled(batch: DataFrame) -> DataFrame:
    """A batch of several inputs with its ``_table`` column as ``input``: ``ods.fast`` -> ``fast``."""
    return batch.withColumn("input", F.substring_index("_table", ".", -1)).drop("_table")
