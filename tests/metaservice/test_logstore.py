"""The log store (no Spark): the in-memory log's retention, epochs and positions; the log
service over real HTTP on loopback; LogReader following a real Iceberg table (pyiceberg)
from the log and from its snapshots; a table's log registered with the MetaService, and
its status asked through the MetaService.

The writer here is what the Spark side will do per micro-batch: append the rows to the
log (in two parts, as two executors would), commit them to Iceberg stamped with the
batch's barrier, then mark the batch persisted.
"""

from __future__ import annotations

import logging
import pickle
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
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
from metaservice.contract import encode_stamp
from metaservice.errors import Conflict, Invalid
from metaservice.logstore import LogClient, LogNotEnabled, LogReader, LogWriter
from metaservice.logstore.client import LogGoneError, LogResetError
from metaservice.logstore.ipc import encode
from metaservice.logstore.server import LogService, status_json
from metaservice.logstore.store import EpochChanged, LogFull, LogGone, LogStore, TableLog
from metaservice.settings import Settings
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.log import JobLog
from tests.faults.processes import free_port
from tests.metaservice.helpers import API, T0, assert_error, put_job, unchanged
from tests.metaservice.live_server import LiveServer
from tests.metaservice.log_reads import barrier_of, drain, ids_of

TABLE = "dw.events"
SCHEMA = pa.schema([pa.field("id", pa.int64())])


OTHER_SCHEMA_ROWS = pa.RecordBatch.from_pydict({"name": ["x"]})


