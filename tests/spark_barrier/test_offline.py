"""A source job's offline barriers against the real service (in-process, manual clock),
with the job's network cut and restored: G1 and G4 across an outage."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from metaservice.app import create_app
from metaservice.client import ApiError, MetaServiceClient, Unavailable
from metaservice.clock import ManualClock
from metaservice.migrate import upgrade
from metaservice.settings import Settings
from spark_barrier.offline import (
    COMMIT_REPORTS_RESERVE_BYTES,
    SLOT_REPORT_JITTER_MS,
    SLOT_REPORT_MARGIN_MS,
    NoOfflineGrant,
    OfflineBarriers,
)
from spark_barrier.outbox import HEADER_BYTES, OutboxFullError, decode_frame_header
from spark_barrier.report import DirectReporter, OutboxReporter

T0 = 1_700_000_000_000
SLOT = 1000


class Partition(httpx.BaseTransport):
    """The job's side of the network: it can be cut, or lose the answers only."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.down = False
        self.lose_answers = False
        self.refuse_with: int | None = None  # answer this status without passing it on
        self.requests: list[str] = []  # "METHOD path" of each request that got through

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("network cut by the test", request=request)
        if self.refuse_with is not None:
            body = {"code": "refused_by_test", "message": "refused by the test"}
            return httpx.Response(self.refuse_with, json=body)
        self.requests.append(f"{request.method} {request.url.path}")
        response = self.inner.handle_request(request)
        body = response.read()
        if self.lose_answers:
            raise httpx.ReadError("answer lost by the test", request=request)
        return httpx.Response(response.status_code, headers=response.headers, content=body)


@dataclass
class Rig:
    service: TestClient  # the service, as a reader who is never cut off sees it
    clock: ManualClock
    net: Partition
    client: MetaServiceClient  # the job's client, through the partition
    state: Path

    def job(
        self, name: str = "src", **outbox_options: Any
    ) -> tuple[OfflineBarriers, OutboxReporter]:
        reporter = OutboxReporter(self.client, self.state / "outbox", **outbox_options)
        offline = OfflineBarriers(
            self.client,
            name,
            reporter.outbox,
            self.state,
            heartbeat_s=3600,
            offline_after_s=0.2,
            clock=self.clock,  # the job's clock: here the same as the service's
        )
        return offline, reporter

    def frontier(self, table: str) -> int:
        return int(self.service.get(f"/api/v1/tables/{table}").json()["frontier"])

    def snapshots(self, table: str) -> list[tuple[int, int]]:
        items = self.service.get(f"/api/v1/tables/{table}/snapshots").json()["items"]
        return sorted((i["batch_id"], i["barrier"]) for i in items)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    db_url = f"sqlite:///{tmp_path / 'ms.db'}"
    upgrade(db_url)
    clock = ManualClock(T0)
    with TestClient(create_app(Settings(db_url=db_url), clock)) as service:
        net = Partition(service._transport)
        client = MetaServiceClient("http://testserver", transport=net)
        client.put_job("src", outputs=["ods.orders"])
        client.put_job("der", inputs=["ods.orders"], outputs=["dw.detail"])
        yield Rig(service, clock, net, client, tmp_path / "state")
        client.close()


def report_of(batch_id: int, barrier: int) -> dict[str, Any]:
    return {
        "job": "src",
        "batch_id": batch_id,
        "barrier": barrier,
        "table": "ods.orders",
        "snapshot_id": 100 + batch_id,
    }


