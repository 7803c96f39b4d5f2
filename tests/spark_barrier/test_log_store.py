"""The log store with real Spark writers and readers: rows reach readers within a batch,
at least once, through a writer's crash and restart and a log service's restart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

import spark_barrier
from examples.embedded import EmbeddedMetaService
from metaservice.client import MetaServiceClient
from metaservice.contract import parse_log_files, parse_stamp
from metaservice.logstore import LogNotEnabled, LogReader
from metaservice.logstore.server import LogService
from metaservice.settings import Settings
from spark_barrier import BarrierConfigError
from spark_barrier.faults import ENV, EXIT_CODE
from spark_barrier.iceberg.catalog import open_catalog
from tests.spark_barrier import log_driver
from tests.spark_barrier.pipeline import NUMBERS_SCHEMA, Service, rate_numbers

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


class Follower:
    """A LogReader polling in a thread, keeping every row it was given."""

    def __init__(self, reader: LogReader, interval: float = 0.1) -> None:
        self.reader = reader
        self.parts: list[pa.Table] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        for rows in self.reader.follow(interval=interval, stop=self._stop.is_set):
            self.parts.append(rows)

    def ids(self) -> list[int]:
        return [i for part in self.parts for i in part.column("id").to_pylist()]

    def ids_from_the_log(self) -> set[int]:
        """Rows the log served (a row read from a snapshot has no log sequence number)."""
        return {
            row["id"]
            for part in self.parts
            for row in part.select(["id", "_log_seq"]).to_pylist()
            if row["_log_seq"] is not None
        }

    def ids_after_batch(self, batch: int) -> set[int]:
        """Rows the log served of batches after ``batch``."""
        return {
            row["id"]
            for part in self.parts
            for row in part.select(["id", "_log_batch", "_log_seq"]).to_pylist()
            if row["_log_seq"] is not None and row["_log_batch"] > batch
        }

    def until_caught_up(self, expected: set[int], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not expected <= set(self.ids()) and time.monotonic() < deadline:
            time.sleep(0.2)
        self._stop.set()
        self._thread.join(timeout=10)
        self.reader.close()


def _table_ids(service: Service, table: str) -> set[int]:
    rows = service.catalog.load_table(table).scan().to_arrow()
    return set(rows.column("id").to_pylist())


def _last_batch(service: Service, table: str) -> int:
    current = service.catalog.load_table(table).current_snapshot()
    stamp = parse_stamp(current.summary if current else None)
    assert stamp is not None
    return stamp.batch


def _drive(
    service: Service,
    tmp_path: Path,
    rows: int,
    crash: str | None = None,
    stop_file: Path | None = None,
) -> int:
    """Run the log driver (its log embedded) until the table holds ``rows`` rows (and
    ``stop_file`` exists, if given)."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV, log_driver.STOP_FILE_ENV)}
    if crash:
        env[ENV] = crash
    if stop_file:
        env[log_driver.STOP_FILE_ENV] = str(stop_file)
    args = [service.url, service.db_url, service.warehouse, str(tmp_path / "state"), str(rows)]
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark_barrier.log_driver", *args],
        cwd=ROOT,
        env=env,
        timeout=300,
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, EXIT_CODE):
        print(done.stdout[-3000:], done.stderr[-6000:])
    return done.returncode