def rows(*ids: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": list(ids)}, schema=SCHEMA)


# -- the in-memory log ----------------------------------------------------------------------


def test_unpersisted_entries_are_kept_and_only_the_last_two_persisted_barriers() -> None:
    log = TableLog(TABLE)
    for batch in range(5):
        log.append(barrier_of(batch), batch, rows(batch))
    for batch in range(4):  # batch 4 stays unpersisted
        log.persisted(barrier_of(batch), batch, snapshot_id=100 + batch)
    held = log.read(after_batch=2)
    status = log.status()
    assert [e.batch_id for e in held.entries] == [3, 4]
    # the last two persisted barriers (batches 2 and 3) and the unpersisted batch 4
    assert status.entries == 3 and status.first == (barrier_of(2), 2, 3)
    with pytest.raises(LogGone):
        log.read(after_batch=0)  # batch 1 is gone
    assert [e.batch_id for e in log.read(after_batch=1).entries] == [2, 3, 4]
    with pytest.raises(LogGone):
        log.read(after_seq=1, epoch=log.epoch)


def test_the_number_of_persisted_barriers_kept_is_configurable_and_counts_barriers() -> None:
    log = TableLog(TABLE, keep_barriers=1)
    # batches 0 and 1 share a barrier; batch 2 has the next one
    for batch, barrier in ((0, T0), (1, T0), (2, T0 + 1000)):
        log.append(barrier, batch, rows(batch))
    log.persisted(T0, 1, snapshot_id=11)
    assert log.status().entries == 3  # one persisted barrier: both its batches kept
    log.persisted(T0 + 1000, 2, snapshot_id=12)
    assert log.status().first == (T0 + 1000, 2, 3)


def test_past_the_byte_bound_the_oldest_persisted_batches_go_first() -> None:
    one = rows(*range(100)).nbytes
    log = TableLog(TABLE, keep_barriers=10, max_bytes=3 * one)
    for batch in range(3):
        log.append(barrier_of(batch), batch, rows(*range(100)))
    log.persisted(barrier_of(1), 1, snapshot_id=1)
    log.append(barrier_of(3), 3, rows(*range(100)))  # 4 entries: one over the bound
    status = log.status()
    assert (status.entries, status.bytes, status.first) == (3, 3 * one, (barrier_of(1), 1, 2))
    assert not status.over_bound


def test_an_append_past_the_bound_is_refused_and_the_log_falls_behind_without_a_hole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    one = rows(*range(100)).nbytes
    log = TableLog(TABLE, max_bytes=2 * one)
    log.reset(-1, "load")
    log.append(barrier_of(0), 0, rows(*range(100)))
    log.append(barrier_of(1), 1, rows(*range(100)))
    following = log.read(after_seq=0, epoch=log.epoch)
    with (
        caplog.at_level(logging.WARNING, logger="metaservice.logstore.store"),
        pytest.raises(LogFull) as refused,
    ):
        log.append(barrier_of(1), 1, rows(*range(100)))  # a third part: past the bound
    assert refused.value.status == 409 and refused.value.code == "log_full"
    status = log.status()
    # Nothing of batches 0 and 1 is held any more (they are in no snapshot yet: the
    # table will have them), and memory is within the bound.
    assert status.over_bound and status.entries == 0 and status.bytes == 0
    assert len([r for r in caplog.records if "is full" in r.message]) == 1
    # A reader following by seq was handed a position in batch 1: the new epoch sends it
    # to the snapshots; a reader by batch finds the log holds only what comes after 1.
    with pytest.raises(EpochChanged):
        log.read(after_seq=following.next_seq, epoch=following.epoch)
    with pytest.raises(LogGone):
        log.read(after_batch=0, job="load")
    with pytest.raises(LogFull):  # the rest of batch 1 would be a part of it: refused too
        log.append(barrier_of(1), 1, rows(1))
    log.persisted(barrier_of(1), 1, snapshot_id=5)
    log.append(barrier_of(2), 2, rows(2))  # the next batch is held whole again
    assert not log.status().over_bound
    assert [e.batch_id for e in log.read(after_batch=1, job="load").entries] == [2]


def test_reset_drops_past_the_committed_batch_and_changes_the_epoch() -> None:
    log = TableLog(TABLE)
    for batch in range(3):
        log.append(barrier_of(batch), batch, rows(batch))
    log.persisted(barrier_of(0), 0, snapshot_id=10)
    old = log.read(after_seq=0, epoch=log.epoch)
    new_epoch = log.reset(after_batch_id=0)
    assert new_epoch == old.epoch + 1
    assert [e.batch_id for e in log.read(after_batch=0).entries] == []
    with pytest.raises(EpochChanged):
        log.read(after_seq=old.next_seq, epoch=old.epoch)
    replayed = log.append(barrier_of(1), 1, rows(1))
    assert replayed.seq == 4  # seqs are never reused
    assert [e.batch_id for e in log.read(after_batch=0).entries] == [1]


def test_a_new_log_holds_the_batches_after_the_first_it_sees_or_after_its_reset() -> None:
    fresh = TableLog(TABLE)
    with pytest.raises(LogGone):
        fresh.read(after_batch=-1)  # knows nothing yet
    fresh.append(barrier_of(7), 7, rows(7))  # earlier parts of batch 7 may be lost
    with pytest.raises(LogGone):
        fresh.read(after_batch=6)
    assert fresh.read(after_batch=7).entries == []
    restarted = TableLog(TABLE)
    restarted.reset(after_batch_id=6)  # the writer says: everything after 6 comes here
    restarted.append(barrier_of(7), 7, rows(7))
    assert [e.batch_id for e in restarted.read(after_batch=6).entries] == [7]


def test_a_read_by_another_jobs_batch_is_answered_from_the_start_if_all_is_held() -> None:
    log = TableLog(TABLE)
    log.reset(after_batch_id=-1, job="B")  # B's first run: nothing of it committed yet
    for batch in range(3):
        log.append(barrier_of(8 + batch), batch, rows(batch))

    # batch 7 of A (the job that stamped the reader's snapshot) says nothing of B's batches
    answer = log.read(after_batch=7, job="A")

    assert [e.batch_id for e in answer.entries] == [0, 1, 2] and answer.job == "B"
    assert log.read(after_batch=7, job="B").entries == []  # B's own batch 7: none past it
    assert log.read(after_batch=1, job="B").job == "B"
    # B's driver restarts after committing batch 1, with a new embedded log: it holds B's
    # batches after 1 only, and A's batch 7 cannot say whether the reader has B's 0-1
    restarted = TableLog(TABLE)
    restarted.reset(after_batch_id=1, job="B")
    restarted.append(barrier_of(10), 2, rows(2))
    with pytest.raises(LogGone) as gone:
        restarted.read(after_batch=7, job="A")
    assert gone.value.field == "job" and "stamped by B" in gone.value.message
    assert [e.batch_id for e in restarted.read(after_batch=1, job="B").entries] == [2]
    # the same when retention let B's batch 0 go
    log.keep_barriers = 0
    log.persisted(barrier_of(8), 0, snapshot_id=80)
    with pytest.raises(LogGone):
        log.read(after_batch=7, job="A")
    # a writer that names no job leaves the log answering by batch alone, as before
    unnamed = TableLog(TABLE)
    unnamed.reset(after_batch_id=-1)
    unnamed.append(barrier_of(8), 0, rows(0))
    assert unnamed.read(after_batch=7, job="A").entries == [] and unnamed.status().job is None
    with pytest.raises(Invalid) as seq_and_job:
        log.read(after_seq=0, epoch=log.epoch, job="B")
    assert seq_and_job.value.field == "job"


def test_a_reset_by_another_job_drops_the_previous_jobs_entries_and_marks() -> None:
    log = TableLog(TABLE)
    log.reset(after_batch_id=-1, job="A")
    for batch in range(6):
        log.append(barrier_of(batch), batch, rows(batch))
    log.persisted(barrier_of(4), 4, snapshot_id=40)
    epoch = log.epoch

    log.reset(after_batch_id=5, job="B")  # B's batch 5 is not A's: nothing of A stays

    status = log.status()
    assert (status.entries, status.persisted, status.complete_after, status.job) == (
        0,
        None,
        5,
        "B",
    )
    assert status.epoch == epoch + 1
    log.append(barrier_of(9), 3, rows(9))  # B's batch 3: A's mark of batch 4 is gone
    log.append(barrier_of(9), 6, rows(9))
    assert [e.batch_id for e in log.read(after_batch=5, job="B").entries] == [6]
    log.reset(after_batch_id=None)  # a revision swap forgets the job too
    assert log.status().job is None
    with pytest.raises(Invalid):
        log.reset(after_batch_id=None, job="B")


def test_appends_of_a_persisted_batch_or_another_schema_are_refused() -> None:
    log = TableLog(TABLE)
    log.append(barrier_of(0), 0, rows(0))
    log.persisted(barrier_of(0), 0, snapshot_id=1)
    with pytest.raises(Conflict, match="already persisted"):
        log.append(barrier_of(0), 0, rows(0))
    other = pa.RecordBatch.from_pydict({"name": ["x"]})
    with pytest.raises(Conflict, match="schema"):
        log.append(barrier_of(1), 1, other)
    assert log.status().entries == 1


def test_a_read_is_capped_in_bytes_but_returns_at_least_one_entry() -> None:
    log = TableLog(TABLE)
    for batch in range(3):
        log.append(barrier_of(batch), batch, rows(batch))
    first = log.read(after_seq=0, epoch=log.epoch, max_bytes=1)
    assert [e.seq for e in first.entries] == [1] and first.next_seq == 1
    with pytest.raises(Invalid):
        log.read(after_seq=0)  # a seq means nothing without its epoch
    with pytest.raises(Invalid):
        log.read(after_seq=9, epoch=log.epoch)  # past the end


def test_status_lists_the_readers_seen_in_the_last_minute() -> None:
    now = [1000.0]
    log = TableLog(TABLE, now=lambda: now[0])
    log.append(barrier_of(0), 0, rows(0))
    log.read(after_batch=0, reader="old")
    now[0] += 61
    log.read(after_batch=0, reader="new")
    assert log.status().readers == ["new"]


# -- the service over HTTP --------------------------------------------------------------------


@pytest.fixture
def service() -> Iterator[LogService]:
    with LogService(LogStore()) as running:
        yield running


def test_writer_and_client_over_http_with_offsets_and_committed_position(
    service: LogService,
) -> None:
    writer = pickle.loads(pickle.dumps(LogWriter(service.url)))  # as shipped to an executor
    epoch = writer.reset(TABLE, after_batch_id=-1)
    assert writer.append(TABLE, barrier=barrier_of(0), batch_id=0, rows=rows(1, 2)) == [1]
    assert writer.append(TABLE, barrier=barrier_of(0), batch_id=0, rows=pa.table({"id": [3]})) == [
        2
    ]
    with LogClient(service.url) as client:
        read = client.read(TABLE, after_batch=-1, reader="dash")
        assert read.epoch == epoch and read.next_seq == 2 and read.committed_batch is None
        assert read.rows is not None
        assert read.rows.to_pydict() == {
            "id": [1, 2, 3],
            "_log_barrier": [barrier_of(0)] * 3,
            "_log_batch": [0, 0, 0],
            "_log_seq": [1, 1, 2],
        }
        writer.persisted(TABLE, barrier=barrier_of(0), batch_id=0, snapshot_id=77)
        after = client.read(TABLE, after_seq=read.next_seq, epoch=epoch)
        assert after.rows is None and (after.committed_batch, after.committed_snapshot) == (0, 77)
        (status,) = client.status(TABLE)
    assert status["entries"] == 2 and status["readers"] == ["dash"]
    assert status["persisted"]["snapshot_id"] == 77
    writer.close()


def test_a_stale_position_is_410_gone_and_an_old_epoch_409_log_reset(service: LogService) -> None:
    service.store.keep_barriers = 0
    writer = LogWriter(service.url)
    writer.reset(TABLE, after_batch_id=-1)
    writer.append(TABLE, barrier=barrier_of(0), batch_id=0, rows=rows(1))
    with LogClient(service.url) as client:
        first = client.read(TABLE, after_seq=0, epoch=client.status(TABLE)[0]["epoch"])
        writer.append(TABLE, barrier=barrier_of(1), batch_id=1, rows=rows(2))
        writer.persisted(TABLE, barrier=barrier_of(1), batch_id=1, snapshot_id=5)  # both go
        with pytest.raises(LogGoneError) as gone:
            client.read(TABLE, after_seq=0, epoch=first.epoch)
        assert (gone.value.status, gone.value.code) == (410, "log_gone")
        writer.reset(TABLE, after_batch_id=1)
        with pytest.raises(LogResetError) as reset:
            client.read(TABLE, after_seq=first.next_seq, epoch=first.epoch)
        assert (reset.value.status, reset.value.field) == (409, "epoch")


def test_a_restarted_log_service_answers_an_old_position_with_log_reset() -> None:
    with LogService(LogStore()) as first:
        port = first.port
        writer = LogWriter(first.url)
        writer.reset(TABLE, after_batch_id=-1)
        for batch in range(2):
            writer.append(TABLE, barrier=barrier_of(batch), batch_id=batch, rows=rows(batch))
        with LogClient(first.url) as client:
            old = client.read(TABLE, after_batch=-1)
    assert old.next_seq == 2
    with LogService(LogStore(), port=port) as second:  # a new process: seqs start again
        writer = LogWriter(second.url)
        writer.reset(TABLE, after_batch_id=-1)
        for batch in range(4):
            writer.append(TABLE, barrier=barrier_of(batch), batch_id=batch, rows=rows(batch))
        with LogClient(second.url) as client, pytest.raises(LogResetError):
            client.read(TABLE, after_seq=old.next_seq, epoch=old.epoch)  # else seqs 1-2 missed


BAD_REQUESTS: list[tuple[str, str, dict[str, Any], int, str, str | None]] = [
    (
        "POST",
        f"/v1/tables/{TABLE}/entries?barrier=1&batch_id=1",
        {"content": b"not arrow"},
        422,
        "invalid_request",
        "body",
    ),
    (
        "POST",
        f"/v1/tables/{TABLE}/entries?barrier=x&batch_id=1",
        {"content": b""},
        422,
        "invalid_request",
        "barrier",
    ),
    (
        "POST",
        f"/v1/tables/{TABLE}/entries?barrier=-1&batch_id=1",
        {"content": b""},
        422,
        "invalid_request",
        "barrier",
    ),
    (
        "POST",
        "/v1/tables/events/entries?barrier=1&batch_id=1",
        {"content": b""},
        422,
        "invalid",
        "table",
    ),
    ("POST", f"/v1/tables/{TABLE}/persisted", {"content": b"{"}, 422, "invalid_request", "body"),
    (
        "POST",
        f"/v1/tables/{TABLE}/persisted",
        {"json": {"barrier": 1, "batch_id": 0}},
        422,
        "invalid_request",
        "snapshot_id",
    ),
    (
        "POST",
        f"/v1/tables/{TABLE}/reset",
        {"json": {"after_batch_id": -2}},
        422,
        "invalid_request",
        "after_batch_id",
    ),
    (
        "POST",
        f"/v1/tables/{TABLE}/reset",
        {"json": {"after_batch_id": 1, "x": 1}},
        422,
        "invalid_request",
        "x",
    ),
    (
        "POST",
        f"/v1/tables/{TABLE}/reset",
        {"json": {"after_batch_id": 1, "job": "events"}},
        422,
        "invalid_request",
        "job",
    ),
    (
        "POST",
        f"/v1/tables/{TABLE}/reset?job=events",
        {"json": {"after_batch_id": None}},
        422,
        "invalid",
        "job",
    ),
    (
        "POST",
        f"/v1/tables/{TABLE}/reset?job=not%20a%20job",
        {"json": {"after_batch_id": 1}},
        422,
        "invalid_request",
        "job",
    ),
    (
        "GET",
        f"/v1/tables/{TABLE}/entries?after_batch=0&job=not%20a%20job",
        {},
        422,
        "invalid_request",
        "job",
    ),
    (
        "GET",
        f"/v1/tables/{TABLE}/entries?after_seq=0&epoch=1&job=events",
        {},
        422,
        "invalid",
        "job",
    ),
    (
        "GET",
        f"/v1/tables/{TABLE}/entries?after_seq=0&after_batch=0&epoch=1",
        {},
        422,
        "invalid",
        "after_seq",
    ),
    ("GET", f"/v1/tables/{TABLE}/entries?after_seq=0", {}, 422, "invalid", "epoch"),
    ("GET", "/v1/tables/dw.unknown/entries?after_batch=0", {}, 404, "log_table_unknown", "table"),
    (
        "GET",
        f"/v1/tables/{TABLE}/entries?after_batch=0&reader={'r' * 201}",
        {},
        422,
        "invalid_request",
        "reader",
    ),
    ("DELETE", f"/v1/tables/{TABLE}/entries", {}, 405, "method_not_allowed", None),
    (
        "POST",
        f"/v1/tables/{TABLE}/entries?barrier=1&batch_id=1",
        {"content": encode([OTHER_SCHEMA_ROWS], OTHER_SCHEMA_ROWS.schema)},
        409,
        "log_schema_changed",
        "body",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code", "field"),
    BAD_REQUESTS,
    ids=[f"{m} {p.split('/v1/')[1][:40]} {s}" for m, p, _, s, _, _ in BAD_REQUESTS],
)
def test_bad_input_gets_a_json_error_and_changes_nothing(
    service: LogService,
    method: str,
    path: str,
    body: dict[str, Any],
    status: int,
    code: str,
    field: str | None,
) -> None:
    writer = LogWriter(service.url)
    writer.reset(TABLE, after_batch_id=-1)
    writer.append(TABLE, barrier=barrier_of(0), batch_id=0, rows=rows(1))
    with LogClient(service.url) as client:
        before = client.status()
        response = httpx.request(method, service.url + path, **body)
        after = client.status()
    error = assert_error(response, status, code)
    assert error.get("field") == field
    assert after == before


def test_the_embedded_service_stops_cleanly_and_frees_its_port() -> None:
    service = LogService().start()
    assert httpx.get(service.url + "/healthz").json() == {"status": "ok"}
    service.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(service.url + "/healthz", timeout=2)
    with socket.socket() as again:
        again.bind(("127.0.0.1", service.port))


# -- a reader following a real Iceberg table ----------------------------------------------------


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    opened = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path / "wh"))
    yield opened
    opened.engine.dispose()  # type: ignore[attr-defined]