def commit(reporter: OutboxReporter, batch_id: int, barrier: int) -> None:
    reporter.report(report_of(batch_id, barrier))


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_batches_commit_through_an_outage_and_the_frontier_never_passes_them(rig: Rig) -> None:
    rig.state.mkdir()
    offline, reporter = rig.job()
    offline.report_in()
    b0 = offline.barrier_for(0)
    commit(reporter, 0, b0)
    assert reporter.flush(5)
    rig.clock.advance(SLOT)
    offline.report_in()
    held = rig.frontier("ods.orders")
    assert held == b0  # the floor is the job's slot: the frontier one below it

    rig.net.down = True
    claimed = []
    for batch_id in (1, 2, 3):
        rig.clock.advance(2 * SLOT)
        barrier = offline.barrier_for(batch_id)
        commit(reporter, batch_id, barrier)
        claimed.append(barrier)
        # Readers (not cut off) never see the frontier pass what the job may still claim.
        assert rig.frontier("ods.orders") == held
    assert all(b % SLOT == 0 for b in claimed)
    assert b0 < claimed[0] <= claimed[1] <= claimed[2]
    assert offline.barrier_for(2) == claimed[1]  # a replayed batch: the same barrier
    assert offline.controls_pending() and not offline.report_in()

    rig.net.down = False
    assert reporter.flush(10)
    assert rig.snapshots("ods.orders") == [(0, b0), *zip((1, 2, 3), claimed, strict=True)]
    assert offline.report_in()
    assert rig.frontier("ods.orders") == claimed[2] - SLOT  # the closed slot
    rig.clock.advance(SLOT)
    assert offline.report_in()
    assert rig.frontier("ods.orders") == claimed[2]
    offline.close()
    assert reporter.flush(5)
    reporter.close()
    assert rig.service.get("/api/v1/jobs/src").json()["offline_floor"] is None


def test_a_restarted_driver_finds_its_undelivered_claims(rig: Rig) -> None:
    rig.state.mkdir()
    offline, reporter = rig.job()
    offline.report_in()
    rig.net.down = True
    rig.clock.advance(3 * SLOT)
    first = offline.barrier_for(0)
    offline.close(release=False)  # the driver dies: no release
    reporter.close()

    offline, reporter = rig.job()  # still cut off
    assert offline.granted and offline.controls_pending()
    assert offline.barrier_for(0) == first  # Spark replays batch 0
    rig.clock.advance(SLOT)
    second = offline.barrier_for(1)
    assert second >= first
    commit(reporter, 0, first)
    commit(reporter, 1, second)
    rig.net.down = False
    assert reporter.flush(10)
    assert rig.snapshots("ods.orders") == [(0, first), (1, second)]
    offline.close()
    reporter.close()


def test_a_claim_replaces_a_barrier_whose_answer_was_lost(rig: Rig) -> None:
    rig.state.mkdir()
    offline, reporter = rig.job()
    offline.report_in()
    rig.clock.advance(5 * SLOT)
    rig.net.lose_answers = True  # the service assigns a barrier, the job never hears it
    own = offline.barrier_for(0)
    rig.net.lose_answers = False
    commit(reporter, 0, own)
    assert reporter.flush(10)
    assert rig.snapshots("ods.orders") == [(0, own)]
    offline.close()
    reporter.close()


def test_without_a_grant_an_unreachable_service_fails_the_batch(rig: Rig) -> None:
    rig.state.mkdir()
    offline, reporter = rig.job()  # never reached the service
    rig.net.down = True
    with pytest.raises(NoOfflineGrant, match="holds no offline grant"):
        offline.barrier_for(0, patience_s=0.3)
    assert isinstance(NoOfflineGrant("x"), Unavailable)
    offline.close(release=False)
    reporter.close()


def test_the_heartbeat_keeps_an_idle_source_table_following_the_clock(rig: Rig) -> None:
    rig.state.mkdir()
    reporter = OutboxReporter(rig.client, rig.state / "outbox")
    offline = OfflineBarriers(
        rig.client, "src", reporter.outbox, rig.state, heartbeat_s=0.05, clock=rig.clock
    )
    wait_for(lambda: offline.granted)
    rig.clock.advance(10 * SLOT)
    wait_for(lambda: rig.frontier("ods.orders") == T0 + 9 * SLOT)
    rig.net.down = True
    time.sleep(0.2)
    rig.clock.advance(10 * SLOT)
    assert rig.frontier("ods.orders") <= T0 + 10 * SLOT  # silent job: held at its floor
    offline.close(release=False)
    reporter.close()