def _log_published(service: Service, table: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            view = service.client.get_table(table)
        except Exception:  # not registered yet
            view = None
        if view is not None and view.log is not None:
            return view.log
        time.sleep(0.2)
    raise AssertionError(f"{table} never got a log")


def test_a_writer_killed_mid_batch_and_restarted_loses_no_row_for_its_log_readers(
    service: Service, tmp_path: Path
) -> None:
    """The driver (log embedded in it) dies after writing batch 3's files and appending
    its rows to the log, before the commit; it is started again, replays the batch on a
    new log service at a new address, and goes on. A reader following the table gets
    every row of the final table, rows from the log both before and after the restart,
    and nothing the table does not hold (the replayed batch has the same rows)."""
    results: list[int] = []
    first = threading.Thread(
        target=lambda: results.append(_drive(service, tmp_path, 10_000, "after_write:3"))
    )
    first.start()
    published = _log_published(service, log_driver.TABLE)
    assert published.mode == "embedded"
    reader = LogReader.from_metaservice(
        log_driver.TABLE, service.client, catalog=service.catalog, start="earliest"
    )
    follower = Follower(reader)
    first.join(timeout=300)
    assert results == [EXIT_CODE], "the first driver did not die at its crash point"
    crashed_at = set(follower.ids())

    # The restarted driver's first batch catches up on the rate stream's backlog and may
    # reach 200 rows at once; it goes on until the reader took a row from its log (its log
    # lives in its process), however slowly this machine lets the reader poll.
    stop_file = tmp_path / "stop-second-driver"
    second: list[int] = []
    restarted = threading.Thread(
        target=lambda: second.append(_drive(service, tmp_path, 200, stop_file=stop_file))
    )
    restarted.start()
    try:
        deadline = time.monotonic() + 180
        while not follower.ids_from_the_log() - crashed_at and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop_file.touch()
        restarted.join(timeout=300)
    assert second == [0], "the restarted driver did not stop cleanly"
    assert service.client.get_table(log_driver.TABLE).log.address != published.address

    table = _table_ids(service, log_driver.TABLE)
    follower.until_caught_up(table)
    delivered = follower.ids()
    assert table <= set(delivered), f"never delivered: {sorted(table - set(delivered))[:20]}"
    # A batch the driver's stop cut short after its append is replayed by its next run.
    extra = set(delivered) - table
    assert extra <= follower.ids_after_batch(_last_batch(service, log_driver.TABLE)), extra
    from_log = follower.ids_from_the_log()
    assert from_log & crashed_at, "no row came from the first driver's log"
    assert from_log - crashed_at, "the reader did not follow the restarted driver's log"


def test_read_log_streams_the_rows_of_a_job_with_an_external_log_through_its_restart(
    spark: Any, service: Service, tmp_path: Path
) -> None:
    """A job writes through an external log service, which is stopped and started again
    (a new epoch, nothing held) while the job runs: the job goes on committing, and
    ``read_log`` (a Spark stream) delivers every row of the table at least once."""
    log_service = LogService().start()
    port = log_service.port
    job = spark_barrier.register(
        spark,
        service.url,
        job="ingest_external",
        outputs={"ods.external_log": NUMBERS_SCHEMA},
        catalog_uri=service.db_url,
        warehouse=service.warehouse,
        catalog=service.catalog,
        state_dir=service.state_dir,
        log="external",
        log_url=log_service.url,
    )
    stream = rate_numbers(spark, 20)
    writer = job.start(stream, job.sink(), trigger_seconds=0.5)
    follow = spark_barrier.read_log(
        spark,
        service.url,
        "ods.external_log",
        catalog_properties=service.catalog_properties,
        start="earliest",
    )
    reader = (
        follow.writeStream.format("memory")
        .queryName("logged_rows")
        .trigger(processingTime="0.5 seconds")
        .start()
    )
    try:
        time.sleep(6)
        log_service.stop()
        time.sleep(3)  # the job commits without its log meanwhile
        log_service = LogService(port=port).start()
        time.sleep(6)
        spark_barrier.stop_between_batches(writer)
        table = _table_ids(service, "ods.external_log")
        deadline = time.monotonic() + 60
        seen: set[int] = set()
        got: list[Any] = []
        while time.monotonic() < deadline and not table <= seen:
            assert reader.exception() is None, reader.exception()
            got = spark.sql("SELECT id, _log_batch, _log_seq FROM logged_rows").collect()
            seen = {r.id for r in got}
            time.sleep(0.5)
    finally:
        reader.stop()
        spark_barrier.stop_between_batches(writer)
        job.close()
        log_service.stop()
    assert len(table) > 100, f"the job committed only {len(table)} rows"
    assert table <= seen, f"never delivered: {sorted(table - seen)[:20]}"
    # A batch the stop cut short after its append is replayed by the job's next run.
    last = _last_batch(service, "ods.external_log")
    cut_short = {r.id for r in got if r._log_seq is not None and r._log_batch > last}
    assert seen - table <= cut_short, f"not in the table: {sorted(seen - table)[:20]}"
    logged = spark.sql("SELECT count(*) AS n FROM logged_rows WHERE _log_seq IS NOT NULL")
    assert logged.collect()[0].n > 0, "no row came from the log"


def test_a_partitioned_table_logged_to_two_external_services_reaches_its_reader_by_partition(
    spark: Any, service: Service
) -> None:
    """A job writes a bucketed table through two external log services: each row goes to
    the service of its bucket (bucket modulo 2), and a LogReader merging both delivers
    every row of the table at least once, most of them from the logs."""
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import LongType

    from metaservice.logstore import LogClient
    from metaservice.logstore.store import LogStore

    table_name = "ods.two_logs"
    # Every persisted barrier kept: the test looks at which rows each service got.
    logs = [LogService(LogStore(keep_barriers=100_000)).start() for _ in range(2)]
    try:
        job = spark_barrier.register(
            spark,
            service.url,
            job="ingest_two_logs",
            outputs={table_name: NUMBERS_SCHEMA},
            partition_by={table_name: ["bucket(4, id)"]},
            catalog_uri=service.db_url,
            warehouse=service.warehouse,
            catalog=service.catalog,
            state_dir=service.state_dir,
            log="external",
            log_url=[s.url for s in logs],
        )
        published = service.client.get_table(table_name).log
        assert published is not None and published.addresses == [s.url for s in logs]
        follower = Follower(
            LogReader.from_metaservice(
                table_name, service.client, catalog=service.catalog, start="earliest"
            )
        )
        writer = job.start(rate_numbers(spark, 20), job.sink(), trigger_seconds=0.5)
        try:
            time.sleep(10)
        finally:
            spark_barrier.stop_between_batches(writer)
            job.close()
        table = _table_ids(service, table_name)
        follower.until_caught_up(table)
        held = []
        for log_service in logs:
            with LogClient(log_service.url) as client:
                rows = client.read(table_name, after_batch=-1).rows
            held.append(set() if rows is None else set(rows.column("id").to_pylist()))
    finally:
        for log_service in logs:
            log_service.stop()
    assert len(table) > 50, f"the job committed only {len(table)} rows"
    seen = set(follower.ids())
    assert table <= seen, f"never delivered: {sorted(table - seen)[:20]}"
    assert follower.ids_from_the_log(), "no row came from the logs"
    bucket = BucketTransform(4).pyarrow_transform(LongType())
    for index, ids in enumerate(held):
        assert ids, f"log service {index} got no row"
        buckets = bucket(pa.array(sorted(ids), pa.int64())).to_pylist()
        assert {b % 2 for b in buckets} == {index}, f"service {index} holds another's rows"
    assert table <= held[0] | held[1]


def test_log_options_are_checked_before_anything_is_registered(
    spark: Any, service: Service
) -> None:
    common: dict[str, Any] = {
        "job": "ingest_bad_log",
        "outputs": {"ods.bad_log": NUMBERS_SCHEMA},
        "catalog_uri": service.db_url,
        "warehouse": service.warehouse,
        "state_dir": service.state_dir,
    }
    cases = [
        ({"log": "kafka"}, "is not a log mode"),
        ({"log": "external"}, "needs log_url="),
        ({"log": "external", "log_url": "http://127.0.0.1:9"}, "does not answer"),
        ({"log_url": "http://127.0.0.1:9"}, "without log="),
        ({"log": "embedded", "log_url": "http://127.0.0.1:9"}, "drop log_url="),
    ]
    for options, message in cases:
        with pytest.raises(BarrierConfigError, match=message):
            spark_barrier.register(spark, service.url, **common, **options)
    assert service.client.list_jobs().total == 0
    assert not service.catalog.table_exists("ods.bad_log")

    spark_barrier.register(spark, service.url, **common).close()  # no log
    with pytest.raises(LogNotEnabled, match=re.escape('register(..., log="embedded")')):
        spark_barrier.read_log(spark, service.url, "ods.bad_log")


def test_a_reader_far_behind_reads_snapshots_then_the_log_and_expiry_deletes_spilled_files(
    spark: Any, service: Service
) -> None:
    """The table's embedded log holds no rows in memory (``spark-barrier.log.max-bytes``
    0): every batch's rows spill to files, which the sink lists in the batch's snapshot
    summary, and a persisted batch goes at the next append. A reader started late is far
    behind: it reads the table's snapshots, then follows the log (rows with a log
    sequence number). Expiring the old snapshots deletes their spilled files; the
    current one's stay."""
    common: dict[str, Any] = {
        "job": "ingest_spilled",
        "outputs": {"ods.spilled": NUMBERS_SCHEMA},
        "catalog_uri": service.db_url,
        "warehouse": service.warehouse,
        "catalog": service.catalog,
        "state_dir": service.state_dir,
    }
    spark_barrier.register(spark, service.url, **common).close()  # creates the table
    with service.catalog.load_table("ods.spilled").transaction() as txn:
        txn.set_properties({"spark-barrier.log.max-bytes": "0"})
    job = spark_barrier.register(spark, service.url, **common, log="embedded")
    stream = rate_numbers(spark, 40)
    writer = job.start(stream, job.sink(), trigger_seconds=0.5)
    try:
        time.sleep(8)  # batches the log lets go of: a late reader is far behind
        reader = LogReader.from_metaservice(
            "ods.spilled", service.client, catalog=service.catalog, start="earliest"
        )
        follower = Follower(reader, interval=0.05)
        time.sleep(8)
    finally:
        spark_barrier.stop_between_batches(writer)
        job.close()
    table = _table_ids(service, "ods.spilled")
    follower.until_caught_up(table)
    delivered = follower.ids()
    assert table <= set(delivered), f"never delivered: {sorted(table - set(delivered))[:20]}"
    # A batch the stop cut short after its append is replayed by the next run, not here.
    extra = set(delivered) - table
    assert extra <= follower.ids_after_batch(_last_batch(service, "ods.spilled")), extra
    from_log = follower.ids_from_the_log()
    from_snapshots = set(delivered) - from_log
    assert 0 in from_snapshots, "the late reader did not start from the snapshots"
    assert from_log and max(from_log) > max(from_snapshots), "it never went back to the log"

    iceberg = service.catalog.load_table("ods.spilled")
    listed = {s.snapshot_id: parse_log_files(s.summary) for s in iceberg.snapshots() if s.summary}
    assert all(listed.values()), "a batch's snapshot does not list its spilled rows' files"
    assert all(_on_disk(p) for files in listed.values() for p in files)
    current = iceberg.current_snapshot()
    assert current is not None

    result = service.client.expire("ods.spilled")

    expired = {s.snapshot_id for s in result.snapshots}
    assert expired == set(listed) - {current.snapshot_id}
    deleted = {f.path for f in result.files if f.kind == "log"}
    assert deleted == {p for sid in expired for p in listed[sid]}
    assert not any(_on_disk(p) for p in deleted)
    assert all(_on_disk(p) for p in listed[current.snapshot_id])


def _on_disk(uri: str) -> bool:
    return Path(uri.removeprefix("file://")).exists()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[Service, dict[str, str]]]:
    """A MetaService requiring tokens (its SQLite file is the catalog), and a writer's
    and a reader's token."""
    from metaservice.auth import service as auth_service
    from metaservice.auth.schemas import Role
    from metaservice.clock import SystemClock
    from metaservice.context import Context
    from metaservice.db import Database

    db_url = f"sqlite:///{tmp_path / 'metaservice.db'}"
    warehouse = str(tmp_path / "tables")
    settings = Settings(
        db_url=db_url, warehouse=warehouse, barrier_interval_ms=500, port=0, auth_required=True
    )
    with EmbeddedMetaService(settings) as url:
        db = Database(db_url)
        ctx = Context(settings=settings, clock=SystemClock())
        tokens = {
            role.value: db.write(lambda s, r=role: auth_service.create_token(s, ctx, r, "t")).token
            for role in (Role.WRITER, Role.READER)
        }
        db.dispose()
        with MetaServiceClient(url, token=tokens["writer"]) as client:
            catalog = open_catalog(db_url, warehouse)
            yield Service(url, db_url, warehouse, tmp_path / "state", client, catalog), tokens


