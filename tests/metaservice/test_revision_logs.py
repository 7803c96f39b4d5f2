"""A revision swap drops the replaced tables' log data (issue 14), on SQLite and
PostgreSQL, with real log services on loopback and real Iceberg tables (pyiceberg).

The pipeline and the revision are test_revision_swap's: ``der`` writes dw.detail, a
revision re-runs it from the consistent version's barrier as ``der__revN`` into the
mirror dw.detail__revN, which the swap renames to dw.detail. Here ``der`` also logs
dw.detail to a log service, as its Spark driver does (append before the commit, the
persisted mark after it), and readers follow that log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

import httpx
import pyarrow as pa
from fastapi.testclient import TestClient

from metaservice.app import create_app
from metaservice.client import MetaServiceClient
from metaservice.clock import ManualClock
from metaservice.contract import encode_stamp, parse_stamp
from metaservice.logstore import LogClient, LogReader, LogWriter
from metaservice.logstore.client import LogApiError
from metaservice.logstore.server import LogService
from metaservice.logstore.store import EpochChanged, LogGone, LogStore, TableLog
from metaservice.settings import Settings
from tests.metaservice import test_expiry, test_revision_swap
from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    consistent,
    get_json,
    put_job,
)
from tests.metaservice.live_server import LiveServer
from tests.metaservice.test_expiry import Lake
from tests.metaservice.test_revision_swap import catch_up, ready_revision, revision, swap
from tests.metaservice.test_revisions import created

warehouse = test_expiry.warehouse
catalog = test_expiry.catalog
lake = test_expiry.lake
settings = test_revision_swap.settings

TABLE = "dw.detail"
SCHEMA = pa.schema([pa.field("n", pa.int64())])  # the Lake's tables'


def rows(*ns: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"n": list(ns)}, schema=SCHEMA)


def ns_of(table: pa.Table | None) -> list[int]:
    return [] if table is None else sorted(table.column("n").to_pylist())


def drain(reader: LogReader, polls: int = 4) -> list[int]:
    got: list[int] = []
    for _ in range(polls):
        got += ns_of(reader.poll())
    return sorted(got)


def table_rows(lake: Lake, name: str) -> list[int]:
    return ns_of(lake.catalog.load_table(name).scan().to_arrow())


def status_of(url: str, table: str) -> dict[str, Any]:
    with LogClient(url) as client:
        (status,) = client.status(table)
    return status


def publish(client: TestClient, table: str, url: str) -> None:
    r = client.put(f"{API}/tables/{table}/log", json={"mode": "external", "address": url})
    assert r.status_code == 200, r.text


@pytest.fixture
def ms(settings: Settings, clock: ManualClock) -> Iterator[MetaServiceClient]:
    """A replica of the service on a real socket, on the same database, where the readers
    look the table's log up."""
    with LiveServer(create_app(settings, clock)) as server, MetaServiceClient(server.url) as c:
        yield c


def logged(client: TestClient, lake: Lake, writer: LogWriter, batch_id: int, n: int) -> int:
    """A batch of ``der`` as its driver runs it with a log, up to the commit: its input
    moves, it asks its barrier, the executors log the row. Returns the barrier."""
    lake.batch("feed", 10 + batch_id, "ods.feed", [n])
    lake.batch("src", 10 + batch_id, "ods.orders", [n])
    b: int = barrier(client, "der", batch_id)["barrier"]
    writer.append(TABLE, barrier=b, batch_id=batch_id, rows=rows(n))
    return b


def committed(lake: Lake, writer: LogWriter, batch_id: int, b: int, n: int) -> None:
    """The rest of :func:`logged`'s batch: the commit, then the persisted mark."""
    written = lake.commit(TABLE, encode_stamp(b, "der", batch_id), b, [n], False)
    lake.report("der", batch_id, b, TABLE, written.snapshot_id)
    writer.persisted(TABLE, barrier=b, batch_id=batch_id, snapshot_id=written.snapshot_id)
    lake.clock.advance(SLOT)


# -- the log store: a reset that keeps no batch ------------------------------------------------


