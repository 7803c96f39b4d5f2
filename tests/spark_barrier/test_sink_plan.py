"""The sink and the batch Spark planned, without Spark: the planned offsets and the
query id are what spark_barrier.jvm would read from the running query."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import types as T

from metaservice.barriers.schemas import BatchBarrier
from metaservice.client import ConflictError
from spark_barrier import BarrierBatchError, BarrierJob
from spark_barrier import sink as sink_module
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.jvm import PlannedScan
from spark_barrier.source import SOURCE_NAME

SCHEMA = T.StructType([T.StructField("id", T.LongType())])


class Client:
    """Records barrier requests; answers with ``answer`` (a BatchBarrier or an error)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[dict[str, Any]] = []

    def batch_barrier(self, job: str, batch_id: int, **body: Any) -> BatchBarrier:
        self.asked.append({"batch_id": batch_id, **body})
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]


class Reporter:
    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def report(self, report: dict[str, Any]) -> None:
        self.reports.append(report)


def scan(table: str, start: int, end: int, job: str = "join") -> PlannedScan:
    return PlannedScan(
        SOURCE_NAME, {"job": job, "table": table}, {"barrier": start}, {"barrier": end}
    )


@pytest.fixture
def make(catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    ensure_table(catalog, "dw.out", SCHEMA)
    monkeypatch.setattr(sink_module, "running_query_id", lambda spark, name: "q-1")

    def build(answer: Any, scans: list[PlannedScan], inputs: list[str]) -> tuple[Any, ...]:
        monkeypatch.setattr(sink_module, "planned_scans", lambda spark, query, batch: scans)
        client, reporter = Client(answer), Reporter()
        job = BarrierJob(
            spark=None,  # type: ignore[arg-type]
            client=client,  # type: ignore[arg-type]
            catalog=catalog,
            catalog_options={},
            name="join",
            inputs=inputs,
            outputs=["dw.out"],
            state_dir=tmp_path,
            reporter=reporter,  # type: ignore[arg-type]
        )
        return job.sink("dw.out"), client, reporter

    return build


def test_sources_that_planned_different_ends_stop_the_batch_before_anything(make: Any) -> None:
    scans = [scan("ods.a", 1000, 3000), scan("ods.b", 1000, 1000)]
    sink, client, reporter = make(None, scans, ["ods.a", "ods.b"])
    with pytest.raises(BarrierBatchError, match=r"planned different batches: ods.a \(1000, 3000\]"):
        sink(None, 4)
    assert client.asked == [] and reporter.reports == []


def test_an_empty_range_is_skipped_without_asking(make: Any) -> None:
    scans = [scan("ods.a", 2000, 2000), scan("ods.b", 2000, 2000), scan("x", 0, 9, job="other")]
    sink, client, reporter = make(None, scans, ["ods.a", "ods.b"])
    sink(None, 0)
    assert client.asked == [] and reporter.reports == []


def test_the_planned_offsets_and_query_go_with_the_barrier_request(make: Any) -> None:
    other = BatchBarrier(
        job="join", batch_id=4, barrier=2000, start_barrier=1000, committed=False
    )  # the MetaService gives another end than Spark planned
    sink, client, _ = make(other, [scan("ods.a", 1000, 3000)], ["ods.a"])
    with pytest.raises(BarrierBatchError, match=r"planned barriers \(1000, 3000\]") as error:
        sink(None, 4)
    assert error.value.code == "batch_plan_mismatch"
    assert client.asked == [{"batch_id": 4, "start": 1000, "end": 3000, "query_id": "q-1"}]


def test_a_reset_query_stops_with_what_happened_and_what_to_do(make: Any) -> None:
    reset = ConflictError(409, "query_reset", "job 'join' ran batches up to 7 in query q-0")
    sink, client, reporter = make(reset, [], [])  # a source job without offline grants
    with pytest.raises(BarrierBatchError, match="checkpoint was reset") as error:
        sink(None, 0)
    assert "original checkpoint" in str(error.value) and error.value.code == "query_reset"
    assert client.asked == [{"batch_id": 0, "start": None, "end": None, "query_id": "q-1"}]
    assert reporter.reports == []