class Writer:
    """What the Spark side does per batch: log the rows (two executors), commit, persist.
    Its driver resets the log naming its job, as spark_barrier's register does."""

    def __init__(
        self, catalog: Catalog, log_url: str, *, job: str = "events", after_batch_id: int = -1
    ) -> None:
        self.table: Table = ensure_table(catalog, TABLE, SCHEMA)
        self.job = job
        self.log = LogWriter(log_url)
        self.log.reset(TABLE, after_batch_id=after_batch_id, job=job)
        self.next_id = 0

    def batch(self, batch_id: int, n: int = 4, *, commit: bool = True) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        half = n // 2
        for part in (ids[:half], ids[half:]):
            self.log.append(
                TABLE, barrier=barrier_of(batch_id), batch_id=batch_id, rows=rows(*part)
            )
        if commit:
            self.commit(batch_id, ids)
        return ids

    def commit(self, batch_id: int, ids: list[int]) -> None:
        stamp = encode_stamp(barrier=barrier_of(batch_id), job=self.job, batch=batch_id)
        self.table.append(pa.Table.from_batches([rows(*ids)]), snapshot_properties=stamp)
        snapshot = self.table.current_snapshot()
        assert snapshot is not None
        self.log.persisted(
            TABLE, barrier=barrier_of(batch_id), batch_id=batch_id, snapshot_id=snapshot.snapshot_id
        )

    def table_ids(self) -> list[int]:
        return sorted(ids_of(self.table.refresh().scan().to_arrow()))


