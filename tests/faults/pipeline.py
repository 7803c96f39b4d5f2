"""A two-job Spark pipeline for the fault tests, and the checks run after a fault.

``ingest`` (source job, a rate source) appends ids to ``ods.events``; ``double``
(derived job) reads them through its barrier source and appends ``(id, 2 * id)``
to ``dw.doubled``. The Iceberg catalog is a SQLite file of its own, so a fault of
the MetaService's database touches only the MetaService.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery

import spark_barrier
from metaservice.client import MetaServiceClient, MetaServiceError
from spark_barrier import BatchContext
from spark_barrier.iceberg.catalog import open_catalog
from spark_barrier.iceberg.read import read_snapshot
from spark_barrier.iceberg.stamps import list_stamped_snapshots
from tests.faults.workload import all_recorded

SOURCE, DERIVED = "ods.events", "dw.doubled"
EVENTS = T.StructType([T.StructField("id", T.LongType())])
DOUBLED = T.StructType([T.StructField("id", T.LongType()), T.StructField("twice", T.LongType())])


def _double(events: DataFrame, ctx: BatchContext) -> DataFrame:
    return events.select("id", (F.col("id") * 2).alias("twice"))


@dataclass
class Pipeline:
    spark: SparkSession
    url: str
    root: Path
    queries: list[StreamingQuery] = field(default_factory=list)
    jobs: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.catalog_uri = f"sqlite:///{self.root / 'catalog.db'}"
        self.warehouse = str(self.root / "tables")
        self.catalog = open_catalog(self.catalog_uri, self.warehouse)

    def _register(self, **kwargs: Any) -> Any:
        job = spark_barrier.register(
            self.spark,
            self.url,
            catalog_uri=self.catalog_uri,
            warehouse=self.warehouse,
            catalog=self.catalog,
            state_dir=self.root / "state",
            **kwargs,
        )
        self.jobs.append(job)
        return job

    def start(self) -> None:
        ingest = self._register(job="ingest", outputs={SOURCE: EVENTS})
        double = self._register(job="double", inputs=[SOURCE], outputs={DERIVED: DOUBLED})
        rate = (
            self.spark.readStream.format("rate")
            .option("rowsPerSecond", 20)
            .load()
            .select(F.col("value").alias("id"))
        )
        self.queries.append(ingest.start(rate, ingest.sink(), trigger_seconds=0.5))
        self.queries.append(
            double.start(double.source(SOURCE), double.sink(transform=_double), trigger_seconds=0.5)
        )

    def stop(self) -> None:
        for query in self.queries:
            spark_barrier.stop_between_batches(query)
        for job in self.jobs:
            job.close(timeout=60)

    def check_running(self) -> None:
        for query in self.queries:
            assert query.isActive, f"query {query.name} died: {query.exception()}"

    def stamped(self, table: str) -> list[Any]:
        return list_stamped_snapshots(self.catalog.load_table(table))

    def content(self, table: str, snapshot_id: int | None) -> list[tuple[Any, ...]]:
        if snapshot_id is None:
            return []
        frame = read_snapshot(self.spark, self.catalog.load_table(table), snapshot_id)
        return sorted(tuple(r) for r in frame.collect())


def wait_until(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


def derived_batches(client: MetaServiceClient) -> int:
    try:
        return len(all_recorded(client, DERIVED))
    except MetaServiceError:
        return 0


def check_after_fault(pipeline: Pipeline, client: MetaServiceClient) -> dict[str, int]:
    """What must hold after any fault: every committed snapshot reported with its
    stamp, barriers never backwards, no row twice, and consistent versions equal to
    recomputing the derived table from the source (G1). Returns a few counts."""
    counts: dict[str, int] = {}
    for table in (SOURCE, DERIVED):
        stamped = pipeline.stamped(table)
        reported = {
            (r.snapshot_id, r.barrier, r.job, r.batch_id)
            for r in all_recorded(client, table)
            if r.snapshot_id is not None
        }
        committed = {(s.snapshot_id, s.barrier, s.job, s.batch) for s in stamped}
        assert committed == reported, (
            f"{table}: committed but not reported {sorted(committed - reported)}, "
            f"reported but not committed {sorted(reported - committed)}"
        )
        barriers = [s.barrier for s in stamped]  # in commit order
        assert barriers == sorted(barriers), f"{table}: barriers went backwards: {barriers}"
        batches = [s.batch for s in stamped]
        assert batches == sorted(set(batches)), f"{table}: a batch committed twice: {batches}"
        counts[f"{table} snapshots"] = len(stamped)
    derived_rows = pipeline.content(DERIVED, pipeline.stamped(DERIVED)[-1].snapshot_id)
    assert len(derived_rows) == len(set(derived_rows)), "a row of the derived table twice"
    checked = 0
    stamped = pipeline.stamped(DERIVED)
    sample = stamped[:: max(1, len(stamped) // 8)] + stamped[-1:]  # reading costs ~0.3 s each
    for s in sample:
        version = client.consistent_version([SOURCE, DERIVED], at_or_before=s.barrier)
        source = pipeline.content(SOURCE, version.snapshots[SOURCE])
        derived = pipeline.content(DERIVED, version.snapshots[DERIVED])
        assert derived == sorted((i, 2 * i) for (i,) in source), (
            f"G1: at barrier {version.barrier} the derived table is not the source doubled"
        )
        checked += 1
    counts["consistent versions checked"] = checked
    return counts