def test_a_reset_with_no_batch_kept_drops_everything_and_forgets_the_persisted_marks() -> None:
    log = TableLog(TABLE)
    for batch in range(4):
        log.append(T0 + batch * SLOT, batch, rows(100 + batch))
    for batch in range(3):  # batch 3 stays unpersisted
        log.persisted(T0 + batch * SLOT, batch, snapshot_id=500 + batch)
    old = log.read(after_batch=1)
    kept_by_a_writers_reset = TableLog(TABLE)  # what reset(after_batch_id) would leave
    for batch in range(2):
        kept_by_a_writers_reset.append(T0, batch, rows(100 + batch))
        kept_by_a_writers_reset.persisted(T0, batch, snapshot_id=500 + batch)
    kept_by_a_writers_reset.reset(5)
    assert kept_by_a_writers_reset.read(after_batch=0).entries  # the old rows, answered

    epoch = log.reset(None)

    assert epoch == old.epoch + 1
    status = log.status()
    assert (status.entries, status.bytes, status.persisted, status.complete_after) == (
        0,
        0,
        None,
        None,
    )
    with pytest.raises(EpochChanged):
        log.read(after_seq=old.next_seq, epoch=old.epoch)
    with pytest.raises(LogGone):  # it holds nothing in full: readers read the snapshots
        log.read(after_batch=-1)
    # the next writer (batch ids of its own, below the old marks) resets after its last
    log.reset(1)
    log.append(T0 + 9 * SLOT, 2, rows(200))  # taken: no old mark says batch 2 is persisted
    with pytest.raises(LogGone):
        log.read(after_batch=0)  # before the next writer's reset: nothing held
    answer = log.read(after_batch=1)
    assert [e.batch_id for e in answer.entries] == [2] and answer.committed is None
    assert answer.entries[0].seq > old.next_seq  # seqs are never reused


def test_the_service_resets_with_no_batch_kept_on_a_null_after_batch_id() -> None:
    with LogService(LogStore()) as service, LogWriter(service.url) as writer:
        writer.reset(TABLE, after_batch_id=-1)
        writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(1))
        writer.persisted(TABLE, barrier=T0, batch_id=0, snapshot_id=7)
        before = status_of(service.url, TABLE)

        epoch = writer.reset(TABLE, after_batch_id=None)

        after = status_of(service.url, TABLE)
        assert epoch == after["epoch"] == before["epoch"] + 1
        assert (after["entries"], after["persisted"], after["complete_after"]) == (0, None, None)
        # a table it holds nothing of has nothing to drop: 404, and no log is made for it
        with pytest.raises(LogApiError) as unknown:
            writer.reset("dw.other", after_batch_id=None)
        assert (unknown.value.status, unknown.value.code) == (404, "log_table_unknown")
        assert "dw.other" not in service.store.names()
        # the body still needs the field, and a batch id of -1 at least
        for body in ({}, {"after_batch_id": -2}):
            response = httpx.post(f"{service.url}/v1/tables/{TABLE}/reset", json=body)
            assert_error(response, 422, "invalid_request", "after_batch_id")
        assert status_of(service.url, TABLE)["epoch"] == epoch


# -- the swap ---------------------------------------------------------------------------------