def test_with_auth_the_embedded_log_checks_tokens_and_its_writers_and_readers_bring_theirs(
    spark: Any, secured: tuple[Service, dict[str, str]]
) -> None:
    """register(..., token=...) is all the wiring: the driver's log service checks every
    caller's token with the MetaService, proves its own to it (so its address is
    accepted), the write tasks append with the job's token, and a reader made from a
    MetaService client reads with that client's."""
    service, tokens = secured
    job = spark_barrier.register(
        spark,
        service.url,
        job="ingest_secured",
        outputs={"ods.secured": NUMBERS_SCHEMA},
        catalog_uri=service.db_url,
        warehouse=service.warehouse,
        state_dir=service.state_dir,
        token=tokens["writer"],
        log="embedded",
    )
    log_url = _log_published(service, "ods.secured").address
    assert httpx.get(f"{log_url}/v1/status", timeout=10).status_code == 401
    injected = httpx.post(
        f"{log_url}/v1/tables/ods.secured/reset", json={"after_batch_id": None}, timeout=10
    )
    assert injected.status_code == 401
    writer = job.start(rate_numbers(spark, 40), job.sink(), trigger_seconds=0.5)
    try:
        with MetaServiceClient(service.url, token=tokens["reader"]) as reading:
            reader = LogReader.from_metaservice(
                "ods.secured", reading, catalog=service.catalog, start="earliest"
            )
            follower = Follower(reader, interval=0.05)
            deadline = time.monotonic() + 90
            while len(follower.ids_from_the_log()) < 40 and time.monotonic() < deadline:
                assert writer.exception() is None, writer.exception()
                time.sleep(0.5)
            shown = reading.get_table_log("ods.secured")
    finally:
        spark_barrier.stop_between_batches(writer)
        job.close()
    table = _table_ids(service, "ods.secured")
    follower.until_caught_up(table)
    assert table and table <= set(follower.ids())
    assert follower.ids_from_the_log(), "the reader never read the log"
    assert shown.reachable and shown.status is not None and shown.status.entries >= 0