def test_a_reader_close_behind_follows_the_log_before_the_commit(
    catalog: Catalog, service: LogService
) -> None:
    writer = Writer(catalog, service.url)
    first = writer.batch(0)
    reader = LogReader(TABLE, catalog=catalog, log_url=service.url, retry_log_seconds=0)
    assert drain(reader) == ([], [])  # "latest": what is committed already is not news
    pending = writer.batch(1, commit=False)
    got, sources = drain(reader)
    assert got == pending and sources == ["log"]  # before the Iceberg commit
    writer.commit(1, pending)
    assert drain(reader) == ([], [])
    assert reader.committed_batch == 1  # the persisted mark reached the reader
    assert sorted(first + pending) == writer.table_ids()


def test_follow_yields_new_rows_until_stopped(catalog: Catalog, service: LogService) -> None:
    writer = Writer(catalog, service.url)
    reader = LogReader(TABLE, catalog=catalog, log_url=service.url)
    written = writer.batch(0, commit=False) + writer.batch(1, commit=False)
    got: list[int] = []
    polls = iter(range(10))
    for new in reader.follow(interval=0.01, stop=lambda: next(polls, None) is None):
        got += ids_of(new)
    assert got == written


def test_a_reader_may_start_before_the_table_exists(catalog: Catalog, service: LogService) -> None:
    reader = LogReader(TABLE, catalog=catalog, log_url=service.url, retry_log_seconds=0)
    assert reader.poll() is None  # no table, no log of it yet: nothing, no error
    writer = Writer(catalog, service.url)
    pending = writer.batch(0, commit=False)
    assert drain(reader)[0] == pending