def test_a_swap_drops_the_replaced_log_and_its_readers_go_on_with_the_swapped_in_table(
    client: TestClient, lake: Lake, ms: MetaServiceClient
) -> None:
    version, rid, next_id = ready_revision(client, lake)
    mirror = f"{TABLE}__rev{rid}"
    with (
        LogService(LogStore()) as old,
        LogService(LogStore()) as mirror_log,
        LogWriter(old.url) as der_log,
    ):
        publish(client, TABLE, old.url)
        der_log.reset(TABLE, after_batch_id=get_json(client, "/jobs/der")["last_batch_id"])
        # der__rev's driver logged its mirror before the swap, under the mirror's name
        publish(client, mirror, mirror_log.url)
        with LogWriter(mirror_log.url) as rev_log:
            rev_log.reset(mirror, after_batch_id=-1)
            rev_log.append(mirror, barrier=version["barrier"] + SLOT, batch_id=0, rows=rows(200))
        # one reader looks its log up in the MetaService, one was given the address
        looked_up = LogReader.from_metaservice(
            TABLE, ms, catalog=lake.catalog, retry_log_seconds=0, check_log_seconds=3600
        )
        given = LogReader(TABLE, catalog=lake.catalog, log_url=old.url, retry_log_seconds=0)
        readers = (looked_up, given)
        for batch_id, n in ((3, 103), (4, 104)):
            b = logged(client, lake, der_log, batch_id, n)
            for reader in readers:  # before the commit: from the log
                assert (drain(reader), reader.source) == ([n], "log")
            committed(lake, der_log, batch_id, b, n)
        next_id = catch_up(client, lake, rid, next_id)
        logs = ((old.url, TABLE), (mirror_log.url, mirror))
        epochs = {url: status_of(url, name)["epoch"] for url, name in logs}
        assert status_of(old.url, TABLE)["entries"] == 2

        done = swap(client, rid, wait_seconds=10)

        assert done.status_code == 200 and done.json()["state"] == "swapped", done.text
        # both logs dropped what they held, at a new epoch, and are published no more
        for url, name in logs:
            status = status_of(url, name)
            assert status["epoch"] > epochs[url]
            assert (status["entries"], status["persisted"], status["complete_after"]) == (
                0,
                None,
                None,
            ), status
        assert get_json(client, f"/tables/{TABLE}")["log"] is None
        assert get_json(client, f"/tables/{TABLE}__pre_rev{rid}")["log"] is None
        # each reader is told log_reset and reads the swapped-in table: its whole state
        # (its position is no snapshot of it), never a row only the replaced one had
        swapped_in = table_rows(lake, TABLE)
        replaced = set(table_rows(lake, f"{TABLE}__pre_rev{rid}")) - set(swapped_in)
        assert {103, 104} <= replaced
        for reader in readers:
            assert drain(reader) == swapped_in
            assert reader.source == "snapshots"
        # the revision job writes the table by its name: from the snapshots
        lake.batch("feed", 20, "ods.feed", [20])
        lake.batch("src", 20, "ods.orders", [20])
        last = next_id + 10
        lake.batch(f"der__rev{rid}", last, TABLE, [299])
        for reader in readers:
            assert drain(reader) == [299]
        # its restarted driver publishes its own log (reset to its last batch, as
        # spark_barrier's register does): the reader that looks the log up follows it
        assert get_json(client, f"/jobs/der__rev{rid}")["last_batch_id"] == last
        with LogService(LogStore()) as new, LogWriter(new.url) as rev_log:
            rev_log.reset(TABLE, after_batch_id=last)
            publish(client, TABLE, new.url)
            lake.batch("feed", 21, "ods.feed", [21])
            lake.batch("src", 21, "ods.orders", [21])
            b = barrier(client, f"der__rev{rid}", last + 1)["barrier"]
            rev_log.append(TABLE, barrier=b, batch_id=last + 1, rows=rows(300))
            assert (drain(looked_up), looked_up.source) == ([300], "log")
            assert drain(given) == []  # not committed: in no snapshot yet
            # swapping again answers the revision again and leaves the new log alone
            assert swap(client, rid).json()["state"] == "swapped"
            assert status_of(new.url, TABLE)["entries"] == 1
        for reader in readers:
            reader.close()


def test_a_swap_whose_log_service_is_down_succeeds_with_one_warning_and_readers_never_follow_the_old_rows(
    client: TestClient, lake: Lake, ms: MetaServiceClient, caplog: pytest.LogCaptureFixture
) -> None:
    _, rid, next_id = ready_revision(client, lake)
    store = LogStore()
    old = LogService(store).start()
    port = old.port
    publish(client, TABLE, old.url)
    der_log = LogWriter(old.url)
    der_log.reset(TABLE, after_batch_id=get_json(client, "/jobs/der")["last_batch_id"])
    reader = LogReader.from_metaservice(
        TABLE, ms, catalog=lake.catalog, retry_log_seconds=0, check_log_seconds=0
    )
    assert drain(reader) == [] and reader.source == "log"
    # der's batch 3 goes to the log and the table; the reader has not polled since
    committed(lake, der_log, 3, logged(client, lake, der_log, 3, 103), 103)
    next_id = catch_up(client, lake, rid, next_id)
    old.stop()  # unreachable from the MetaService and the reader, but it keeps its rows

    with caplog.at_level(logging.INFO, logger="metaservice.revisions.replaced_logs"):
        done = swap(client, rid, wait_seconds=10)

    assert done.status_code == 200 and done.json()["state"] == "swapped", done.text
    warnings = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("metaservice")
    ]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    message = warnings[0].getMessage()
    assert f"revision {rid} is swapped" in message and f"{TABLE} at {old.url}" in message
    assert get_json(client, f"/tables/{TABLE}")["log"] is None
    with LogService(store, port=port) as back:  # reachable again, with what it held
        assert status_of(back.url, TABLE)["entries"] == 1  # der's batch 3, row 103

        got = drain(reader)

        assert got == table_rows(lake, TABLE)  # the swapped-in table, from its snapshots
        assert 103 not in got and reader.source == "snapshots"
        assert drain(reader) == []
    der_log.close()
    reader.close()


