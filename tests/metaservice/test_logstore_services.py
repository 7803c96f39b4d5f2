"""A table's log spread over several log services (no Spark): rows routed by partition,
the same in every process; every service reset, marked and asked for spilled files by
the job's driver; readers merging the services, falling back to the snapshots when one
is down or restarted; a revision swap resetting all of them; the MetaService publishing
several addresses and showing each service's status. Real log services over HTTP on
loopback, real Iceberg tables (pyiceberg, SQL catalog).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyiceberg")

import pyarrow as pa
from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from metaservice.app import create_app
from metaservice.catalog_loading import open_catalog
from metaservice.client import MetaServiceClient
from metaservice.clock import ManualClock
from metaservice.contract import encode_log_files, encode_stamp, parse_log_files
from metaservice.logstore import LogClient, LogReader
from metaservice.logstore.cli import _rows
from metaservice.logstore.routing import NotRoutable, Routing, check_routable
from metaservice.logstore.server import LogService
from metaservice.logstore.store import LogStore
from metaservice.revisions.replaced_logs import drop_replaced
from metaservice.revisions.swap_records import ReplacedLog
from metaservice.settings import Settings
from metaservice.topology.schemas import TableLogStatus
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.job import BarrierConfigError
from spark_barrier.log import JobLog
from tests.faults.processes import free_port
from tests.metaservice.helpers import API, assert_error, put_job, unchanged
from tests.metaservice.live_server import LiveServer
from tests.metaservice.log_reads import barrier_of, drain, ids_of

TABLE = "dw.clicks"
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("region", pa.string())])
REGIONS = ["eu", "us", "apac", "latam", "mea", "anz"]


def rows_of(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "region": [REGIONS[i % len(REGIONS)] for i in ids]}, schema=SCHEMA)


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    opened = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path / "wh"))
    yield opened
    opened.engine.dispose()  # type: ignore[attr-defined]


@pytest.fixture
def two() -> Iterator[list[LogService]]:
    # Every persisted barrier kept: the tests look at which rows each service got.
    with LogService(LogStore(keep_barriers=100)) as a, LogService(LogStore(keep_barriers=100)) as b:
        yield [a, b]


@pytest.fixture
def ms(settings: Settings, clock: ManualClock) -> Iterator[MetaServiceClient]:
    with LiveServer(create_app(settings, clock)) as server, MetaServiceClient(server.url) as client:
        client.put_job("clicks", outputs=[TABLE])
        yield client


class Driver:
    """What spark_barrier does with a log of several services, without Spark: the driver's
    JobLog (reset and publish at start, persisted marks after each commit, spilled files
    claimed before it) and the executors' LogTarget appends, routed by partition."""

    def __init__(
        self, catalog: Catalog, ms: MetaServiceClient, urls: list[str], last_batch: int = -1
    ) -> None:
        self.table: Table = ensure_table(catalog, TABLE, SCHEMA, partition_by=["region"])
        self.job_log = JobLog("external", urls)
        self.job_log.open(ms, "clicks", {TABLE: self.table}, last_batch, {})
        self.next_id = 0
        self.claimed: dict[int, list[str]] = {}

    def batch(self, batch_id: int, n: int = 12, *, commit: bool = True) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        target = self.job_log.target(TABLE, barrier_of(batch_id), batch_id)
        for part in (ids[: n // 2], ids[n // 2 :]):  # two write tasks
            target.append(rows_of(part))
        if commit:
            self.commit(batch_id, ids)
        return ids

    def commit(self, batch_id: int, ids: list[int]) -> None:
        target = self.job_log.target(TABLE, barrier_of(batch_id), batch_id)
        self.claimed[batch_id] = target.claim_spilled()
        stamp = encode_stamp(barrier=barrier_of(batch_id), job="clicks", batch=batch_id)
        self.table.append(rows_of(ids), snapshot_properties=stamp)
        snapshot = self.table.current_snapshot()
        assert snapshot is not None
        self.job_log.persisted(TABLE, barrier_of(batch_id), batch_id, snapshot.snapshot_id)

    def table_ids(self) -> list[int]:
        return sorted(ids_of(self.table.refresh().scan().to_arrow()))


def held_regions(service: LogService) -> set[str]:
    after = service.store.existing(TABLE).complete_after
    assert after is not None
    with LogClient(service.url) as client:
        found = client.read(TABLE, after_batch=after).rows
    return set() if found is None else set(found.column("region").to_pylist())


# -- routing -------------------------------------------------------------------------------------


def test_a_partitions_rows_go_to_one_service_the_same_in_every_process(catalog: Catalog) -> None:
    table = ensure_table(catalog, TABLE, SCHEMA, partition_by=["region"])
    routing = Routing(3, table.spec().model_dump_json(), table.schema().model_dump_json())
    rows = rows_of(list(range(60)))
    here = routing.service_of(rows).to_pylist()
    by_region = {
        r: {s for r2, s in zip(rows.column("region").to_pylist(), here, strict=True) if r2 == r}
        for r in REGIONS
    }
    assert all(len(services) == 1 for services in by_region.values())  # one per partition
    assert len({s for (s,) in by_region.values()}) > 1  # and the partitions are spread
    # another interpreter (another hash seed) routes them the same
    script = (
        "import json, sys, pyarrow as pa\n"
        "from metaservice.logstore.routing import Routing\n"
        "r = Routing(*json.loads(sys.argv[1]))\n"
        f"rows = pa.table({{'id': list(range(60)), 'region': {[REGIONS[i % 6] for i in range(60)]!r}}})\n"
        "print(json.dumps(r.service_of(rows).to_pylist()))\n"
    )
    args = json.dumps([3, routing.spec_json, routing.schema_json])
    other = subprocess.run(
        [sys.executable, "-c", script, args],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
    )
    assert json.loads(other.stdout) == here


def test_a_bucketed_table_sends_bucket_b_to_service_b_modulo_the_services(
    catalog: Catalog,
) -> None:
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import LongType

    table = ensure_table(catalog, "dw.bucketed", SCHEMA, partition_by=["bucket(8, id)"])
    routing = Routing(3, table.spec().model_dump_json(), table.schema().model_dump_json())
    ids = pa.array(range(100), pa.int64())
    buckets = BucketTransform(8).pyarrow_transform(LongType())(ids).to_pylist()
    assert routing.service_of(rows_of(list(range(100)))).to_pylist() == [b % 3 for b in buckets]


def test_an_unpartitioned_table_cannot_spread_its_log(catalog: Catalog) -> None:
    table = ensure_table(catalog, "dw.flat", SCHEMA)
    check_routable("dw.flat", table, 1)
    with pytest.raises(NotRoutable, match="not partitioned"):
        check_routable("dw.flat", table, 2)


# -- writers and readers -------------------------------------------------------------------------


def test_a_reader_merges_the_services_and_each_partition_stays_at_its_service(
    catalog: Catalog, ms: MetaServiceClient, two: list[LogService]
) -> None:
    driver = Driver(catalog, ms, [s.url for s in two])
    published = ms.get_table(TABLE).log
    assert published is not None and published.addresses == [s.url for s in two]
    reader = LogReader.from_metaservice(TABLE, ms, catalog=catalog, retry_log_seconds=0)
    delivered: list[int] = []
    for batch in range(3):
        pending = driver.batch(batch, commit=False)
        got, sources = drain(reader)
        assert sorted(got) == pending and set(sources) == {"log"}  # before the commit
        delivered += got
        driver.commit(batch, pending)
    assert drain(reader) == ([], [])
    assert reader.committed_batch == 2  # every service marked batch 2 persisted
    assert sorted(delivered) == driver.table_ids()
    regions = [held_regions(s) for s in two]
    assert regions[0] and regions[1] and not regions[0] & regions[1]


def test_a_service_down_makes_the_reader_read_snapshots_with_one_warning_and_come_back(
    catalog: Catalog, ms: MetaServiceClient, caplog: pytest.LogCaptureFixture
) -> None:
    a = LogService(LogStore()).start()
    b = LogService(LogStore()).start()
    port_b = b.port
    try:
        driver = Driver(catalog, ms, [a.url, b.url])
        reader = LogReader(TABLE, catalog=catalog, log_url=[a.url, b.url], retry_log_seconds=0)
        delivered = drain(reader)[0] + []
        first = driver.batch(0, commit=False)
        delivered += drain(reader)[0]
        driver.commit(0, first)
        b.stop()  # b's rows of batches 1-3 never reach a log; a's do
        with caplog.at_level(logging.INFO, logger="metaservice.logstore.reader"):
            for batch in (1, 2, 3):
                driver.batch(batch)
                got, sources = drain(reader, polls=3)
                delivered += got
                assert reader.source == "snapshots"
            warnings = [
                r
                for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "metaservice.logstore.reader"
            ]
            assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()
            assert set(delivered) == set(driver.table_ids())  # no gap
            # b comes back: a new process on the same port, empty, a new epoch. It holds
            # only the batches after the first it sees (4): the reader reads batch 4 from
            # the snapshot, then follows both services again.
            with LogService(LogStore(), port=port_b) as back:
                delivered += drain(reader)[0]
                four = driver.batch(4)
                got, _ = drain(reader)
                delivered += got
                assert set(four) <= set(got)
                newer = driver.batch(5, commit=False)
                got, sources = drain(reader)
                delivered += got
                assert sorted(got) == newer and sources == ["log"]
                assert held_regions(back)
            assert any("reachable again" in r.getMessage() for r in caplog.records)
    finally:
        a.stop()
    assert set(driver.table_ids()) <= set(delivered)


def test_a_service_that_lost_its_rows_sends_the_reader_to_the_snapshots_never_a_gap(
    catalog: Catalog, ms: MetaServiceClient, two: list[LogService]
) -> None:
    driver = Driver(catalog, ms, [s.url for s in two])
    reader = LogReader(TABLE, catalog=catalog, log_url=[s.url for s in two], retry_log_seconds=0)
    delivered: list[int] = []
    for batch in range(2):
        driver.batch(batch)
    pending = driver.batch(2, commit=False)
    delivered += drain(reader)[0]
    # the second service loses its rows of batch 2 (as a restart would): its log is reset
    two[1].store.existing(TABLE).reset(1, "clicks")
    driver.commit(2, pending)
    got, sources = drain(reader)
    delivered += got
    assert "snapshots" in sources
    assert set(driver.table_ids()) <= set(delivered)


def test_a_restarted_driver_resets_every_service_and_readers_get_duplicates_never_a_gap(
    catalog: Catalog, ms: MetaServiceClient, two: list[LogService]
) -> None:
    urls = [s.url for s in two]
    driver = Driver(catalog, ms, urls)
    reader = LogReader(TABLE, catalog=catalog, log_url=urls, retry_log_seconds=0)
    delivered: list[int] = []
    for batch in range(2):
        driver.batch(batch)
    lost = driver.batch(2, commit=False)  # the driver dies after its executors logged batch 2
    delivered += drain(reader)[0]
    epochs = [s.store.existing(TABLE).epoch for s in two]
    restarted = Driver(catalog, ms, urls, last_batch=1)
    assert [s.store.existing(TABLE).epoch for s in two] != epochs  # both reset
    assert all(s.store.existing(TABLE).status().last[1] == 1 for s in two)  # type: ignore[index]
    restarted.next_id = lost[0]
    replayed = restarted.batch(2)
    restarted.batch(3, commit=False)
    got, sources = drain(reader)
    delivered += got
    assert "snapshots" in sources and sources[-1] == "log"
    counts = Counter(delivered)
    assert set(restarted.table_ids()) <= set(counts)
    assert all(counts[i] >= 2 for i in replayed)


def test_spilled_files_of_every_service_are_claimed_for_the_snapshot(
    catalog: Catalog, ms: MetaServiceClient, tmp_path: Path
) -> None:
    stores = [LogStore(max_bytes=0, spill_root=str(tmp_path / f"spill{i}")) for i in range(2)]
    with LogService(stores[0]) as a, LogService(stores[1]) as b:
        driver = Driver(catalog, ms, [a.url, b.url])
        driver.batch(0)
        claimed = driver.claimed[0]
    assert any("spill0" in f for f in claimed) and any("spill1" in f for f in claimed)
    assert sorted(parse_log_files(encode_log_files(claimed))) == sorted(claimed)


def test_a_revision_swap_resets_every_service_of_a_log(two: list[LogService]) -> None:
    for service in two:
        log = service.store.table(TABLE)
        log.reset(-1, "clicks")
        log.append(barrier_of(0), 0, rows_of([1]).to_batches()[0])
    epochs = [s.store.existing(TABLE).epoch for s in two]
    drop_replaced(1, [ReplacedLog(TABLE, " ".join(s.url for s in two))])
    for service, epoch in zip(two, epochs, strict=True):
        log = service.store.existing(TABLE)
        assert log.epoch != epoch and log.status().entries == 0


# -- the MetaService -----------------------------------------------------------------------------


def test_several_addresses_are_published_and_one_address_clients_still_work(
    client: TestClient,
) -> None:
    put_job(client, "clicks", [TABLE])
    urls = ["http://10.0.0.5:7070", "http://10.0.0.6:7070"]
    view = client.put(f"{API}/tables/{TABLE}/log", json={"mode": "external", "addresses": urls})
    assert view.status_code == 200, view.text
    shown = view.json()["log"]
    assert shown["addresses"] == urls and shown["address"] == " ".join(urls)
    one = client.put(f"{API}/tables/{TABLE}/log", json={"mode": "external", "address": urls[0]})
    assert one.json()["log"]["addresses"] == [urls[0]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mode": "external", "address": "http://a:1", "addresses": ["http://b:1"]}, "address"),
        ({"mode": "external", "addresses": ["http://a:1", "http://a:1"]}, "addresses"),
        ({"mode": "external", "addresses": []}, "addresses"),
        ({"mode": "external", "addresses": ["http://a:1", "b:1"]}, "addresses.1"),
        ({"mode": "external", "addresses": [f"http://h{i}:7070" for i in range(17)]}, "addresses"),
        (
            {"mode": "external", "addresses": ["http://" + "h" * 200, "http://" + "i" * 200]},
            "addresses",
        ),
    ],
)
def test_bad_addresses_are_refused_and_change_nothing(
    client: TestClient, db_url: str, body: dict[str, object], field: str
) -> None:
    put_job(client, "clicks", [TABLE])
    with unchanged(db_url):
        response = client.put(f"{API}/tables/{TABLE}/log", json=body)
        assert_error(response, 422, "invalid_request", field)


def test_the_status_shows_each_service_and_one_that_is_down(
    ms: MetaServiceClient, two: list[LogService]
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    for service in two:
        service.store.table(TABLE).reset(-1, "clicks")
    ms.put_table_log(TABLE, mode="external", addresses=[two[0].url, two[1].url, down])
    found = ms.get_table_log(TABLE)
    assert [s.address for s in found.services] == [two[0].url, two[1].url, down]
    assert [s.reachable for s in found.services] == [True, True, False]
    assert found.services[0].status is not None and found.services[0].status.job == "clicks"
    assert found.reachable is False and found.status is None and found.error
    rows = _rows(TableLogStatus.model_validate(found.model_dump()))
    assert [r[2] for r in rows] == [two[0].url, two[1].url, down]


def test_a_driver_refuses_several_services_for_an_unpartitioned_table_before_any_reset(
    catalog: Catalog, ms: MetaServiceClient, two: list[LogService]
) -> None:
    flat = ensure_table(catalog, TABLE, SCHEMA)
    job_log = JobLog("external", [s.url for s in two])
    with pytest.raises(BarrierConfigError, match="not partitioned"):
        job_log.open(ms, "clicks", {TABLE: flat}, None, {})
    job_log.close()
    assert all(TABLE not in s.store.names() for s in two)  # nothing reset
    assert ms.get_table(TABLE).log is None  # nothing published