def test_a_heartbeat_once_a_slot_reports_just_after_each_slot_begins(rig: Rig) -> None:
    rig.state.mkdir()
    reporter = OutboxReporter(rig.client, rig.state / "outbox")
    once_a_slot = OfflineBarriers(
        rig.client, "src", reporter.outbox, rig.state, heartbeat_s=SLOT / 1000, clock=rig.clock
    )
    once_a_slot.report_in()  # the grant: the job learns the slot and the clock's offset
    latest = (SLOT_REPORT_MARGIN_MS + SLOT_REPORT_JITTER_MS) / 1000
    rig.clock.advance(300)
    assert 0.7 + SLOT_REPORT_MARGIN_MS / 1000 <= once_a_slot._until_next_report_s() <= 0.7 + latest
    rig.clock.advance(690)
    assert (
        0.01 + SLOT_REPORT_MARGIN_MS / 1000 <= once_a_slot._until_next_report_s() <= 0.01 + latest
    )
    # Reported just after the boundary, the job's promise moves its tables past the
    # slot that just closed.
    rig.clock.advance(10 + SLOT_REPORT_MARGIN_MS)
    once_a_slot.report_in()
    assert rig.frontier("ods.orders") == T0
    once_a_slot.close(release=False)
    # A heartbeat slower than a slot keeps its own pace.
    slower = OfflineBarriers(
        rig.client, "src", reporter.outbox, rig.state, heartbeat_s=3600, clock=rig.clock
    )
    slower.report_in()
    assert slower._until_next_report_s() == 3600
    slower.close(release=False)
    reporter.close()


def test_a_backlog_of_offline_batches_drains_in_few_requests(rig: Rig) -> None:
    rig.state.mkdir()
    offline, reporter = rig.job()
    offline.report_in()
    rig.net.down = True
    claimed = []
    for batch_id in range(60):
        rig.clock.advance(SLOT)
        claimed.append(offline.barrier_for(batch_id))
        commit(reporter, batch_id, claimed[-1])
    rig.net.requests.clear()
    rig.net.down = False
    assert reporter.flush(10)
    assert rig.snapshots("ods.orders") == list(enumerate(claimed))
    # 120 records, up to 100 per delivery: per delivery one request of claims and one
    # of commits. The attempt that failed in the outage is retried with the records
    # written since (it held a few of the first, and sent them alone: 6 requests).
    assert set(rig.net.requests) == {"POST /api/v1/jobs/src/claims", "POST /api/v1/commits/batch"}
    assert len(rig.net.requests) == 4, rig.net.requests
    offline.close()
    reporter.close()


def test_a_full_outbox_stops_the_job_before_a_commit_it_could_not_report(rig: Rig) -> None:
    rig.state.mkdir()
    offline, reporter = rig.job(max_bytes=COMMIT_REPORTS_RESERVE_BYTES + 2048)
    offline.report_in()
    rig.net.down = True
    batch_id = 0
    with pytest.raises(OutboxFullError, match="kept free for the reports that follow"):
        while True:
            rig.clock.advance(SLOT)
            barrier = offline.barrier_for(batch_id)
            commit(reporter, batch_id, barrier)  # never refused: the claim kept room
            batch_id += 1
    assert batch_id > 0
    backlog = reporter.outbox.backlog
    rig.net.down = False
    assert reporter.flush(10)
    assert backlog == 2 * batch_id  # a claim and a report for every batch that got one
    assert [b for b, _ in rig.snapshots("ods.orders")] == list(range(batch_id))
    offline.close()
    reporter.close()


def test_a_refused_token_holds_reports_back_and_one_bad_report_drops_no_other(
    rig: Rig,
) -> None:
    rig.state.mkdir()
    reporter = OutboxReporter(rig.client, rig.state / "outbox")
    barriers = [rig.client.batch_barrier("src", batch_id).barrier for batch_id in range(3)]
    rig.net.refuse_with = 401  # e.g. a token revoked by mistake: an operator fixes it
    for batch_id in range(3):
        if batch_id == 1:  # a report the service refuses for good, amid good ones
            reporter.report({**report_of(batch_id, barriers[batch_id]), "table": "no.such"})
        commit(reporter, batch_id, barriers[batch_id])
    assert not reporter.flush(1.0)
    assert reporter.outbox.backlog == 4  # nothing dropped while the token is refused
    rig.net.refuse_with = None
    assert reporter.flush(10)
    assert rig.snapshots("ods.orders") == list(enumerate(barriers))
    reporter.close()


