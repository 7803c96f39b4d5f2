"""Faults with real processes while a real Spark pipeline runs (G1, G3, G4).

The pipeline (``tests/faults/pipeline.py``) runs in this process's shared
SparkSession against the MetaService as a child process. Afterwards every
committed snapshot must have its report, barriers never went backwards, no batch
committed twice, and consistent versions still equal recomputing the derived
table from the source.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from metaservice.client import MetaServiceClient
from tests.faults.pipeline import (
    DERIVED,
    SOURCE,
    Pipeline,
    check_after_fault,
    derived_batches,
    wait_until,
)
from tests.faults.processes import PrivatePostgres, ServiceProcess

pytestmark = [pytest.mark.spark, pytest.mark.faults, pytest.mark.slow]

INTERVAL_MS = 500
OUTAGE_S = 8.0


def _run_until_caught_up(pipeline: Pipeline, client: MetaServiceClient, last_source: int) -> None:
    """Until a consistent version covers what the source committed during the fault."""

    def caught_up() -> bool:
        pipeline.check_running()
        try:
            version = client.consistent_version([SOURCE, DERIVED])
        except Exception:
            return False
        return version.barrier >= last_source

    try:
        wait_until(caught_up, 120, "the derived job to catch up after the fault")
    except AssertionError as exc:
        jobs = [j.model_dump() for j in client.all_jobs()]
        raise AssertionError(f"{exc}; source committed up to {last_source}; jobs: {jobs}") from None


def test_service_sigkilled_mid_pipeline_then_restarted_loses_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'metaservice.db'}"
    with (
        ServiceProcess(db_url, tmp_path / "service.log", barrier_interval_ms=INTERVAL_MS) as ms,
        MetaServiceClient(ms.url) as client,
    ):
        pipeline = Pipeline(spark, ms.url, tmp_path)
        pipeline.start()
        try:
            wait_until(lambda: derived_batches(client) >= 2, 120, "two derived batches")
            pipeline.check_running()
            before = len(pipeline.stamped(SOURCE))

            ms.kill()  # SIGKILL: no shutdown hooks, in-flight requests cut
            killed_at = time.monotonic()
            time.sleep(OUTAGE_S)
            during = pipeline.stamped(SOURCE)[before:]
            pipeline.check_running()
            ms.restart()
            down_s = time.monotonic() - killed_at

            # G4: the source job went on committing while the service was down.
            assert len(during) >= 3, f"only {len(during)} source batches in {down_s:.1f} s down"
            _run_until_caught_up(pipeline, client, during[-1].barrier)
        finally:
            pipeline.stop()
        counts = check_after_fault(pipeline, client)
    assert ms.log().count("=== start") == 2
    assert counts["consistent versions checked"] >= 2, counts


def test_postgres_restarted_mid_pipeline_loses_nothing(spark: SparkSession, tmp_path: Path) -> None:
    with (
        PrivatePostgres() as pg,
        ServiceProcess(pg.url, tmp_path / "service.log", barrier_interval_ms=INTERVAL_MS) as ms,
        MetaServiceClient(ms.url) as client,
    ):
        pipeline = Pipeline(spark, ms.url, tmp_path)
        pipeline.start()
        try:
            wait_until(lambda: derived_batches(client) >= 2, 120, "two derived batches")
            before = len(pipeline.stamped(SOURCE))

            pg.stop("immediate")  # crash-like: connections dropped, recovery on start
            time.sleep(OUTAGE_S)
            during = pipeline.stamped(SOURCE)[before:]
            pipeline.check_running()
            assert ms.alive(), "the service must survive its database going away"
            pg.start()

            assert len(during) >= 3, f"only {len(during)} source batches while PostgreSQL was down"
            _run_until_caught_up(pipeline, client, during[-1].barrier)
        finally:
            pipeline.stop()
        counts = check_after_fault(pipeline, client)
    assert "database_unavailable" in ms.log() or "database unreachable" in ms.log()
    assert counts["consistent versions checked"] >= 2, counts