def test_a_reader_far_behind_reads_the_snapshots_then_follows_the_log_again(
    catalog: Catalog, service: LogService
) -> None:
    service.store.keep_barriers = 1
    writer = Writer(catalog, service.url)
    reader = LogReader(
        TABLE, catalog=catalog, log_url=service.url, start="earliest", retry_log_seconds=0
    )
    delivered = ids_of(reader.poll())
    for batch in range(6):  # the reader sleeps; the log keeps one persisted barrier
        writer.batch(batch)
    unpersisted = writer.batch(6, commit=False)
    got, sources = drain(reader)
    delivered += got
    assert sources == ["snapshots", "log"]  # batches 0-5 from the table, 6 from the log
    assert got[-len(unpersisted) :] == unpersisted
    assert set(delivered) == set(writer.table_ids()) | set(unpersisted)
    newer = writer.batch(7)
    got, sources = drain(reader)
    assert got == newer and sources == ["log"]


def test_a_restarting_writer_resets_the_log_and_readers_get_duplicates_never_a_gap(
    catalog: Catalog, service: LogService
) -> None:
    writer = Writer(catalog, service.url)
    reader = LogReader(TABLE, catalog=catalog, log_url=service.url, retry_log_seconds=0)
    delivered: list[int] = []
    for batch in range(3):
        writer.batch(batch)
    lost = writer.batch(3, commit=False)  # the driver dies after the executors logged batch 3
    delivered += drain(reader)[0]
    assert lost[0] in delivered
    writer.log.reset(TABLE, after_batch_id=2, job="events")  # restarted after its last commit
    writer.next_id = lost[0]  # the replay makes the same rows again
    replayed = writer.batch(3)
    writer.batch(4, commit=False)
    got, sources = drain(reader)
    delivered += got
    assert "snapshots" in sources and sources[-1] == "log"
    counts = Counter(delivered)
    assert set(writer.table_ids()) <= set(counts)  # no gap
    assert all(counts[i] >= 2 for i in replayed)  # duplicates of the replayed batch
    assert set(delivered) <= set(writer.table_ids()) | set(range(writer.next_id))


def left_by_another_job(catalog: Catalog) -> int:
    """The table as its previous writer, job A, left it: its newest snapshot is A's batch 7
    (row 70). Returns that snapshot's id."""
    table = ensure_table(catalog, TABLE, SCHEMA)
    stamp = encode_stamp(barrier=barrier_of(7), job="A", batch=7)
    table.append(pa.Table.from_batches([rows(70)]), snapshot_properties=stamp)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.snapshot_id