def test_reports_fenced_off_by_a_job_change_or_an_abandon_are_dropped_and_the_rest_land(
    rig: Rig,
) -> None:
    """A report for an output added after its batch was opened, and the late report of an
    abandoned batch, are refused for good (409): the outbox drops each alone, delivers
    every other report, and never records the refused ones."""
    rig.state.mkdir()
    reporter = OutboxReporter(rig.client, rig.state / "outbox")
    b0 = rig.client.batch_barrier("src", 0).barrier
    rig.client.put_job("src", outputs=["ods.orders", "ods.extra"])  # while batch 0 is open
    rig.clock.advance(SLOT)
    b1 = rig.client.batch_barrier("src", 1).barrier
    extra = {"table": "ods.extra"}
    reporter.report({**report_of(0, b0), **extra})  # batch 0 was opened without ods.extra
    commit(reporter, 0, b0)
    reporter.report({**report_of(1, b1), **extra})
    commit(reporter, 1, b1)
    assert reporter.flush(10)
    rig.clock.advance(SLOT)
    b2 = rig.client.batch_barrier("src", 2).barrier  # its driver dies
    rig.clock.advance(3 * SLOT)
    rig.client.abandon_batch("src", 2)
    rig.clock.advance(SLOT)
    b3 = rig.client.batch_barrier("src", 3).barrier
    for batch_id, barrier in ((2, b2), (3, b3)):  # the dead driver's outbox, delivered late
        reporter.report({**report_of(batch_id, barrier), **extra})
        commit(reporter, batch_id, barrier)
    assert reporter.flush(10)
    assert reporter.outbox.backlog == 0
    assert rig.snapshots("ods.orders") == [(0, b0), (1, b1), (3, b3)]
    assert rig.snapshots("ods.extra") == [(1, b1), (3, b3)]
    # Nothing the refusals left behind holds the tables: they follow the clock.
    rig.clock.advance(2 * SLOT)
    assert rig.frontier("ods.orders") == rig.clock.now_ms() // SLOT * SLOT - SLOT
    reporter.close()


def test_a_direct_reporter_goes_on_past_a_report_for_an_output_added_after_its_batch(
    rig: Rig,
) -> None:
    """Without an outbox the refusal would fail the batch, whose replay reports it again."""
    reporter = DirectReporter(rig.client, give_up_after_s=5)
    b0 = rig.client.batch_barrier("src", 0).barrier
    rig.client.put_job("src", outputs=["ods.orders", "ods.extra"])  # while batch 0 is open
    reporter.report({**report_of(0, b0), "table": "ods.extra"})  # refused, logged
    reporter.report(report_of(0, b0))
    assert rig.snapshots("ods.orders") == [(0, b0)]
    assert rig.snapshots("ods.extra") == []
    with pytest.raises(ApiError) as refused:  # any other refusal still stops the batch
        reporter.report({**report_of(1, b0), "table": "no.such"})
    assert refused.value.status == 404


def machine_crash(directory: Path, durable_seq: int) -> None:
    """What a machine crash leaves of an outbox: the records fsynced, nothing after."""
    for segment in sorted(directory.glob("*.wal")):
        data = segment.read_bytes()
        offset = 0
        while offset + HEADER_BYTES <= len(data):
            length, _crc, seq = decode_frame_header(data[offset : offset + HEADER_BYTES])
            if seq > durable_seq:
                break
            offset += HEADER_BYTES + length
        segment.write_bytes(data[:offset])


def test_a_replayed_batch_is_reported_after_a_crash_with_interval_fsync(rig: Rig) -> None:
    rig.state.mkdir()
    lazy = {"fsync": "interval", "fsync_interval_s": 3600}  # nothing fsynced in the background
    offline, reporter = rig.job(**lazy)
    offline.report_in()
    b0 = offline.barrier_for(0)
    commit(reporter, 0, b0)
    assert reporter.flush(5)

    rig.net.down = True
    rig.clock.advance(2 * SLOT)
    b1 = offline.barrier_for(1)  # claimed offline; then committed to Iceberg
    commit(reporter, 1, b1)
    durable = reporter.outbox.durable_seq
    offline.close(release=False)  # the machine dies: nothing more reaches the disk
    reporter.close()
    machine_crash(rig.state / "outbox", durable)

    rig.clock.advance(5 * SLOT)
    rig.net.down = False
    offline, reporter = rig.job(**lazy)
    offline.report_in()  # as register() does when the driver starts again
    # Spark replays batch 1; its snapshot is committed, so the sink reports its stamp.
    commit(reporter, 1, b1)
    assert reporter.flush(10)
    assert rig.snapshots("ods.orders") == [(0, b0), (1, b1)]
    assert offline.report_in()
    assert rig.frontier("ods.orders") >= b1
    offline.close()
    reporter.close()