def test_a_swap_of_tables_without_a_log_asks_no_log_service(
    client: TestClient, lake: Lake, caplog: pytest.LogCaptureFixture
) -> None:
    _, rid, _ = ready_revision(client, lake)
    with caplog.at_level(logging.INFO, logger="metaservice.revisions.replaced_logs"):
        assert swap(client, rid, wait_seconds=10).json()["state"] == "swapped"
    assert not [r for r in caplog.records if r.name == "metaservice.revisions.replaced_logs"]
    for table in ("dw.detail", "dws.summary"):
        assert get_json(client, f"/tables/{table}")["log"] is None


def test_after_a_swap_readers_at_the_old_writers_batch_get_the_revision_jobs_batches(
    client: TestClient, lake: Lake, ms: MetaServiceClient
) -> None:
    """The swapped-in table's newest snapshot is the revision's start snapshot, stamped by
    ``der`` with its batch 7; ``der__rev``'s batch ids start at 0. Asked "after batch 7",
    its log would skip its batches 0-2 (they are not committed yet: a gap)."""
    put_job(client, "feed", ["ods.feed"])
    put_job(client, "src", ["ods.orders"], inputs=["ods.feed"])
    put_job(client, "der", [TABLE], inputs=["ods.orders"])
    with LogService(LogStore()) as old, LogWriter(old.url) as der_log:
        publish(client, TABLE, old.url)
        der_log.reset(TABLE, after_batch_id=-1, job="der")
        for batch_id in range(8):
            n = 100 + batch_id
            committed(lake, der_log, batch_id, logged(client, lake, der_log, batch_id, n), n)
        following = LogReader.from_metaservice(
            TABLE, ms, catalog=lake.catalog, retry_log_seconds=0, check_log_seconds=3600
        )
        assert drain(following) == [] and following.source == "log"
        version = consistent(client, TABLE).json()
        rid = created(client, TABLE, version["barrier"])["id"]
        assert revision(client, rid)["state"] == "ready"  # der__rev ran no batch yet

        assert swap(client, rid, wait_seconds=10).json()["state"] == "swapped"

        start = lake.catalog.load_table(TABLE).current_snapshot()
        assert start is not None and start.snapshot_id == version["snapshots"][TABLE]
        stamp = parse_stamp(start.summary)
        assert stamp is not None and (stamp.job, stamp.batch) == ("der", 7)
        assert drain(following) == [] and following.source == "snapshots"
    # der__rev's driver registers its log: nothing committed yet, so reset to -1 as its job
    rev = f"der__rev{rid}"
    assert get_json(client, f"/jobs/{rev}")["last_batch_id"] is None
    with LogService(LogStore()) as new, LogWriter(new.url) as rev_log:
        rev_log.reset(TABLE, after_batch_id=-1, job=rev)
        publish(client, TABLE, new.url)
        fresh = LogReader.from_metaservice(TABLE, ms, catalog=lake.catalog, retry_log_seconds=0)
        assert (fresh.committed_batch, fresh.committed_job) == (7, "der")
        # while the readers do not poll, der__rev commits its batches 0 and 1 and logs 2
        for batch_id in range(3):
            lake.batch("feed", 30 + batch_id, "ods.feed", [batch_id])
            lake.batch("src", 30 + batch_id, "ods.orders", [batch_id])
            b = barrier(client, rev, batch_id)["barrier"]
            rev_log.append(TABLE, barrier=b, batch_id=batch_id, rows=rows(300 + batch_id))
            if batch_id < 2:
                summary = encode_stamp(b, rev, batch_id)
                written = lake.commit(TABLE, summary, b, [300 + batch_id], False)
                lake.report(rev, batch_id, b, TABLE, written.snapshot_id)
                rev_log.persisted(
                    TABLE, barrier=b, batch_id=batch_id, snapshot_id=written.snapshot_id
                )
                lake.clock.advance(SLOT)

        for reader in (following, fresh):
            # from the log's start: it holds every batch der__rev wrote
            assert (drain(reader), reader.source) == ([300, 301, 302], "log")
            assert (reader.committed_batch, reader.committed_job) == (1, rev)
        assert status_of(new.url, TABLE)["job"] == rev
    for reader in (following, fresh):
        reader.close()