def test_a_reader_at_another_jobs_batch_gets_every_batch_of_the_jobs_log_that_holds_them_all(
    catalog: Catalog, service: LogService
) -> None:
    left_by_another_job(catalog)
    writer = Writer(catalog, service.url, job="B")  # B's first run: its batch ids from 0
    pending = [i for batch in range(3) for i in writer.batch(batch, commit=False)]
    reader = LogReader(TABLE, catalog=catalog, log_url=service.url, retry_log_seconds=0)
    assert (reader.committed_batch, reader.committed_job) == (7, "A")

    got, sources = drain(reader)

    assert got == pending and sources == ["log"]  # not after "batch 7": B's 0-2 are all new
    writer.commit(0, pending[:4])
    assert drain(reader) == ([], [])
    assert (reader.committed_batch, reader.committed_job) == (0, "B")  # B's mark now
    newer = writer.batch(3, commit=False)
    assert drain(reader) == (newer, ["log"])


def test_a_reader_at_another_jobs_batch_reads_snapshots_until_the_new_writer_commits(
    catalog: Catalog, service: LogService
) -> None:
    left_by_another_job(catalog)
    # B restarts after its batch 5 (which wrote nothing here): the log holds its batches
    # after 5 only, and A's batch 7 cannot say whether the reader has B's 0-5
    writer = Writer(catalog, service.url, job="B", after_batch_id=5)
    six, seven = writer.batch(6, commit=False), writer.batch(7, commit=False)
    reader = LogReader(TABLE, catalog=catalog, log_url=service.url, retry_log_seconds=0)

    assert drain(reader) == ([], [])  # nothing committed since A's batch 7; no row skipped
    assert reader.source == "snapshots"
    writer.commit(6, six)
    got, sources = drain(reader)

    assert got == six + seven and sources == ["snapshots", "log"]
    assert (reader.committed_batch, reader.committed_job) == (6, "B")
    eight = writer.batch(8, commit=False)
    assert drain(reader) == (eight, ["log"])


def test_a_position_kept_without_its_job_takes_the_job_from_the_snapshots_stamp(
    catalog: Catalog, service: LogService
) -> None:
    a_seven = left_by_another_job(catalog)
    writer = Writer(catalog, service.url, job="B")
    pending = writer.batch(0, commit=False)
    reader = LogReader(TABLE, catalog=catalog, log_url=service.url, retry_log_seconds=0)
    # as read_log's offset of an older version sets it: snapshot and batch, no job
    reader.committed_snapshot, reader.committed_batch, reader.committed_job = a_seven, 7, None

    got, sources = drain(reader)

    assert got == pending and sources == ["log"]
    assert reader.committed_job == "A"  # from the stamp: another job's batch 7


def test_a_down_log_service_makes_the_reader_read_snapshots_with_one_warning(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    service = LogService(LogStore()).start()
    port = service.port
    writer = Writer(catalog, service.url)
    reader = LogReader(TABLE, catalog=catalog, log_url=service.url, retry_log_seconds=0)
    writer.batch(0, commit=False)
    assert reader.poll() is not None and reader.source == "log"
    writer.commit(0, list(range(4)))
    service.stop()
    table_only = Writer.__new__(Writer)  # the writer goes on committing without its log
    table_only.table, table_only.next_id = writer.table, writer.next_id
    delivered: list[int] = []
    with caplog.at_level(logging.INFO, logger="metaservice.logstore.reader"):
        for batch in (1, 2, 3):
            ids = list(range(table_only.next_id, table_only.next_id + 2))
            table_only.next_id += 2
            stamp = encode_stamp(barrier=barrier_of(batch), job="events", batch=batch)
            writer.table.append(pa.Table.from_batches([rows(*ids)]), snapshot_properties=stamp)
            delivered += drain(reader, polls=3)[0]
            assert reader.source == "snapshots"
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()
        # batch 0 again (the reader had it from the log only), then every committed row
        assert set(delivered) == set(range(10)) == set(writer.table_ids())
        # the log service comes back (a new process: empty, a new epoch) on the same port
        with LogService(LogStore(), port=port) as back:
            back_writer = LogWriter(back.url)
            back_writer.reset(TABLE, after_batch_id=3)
            back_writer.append(TABLE, barrier=barrier_of(4), batch_id=4, rows=rows(100))
            got, sources = drain(reader)
        assert got == [100] and sources == ["log"]
        assert any("reachable again" in r.getMessage() for r in caplog.records)


# -- a table's log registered with the MetaService ---------------------------------------------


def test_a_table_log_is_published_and_shown_with_the_table(client: TestClient) -> None:
    put_job(client, "events", [TABLE])
    spec = {"mode": "external", "address": "http://10.0.0.5:7070"}
    view = client.put(f"{API}/tables/{TABLE}/log", json=spec)
    assert view.status_code == 200, view.text
    shown = {**spec, "addresses": [spec["address"]], "updated_ms": T0}
    assert view.json()["log"] == shown
    assert client.get(f"{API}/tables/{TABLE}").json()["log"] == shown
    (listed,) = client.get(f"{API}/tables").json()["items"]
    assert listed["log"]["address"] == "http://10.0.0.5:7070"
    moved = client.put(
        f"{API}/tables/{TABLE}/log", json={"mode": "embedded", "address": "http://127.0.0.1:41234"}
    )
    assert moved.json()["log"]["mode"] == "embedded"
    assert client.delete(f"{API}/tables/{TABLE}/log").json()["log"] is None
    assert client.get(f"{API}/tables/{TABLE}").json()["log"] is None


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "field"),
    [
        (
            "/tables/dw.unknown/log",
            {"mode": "embedded", "address": "http://h:1"},
            404,
            "not_found",
            "table",
        ),
        (
            f"/tables/{TABLE}/log",
            {"mode": "kafka", "address": "http://h:1"},
            422,
            "invalid_request",
            "mode",
        ),
        (
            f"/tables/{TABLE}/log",
            {"mode": "embedded", "address": "h:1"},
            422,
            "invalid_request",
            "address",
        ),
        (
            f"/tables/{TABLE}/log",
            {"mode": "embedded", "address": "http://h 1"},
            422,
            "invalid_request",
            "address",
        ),
        (f"/tables/{TABLE}/log", {"mode": "embedded"}, 422, "invalid_request", "address"),
        (
            f"/tables/{TABLE}/log",
            {"mode": "embedded", "address": "http://h\x00:1"},  # PostgreSQL text holds no NUL
            422,
            "invalid_character",  # refused with any NUL, before the schema (http_guard)
            "address",
        ),
        (
            f"/tables/{TABLE}/log",
            {"mode": "embedded", "address": "http://h:1", "x": 1},
            422,
            "invalid_request",
            "x",
        ),
    ],
)
def test_a_bad_table_log_is_refused_and_changes_nothing(
    client: TestClient,
    db_url: str,
    path: str,
    body: dict[str, Any],
    status: int,
    code: str,
    field: str,
) -> None:
    put_job(client, "events", [TABLE])
    with unchanged(db_url):
        response = client.put(API + path, json=body)
    error = assert_error(response, status, code)
    assert field in str(error.get("field")), error


