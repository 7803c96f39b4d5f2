"""Revision mode with real Spark: a derived table revised from a barrier with corrected
logic, its revision job catching up on the mirror, and the swap that makes it the table,
while a reader samples consistent versions (each entirely old or entirely new)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import spark_barrier
from spark_barrier import BarrierConfigError, BatchContext
from tests.spark_barrier.pipeline import NUMBERS_SCHEMA, DrivenSource, Service

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SOURCE, VALUES = "ods.numbers", "dw.values"
VALUES_SCHEMA = T.StructType(
    [T.StructField("id", T.LongType()), T.StructField("value", T.LongType())]
)


def register(spark: Any, service: Service, **kwargs: Any) -> spark_barrier.BarrierJob:
    return spark_barrier.register(
        spark, service.url, catalog=service.catalog, state_dir=service.state_dir, **kwargs
    )


def times(k: int, starts: list[int | None]) -> Callable[[DataFrame, BatchContext], DataFrame]:
    def transform(batch: DataFrame, ctx: BatchContext) -> DataFrame:
        starts.append(ctx.start_barrier)
        return batch.select("id", (F.col("id") * k).alias("value"))

    return transform


def wait_until(
    condition: Callable[[], bool], what: str, queries: list[Any], timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for q in queries:
            assert q.exception() is None, f"{q.name}: {q.exception()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def values_at(service: Service, table: str, snapshot: int | None) -> dict[int, int]:
    if snapshot is None:
        return {}
    rows = service.catalog.load_table(table).scan(snapshot_id=snapshot).to_arrow().to_pylist()
    return {r["id"]: r["value"] for r in rows}


class Sampler(threading.Thread):
    """Reads the consistent version of both tables every 200 ms (pyiceberg, by the
    tables' names in the catalog) and classifies each sample: ``old`` when every value
    follows the original logic, ``new`` when it follows the revision's (x2 up to the
    revision's barrier, x3 after), else ``mixed``; reads that lose a race with the
    swap's renaming (a snapshot the table loaded by name does not have) are retried."""

    def __init__(self, service: Service) -> None:
        super().__init__(daemon=True)
        self.service = service
        self.from_barrier: int | None = None
        self.samples: list[tuple[int, str]] = []  # (barrier, kind)
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # kept for the test to look at; the next sample is a retry
                self.errors.append(repr(exc)[:300])

    def sample(self) -> tuple[int, str]:
        version = self.service.client.consistent_version([SOURCE, VALUES])
        sources = self.service.catalog.load_table(SOURCE)
        ids = {}
        if version.snapshots[SOURCE] is not None:
            for row in sources.scan(snapshot_id=version.snapshots[SOURCE]).to_arrow().to_pylist():
                ids[row["id"]] = row["barrier"]
        values = values_at(self.service, VALUES, version.snapshots[VALUES])
        if set(values) != set(ids):
            return version.barrier, "incomplete"
        old = all(v == 2 * i for i, v in values.items())
        b = self.from_barrier
        new = b is not None and all(v == (2 if ids[i] <= b else 3) * i for i, v in values.items())
        kind = {(True, False): "old", (False, True): "new", (True, True): "either"}
        return version.barrier, kind.get((old, new), "mixed")


def test_a_revised_job_rewrites_its_table_from_the_barrier_and_the_swap_switches_readers_at_once(
    spark: Any, service: Service
) -> None:
    ingest = register(spark, service, job="ingest", outputs={SOURCE: NUMBERS_SCHEMA})
    feed = DrivenSource(spark, service, "ingest", SOURCE)
    double = register(
        spark, service, job="double", inputs=[SOURCE], outputs={VALUES: VALUES_SCHEMA}
    )
    old_starts: list[int | None] = []
    original = double.start(
        double.source(SOURCE), double.sink(transform=times(2, old_starts)), trigger_seconds=0.3
    )
    queries = [original]
    jobs = [ingest, double]
    sampler = Sampler(service)

    def revised_query(revision: int) -> Any:
        revised = register(
            spark,
            service,
            job="double",
            inputs=[SOURCE],
            outputs={VALUES: VALUES_SCHEMA},
            revision=revision,
        )
        jobs.append(revised)
        query = revised.start(
            revised.source(SOURCE),
            revised.sink(transform=times(3, new_starts)),
            trigger_seconds=0.3,
        )
        queries.append(query)
        return revised, query

    def caught_up(job: str) -> Callable[[], bool]:
        last = feed.rows[-1][1]
        return lambda: service.client.get_job(job).frontier >= last

    new_starts: list[int | None] = []
    try:
        for _ in range(3):
            feed.batch(rows=3)
        wait_until(caught_up("double"), "double", queries)
        version = service.client.consistent_version([VALUES])
        from_barrier = version.barrier
        sampler.start()
        revision = service.client.create_revision(VALUES, from_barrier)
        sampler.from_barrier = from_barrier
        mirror = next(m.mirror for m in revision.tables if m.table == VALUES)

        with pytest.raises(BarrierConfigError, match="has no part in revision"):
            register(
                spark, service, job="ingest", outputs={SOURCE: NUMBERS_SCHEMA}, revision=revision.id
            )
        revised, query = revised_query(revision.id)
        assert revised.name == f"double__rev{revision.id}" and revised.outputs == [mirror]
        for _ in range(3):
            feed.batch(rows=3)
        wait_until(caught_up(revised.name), "the revision job", queries)
        on_mirror = service.client.consistent_version([mirror])
        got = values_at(service, mirror, on_mirror.snapshots[mirror])

        swapped = service.client.swap_revision(revision.id, wait_seconds=120)
        assert swapped.state == "swapped", swapped
        # The revision query may stop first (an idle slot's batch already looks for the
        # mirror by its old name): its error is checked below, once it has stopped.
        wait_until(lambda: not original.isActive, "the original query to stop", [])
        assert "replaced by a revision" in str(original.exception())
        queries.remove(original)
        feed.batch(rows=3)
        time.sleep(3)
        # It named the mirror, gone by that name: it stops, saying to restart it.
        wait_until(lambda: not query.isActive, "the revision query to stop", [])
        assert "restart this driver with the same code" in str(query.exception()), str(
            query.exception()
        )[:3000]
        queries.remove(query)
        revised.close()
        revised, query = revised_query(revision.id)
        assert revised.name == f"double__rev{revision.id}" and revised.outputs == [VALUES]
        feed.batch(rows=3)
        wait_until(caught_up(revised.name), "the revision job after the swap", queries)
    finally:
        sampler.done.set()
        for q in queries:
            spark_barrier.stop_between_batches(q)
        for job in jobs:
            job.close()
    sampler.join(10)

    # The revision job started at the barrier: it read only what came after it. (The
    # advancer may have moved it, still idle, past slots where its input did not change
    # before its query ran: then it starts there, and no row lies in between.)
    start = min(s or 0 for s in new_starts) if new_starts else None
    assert start is not None and start >= from_barrier, (start, from_barrier)
    assert not [i for i, b in feed.rows if from_barrier < b <= start], (start, feed.rows)
    assert got == {i: (2 if b <= from_barrier else 3) * i for i, b in feed.rows[:18]}
    # No data file was copied: the mirror's files before the barrier are the original's.
    # After the swap the table is the revision's, and the pipeline went on writing it.
    final = service.client.consistent_version([SOURCE, VALUES])
    assert final.barrier >= feed.rows[-1][1]
    expected = {i: (2 if b <= from_barrier else 3) * i for i, b in feed.rows}
    assert values_at(service, VALUES, final.snapshots[VALUES]) == expected
    kinds = [kind for _, kind in sampler.samples]
    assert "mixed" not in kinds and "incomplete" not in kinds, sampler.samples
    # Only a read racing the swap's renaming may fail (a snapshot id missing from the
    # table loaded by name a moment later), never two in a row of many.
    assert len(sampler.errors) <= 2 and len(sampler.samples) > 20, (sampler.errors, kinds)
    assert "old" in kinds and "new" in kinds, sampler.samples
    first_new = kinds.index("new")
    assert "old" not in kinds[first_new:], "a reader went back to the old table"
    barriers = [b for b, _ in sampler.samples]
    assert barriers == sorted(barriers), "consistent versions went back"
