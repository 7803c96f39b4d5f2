"""Exactly once across driver crashes: a derived job's driver process dies between
write and commit, and between commit and report, and restarts from its checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import spark_barrier
from spark_barrier.faults import ENV, EXIT_CODE
from spark_barrier.iceberg.stamps import list_stamped_snapshots
from tests.spark_barrier.derived_driver import SOURCE, TARGET
from tests.spark_barrier.pipeline import NUMBERS_SCHEMA, DrivenSource, Service

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def run_driver(service: Service, until: int, crash_at: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if crash_at:
        env[ENV] = crash_at
    args = [service.url, service.db_url, service.warehouse, str(service.state_dir), str(until)]
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark_barrier.derived_driver", *args],
        cwd=ROOT,
        env=env,
        timeout=300,
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, EXIT_CODE):
        print(done.stdout[-3000:], done.stderr[-6000:])
    return done.returncode


def wait_until_sealed(service: Service, job: str, barrier: int) -> None:
    deadline = time.monotonic() + 30
    while service.client.get_table(SOURCE).frontier < barrier:
        assert time.monotonic() < deadline, f"{job} did not reach {barrier}"
        time.sleep(0.2)


def test_derived_driver_killed_mid_batch_restarts_without_duplicates_or_gaps(spark, service):
    spark_barrier.register(
        spark,
        service.url,
        job="src_numbers",
        outputs={SOURCE: NUMBERS_SCHEMA},
        catalog=service.catalog,
        state_dir=service.state_dir,
        outbox=False,
    ).close()
    numbers = DrivenSource(spark, service, "src_numbers", SOURCE)

    numbers.batch(rows=50)
    last = numbers.batch(rows=50)
    wait_until_sealed(service, "src_numbers", last)
    # Dies after its first data batch is committed to Iceberg, before the report.
    assert run_driver(service, last, crash_at="after_commit:*") == EXIT_CODE
    copy = service.catalog.load_table(TARGET)
    assert len(list_stamped_snapshots(copy)) == 1

    last = numbers.batch(rows=50)
    wait_until_sealed(service, "src_numbers", last)
    # Replays the committed batch (reports it, writes nothing), then dies in the next
    # batch after writing its files and before committing them.
    assert run_driver(service, last, crash_at="after_write:*") == EXIT_CODE

    last = numbers.batch(rows=50)
    wait_until_sealed(service, "src_numbers", last)
    assert run_driver(service, last, crash_at=None) == 0

    copy.refresh()
    rows = copy.scan().to_arrow().to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(i for i, _ in numbers.rows)  # no dups, no gaps
    stamped = list_stamped_snapshots(copy)
    assert len({s.batch for s in stamped}) == len(stamped)  # one snapshot per batch
    reported = service.client.table_snapshots(TARGET, limit=1000).items
    assert sorted(s.snapshot_id for s in reported if s.snapshot_id) == sorted(
        s.snapshot_id for s in stamped
    )  # every committed snapshot has its report