def test_a_reader_of_a_table_without_a_log_is_told_how_to_enable_it(
    settings: Settings, clock: ManualClock, catalog: Catalog, service: LogService
) -> None:
    with LiveServer(create_app(settings, clock)) as server, MetaServiceClient(server.url) as ms:
        ms.put_job("events", outputs=[TABLE])
        with pytest.raises(LogNotEnabled) as refused:
            LogReader.from_metaservice(TABLE, ms, catalog=catalog)
        message = str(refused.value)
        assert 'register(..., log="embedded")' in message and "metaservice log start" in message
        writer = Writer(catalog, service.url)
        ms.put_table_log(TABLE, mode="embedded", address=service.url)
        reader = LogReader.from_metaservice(TABLE, ms, catalog=catalog, retry_log_seconds=0)
        pending = writer.batch(0, commit=False)
        assert ids_of(reader.poll()) == pending


def test_a_jobs_driver_resets_its_tables_logs_naming_the_job(
    settings: Settings, clock: ManualClock, catalog: Catalog, service: LogService
) -> None:
    """What spark_barrier's register does for a job with a log (its JobLog), without Spark:
    the log learns whose batch ids it holds, and the MetaService where the log is."""
    table = ensure_table(catalog, TABLE, SCHEMA)
    with LiveServer(create_app(settings, clock)) as server, MetaServiceClient(server.url) as ms:
        ms.put_job("events", outputs=[TABLE])
        job_log = JobLog("external", service.url)
        job_log.open(ms, "events", {TABLE: table}, 4, {})
        job_log.close()
        assert ms.get_table(TABLE).log.address == service.url  # type: ignore[union-attr]
    status = service.store.existing(TABLE).status()
    assert (status.job, status.complete_after) == ("events", 4)


def test_a_jobs_driver_resets_its_log_after_a_batch_committed_but_not_yet_reported(
    settings: Settings, clock: ManualClock, catalog: Catalog, service: LogService
) -> None:
    """The previous driver committed batch 6 and its report waits in the outbox (the
    MetaService knows batch 4): the log is reset after 6, not after 4, so it does not
    claim to hold batches 5 and 6, which nobody appends again."""
    table = ensure_table(catalog, TABLE, SCHEMA)
    for batch in (4, 6):
        table.append(
            pa.Table.from_batches([rows(batch)]),
            snapshot_properties=encode_stamp(barrier_of(batch), "events", batch),
        )
    table.append(  # another job's later stamp (a former writer) does not count
        pa.Table.from_batches([rows(9)]),
        snapshot_properties=encode_stamp(barrier_of(9), "former", 9),
    )
    with LiveServer(create_app(settings, clock)) as server, MetaServiceClient(server.url) as ms:
        ms.put_job("events", outputs=[TABLE])
        job_log = JobLog("external", service.url)
        job_log.open(ms, "events", {TABLE: catalog.load_table(TABLE)}, 4, {})
        job_log.close()
    assert service.store.existing(TABLE).status().complete_after == 6


# -- a table's log status, asked through the MetaService ---------------------------------------

STATUS_FIELDS = {
    "epoch",
    "entries",
    "bytes",
    "first",
    "last",
    "persisted",
    "complete_after",
    "over_bound",
    "readers",
    "spilled_entries",
    "spilled_bytes",
    "spill_folder",
    "job",
}


def test_a_table_log_status_is_what_its_log_service_holds(
    client: TestClient, service: LogService
) -> None:
    put_job(client, "events", [TABLE])
    spec = {"mode": "embedded", "address": service.url}
    assert client.put(f"{API}/tables/{TABLE}/log", json=spec).status_code == 200
    writer = LogWriter(service.url)
    writer.reset(TABLE, after_batch_id=-1, job="events")
    writer.append(TABLE, barrier=barrier_of(0), batch_id=0, rows=rows(1, 2))
    writer.persisted(TABLE, barrier=barrier_of(0), batch_id=0, snapshot_id=500)
    writer.append(TABLE, barrier=barrier_of(1), batch_id=1, rows=rows(3))
    writer.append(TABLE, barrier=barrier_of(1), batch_id=1, rows=rows(4, 5))
    with LogClient(service.url) as reader:
        reader.read(TABLE, after_batch=-1, reader="dashboard")

    response = client.get(f"{API}/tables/{TABLE}/log")

    assert response.status_code == 200, response.text
    body = response.json()
    held = status_json(service.store.existing(TABLE).status())
    assert set(body["status"]) == STATUS_FIELDS
    shown = {k: held[k] for k in STATUS_FIELDS}
    assert body == {
        **spec,
        "addresses": [spec["address"]],
        "updated_ms": T0,
        "table": TABLE,
        "reachable": True,
        "error": None,
        "status": shown,
        "services": [
            {"address": spec["address"], "reachable": True, "error": None, "status": shown}
        ],
    }
    status = body["status"]
    assert status["entries"] == 3 and status["bytes"] > 0
    assert status["first"] == {"barrier": barrier_of(0), "batch_id": 0, "seq": 1}
    assert status["last"] == {"barrier": barrier_of(1), "batch_id": 1, "seq": 3}
    assert status["persisted"] == {
        "barrier": barrier_of(0),
        "batch_id": 0,
        "snapshot_id": 500,
        "through_seq": 2,
    }
    assert status["complete_after"] == -1 and status["over_bound"] is False
    assert status["readers"] == ["dashboard"] and status["job"] == "events"


class Listening:
    """A socket that takes connections and never answers (a log service that hangs)."""

    def __enter__(self) -> str:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(8)
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        self.socket.close()


@pytest.fixture
def not_a_log_service(tmp_path: Path) -> Iterator[str]:
    """A plain file server whose ``/v1/status`` is a text file: something else listens there."""
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "status").write_text("hello, I am not a log service")
    handler = partial(QuietFiles, directory=str(tmp_path))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as files:
        thread = threading.Thread(target=files.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{files.server_address[1]}"
        files.shutdown()
        thread.join(timeout=10)


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_log_service_that_is_down_hangs_or_holds_nothing_is_shown_with_the_reason(
    settings: Settings, clock: ManualClock, service: LogService, not_a_log_service: str
) -> None:
    tables = [TABLE, "dw.hangs", "dw.empty", "dw.other"]
    down = f"http://127.0.0.1:{free_port()}"
    with (
        LiveServer(create_app(settings, clock)) as server,
        MetaServiceClient(server.url) as ms,
        Listening() as hanging,
    ):
        ms.put_job("events", outputs=tables)
        ms.put_table_log(TABLE, mode="external", address=down)
        ms.put_table_log("dw.hangs", mode="external", address=hanging)
        ms.put_table_log("dw.empty", mode="embedded", address=service.url)
        ms.put_table_log("dw.other", mode="external", address=not_a_log_service)

        refused = ms.get_table_log(TABLE)
        started = time.monotonic()
        hung = ms.get_table_log("dw.hangs")
        waited = time.monotonic() - started
        empty = ms.get_table_log("dw.empty")
        other = ms.get_table_log("dw.other")

    assert (refused.table, refused.mode, refused.address) == (TABLE, "external", down)
    assert refused.updated_ms == T0
    assert refused.reachable is False and refused.status is None
    assert refused.error == f"no log service answered at {down}"
    assert hung.reachable is False and hung.status is None
    assert hung.error == f"no log service answered at {hanging}"  # the same: no port oracle
    assert 1.5 < waited < 8, waited  # the probe's 2 s deadline, not the client's 10 s
    # Reachable, but it holds nothing of the table: its writer has not appended there yet.
    assert empty.reachable is True and empty.status is None
    assert empty.error == f"the log service at {service.url} holds nothing of dw.empty"
    assert other.reachable is True and other.status is None
    assert other.error == f"{not_a_log_service} did not answer with a log status"


def test_the_log_of_an_unknown_table_is_404_and_of_a_table_without_one_says_how_to_enable_it(
    client: TestClient, db_url: str
) -> None:
    put_job(client, "events", [TABLE])
    with unchanged(db_url):
        unknown = client.get(f"{API}/tables/dw.unknown/log")
        none = client.get(f"{API}/tables/{TABLE}/log")
    assert_error(unknown, 404, "not_found", "table")
    message = assert_error(none, 404, "no_log", "table")["message"]
    assert 'register(..., log="embedded")' in message and "metaservice log start" in message
    spec = {"mode": "external", "address": f"http://127.0.0.1:{free_port()}"}
    assert client.put(f"{API}/tables/{TABLE}/log", json=spec).status_code == 200
    assert client.get(f"{API}/tables/{TABLE}/log").json()["reachable"] is False
    assert client.delete(f"{API}/tables/{TABLE}/log").status_code == 200
    assert_error(client.get(f"{API}/tables/{TABLE}/log"), 404, "no_log", "table")
