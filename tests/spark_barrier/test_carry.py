"""One request per batch, the job's half (``spark_barrier/carry.py``): a source batch's
barrier request carries the last batch's report, progress and offline-grant promise,
against the real service (in-process, manual clock), the outbox staying the durable
store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from metaservice.app import create_app
from metaservice.client import ConflictError, MetaServiceClient
from metaservice.clock import ManualClock
from metaservice.migrate import upgrade
from metaservice.settings import Settings
from metaservice.topology.schemas import JobEvent
from spark_barrier.carry import BatchRequests
from spark_barrier.listener import BarrierListener
from spark_barrier.offline import CARRIED_WAIT_SHARE, OfflineBarriers
from spark_barrier.report import OutboxReporter
from tests.spark_barrier.test_offline import SLOT, T0, Partition, Rig, report_of, wait_for

BARRIER = "POST /api/v1/jobs/src/batches/{}/barrier"


class Job:
    """A source job's driver without Spark: what the sink and the listener do."""

    def __init__(self, rig: Rig, carry_s: float = 30.0, state: Path | None = None) -> None:
        state = state or rig.state
        self.reporter = OutboxReporter(rig.client, state / "outbox", carry_s=carry_s)
        self.offline = OfflineBarriers(
            rig.client,
            "src",
            self.reporter.outbox,
            state,
            heartbeat_s=3600,
            offline_after_s=0.2,
            clock=rig.clock,
        )
        self.offline.report_in()
        self.listener = BarrierListener(rig.client)
        self.listener.jobs.add("src")
        self.listener.carry("src", carry_s)
        self.requests = BatchRequests(rig.client, "src", self.reporter, self.listener, self.offline)
        self.offline.ask = lambda b, q: self.requests.ask(b, query_id=q)

    def batch(self, batch_id: int) -> int:
        """Barrier, commit, report and progress of one batch; its barrier."""
        barrier = self.offline.barrier_for(batch_id, query_id="q1")
        self.reporter.report(report_of(batch_id, barrier))
        self.listener._put("src", JobEvent(event="progress", run_id="r", batch_id=batch_id))
        return barrier

    def close(self) -> None:
        self.offline.close(release=False)
        self.reporter.close()
        self.listener.stop()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    db_url = f"sqlite:///{tmp_path / 'ms.db'}"
    upgrade(db_url)
    clock = ManualClock(T0)
    with TestClient(create_app(Settings(db_url=db_url), clock)) as service:
        net = Partition(service._transport)
        client = MetaServiceClient("http://testserver", transport=net)
        client.put_job("src", outputs=["ods.orders"])
        (tmp_path / "state").mkdir()
        yield Rig(service, clock, net, client, tmp_path / "state")
        client.close()


def requests_after(rig: Rig, mark: int) -> list[str]:
    return rig.net.requests[mark:]


def test_a_batch_is_one_request_carrying_the_last_ones_report_progress_and_promise(rig):
    job = Job(rig)
    b0 = job.batch(0)
    rig.clock.advance(SLOT)
    mark = len(rig.net.requests)
    b1 = job.batch(1)
    assert b1 == b0 + SLOT
    # Batch 0's report was acknowledged on batch 1's request: the outbox counts it
    # delivered and never sends it.
    wait_for(lambda: job.reporter.outbox.acked_seq == 1)
    time.sleep(0.3)
    assert requests_after(rig, mark) == [BARRIER.format(1)]
    assert rig.snapshots("ods.orders") == [(0, b0)]
    assert rig.service.get("/api/v1/jobs/src").json()["status"] == "running"
    # The promise renewed the grant: batch 1 open, batch 0 reported, the table is
    # complete up to the slot before batch 1's.
    assert rig.frontier("ods.orders") == b0
    # ... and the heartbeat sends nothing more in this slot, and waits for the next
    # batch's request in the next one.
    assert job.offline._reported_this_slot()
    # (the wait may pass the heartbeat's own period: a slot and a half at most)
    job.offline._heartbeat_s = SLOT / 1000
    wait = job.offline._until_next_report_s()
    assert 1 + CARRIED_WAIT_SHARE - 0.01 <= wait <= 1 + CARRIED_WAIT_SHARE + 0.01
    job.close()


def test_a_report_whose_answer_is_lost_is_delivered_by_the_outbox(rig):
    job = Job(rig)
    b0 = job.batch(0)
    rig.clock.advance(SLOT)
    rig.net.lose_answers = True  # batch 1's request lands; its answer does not
    mark = len(rig.net.requests)
    with pytest.raises(Exception):  # noqa: B017 (the barrier's answer never arrives)
        job.requests.ask(1, query_id="q1")
    rig.net.lose_answers = False
    # Not acknowledged: the deliverer sends it at once, as before (a duplicate there).
    assert job.reporter.flush(10)
    assert "POST /api/v1/commits/batch" in requests_after(rig, mark)
    assert rig.snapshots("ods.orders") == [(0, b0)]
    job.close()


def test_a_refused_carried_report_refuses_nothing_else_and_the_outbox_settles_it(rig):
    job = Job(rig)
    b0 = job.batch(0)
    # Reported already with another snapshot (by a second driver, say).
    rig.client.report_commits([{**report_of(0, b0), "snapshot_id": 999}])
    rig.clock.advance(SLOT)
    b1 = job.batch(1)
    assert b1 == b0 + SLOT  # the barrier was given
    # The deliverer sends the refused report alone, which the service refuses for good:
    # logged and dropped (G3: the first report stands); batch 1's is delivered.
    assert job.reporter.flush(10)
    assert rig.snapshots("ods.orders") == [(0, b0), (1, b1)]
    items = rig.service.get("/api/v1/tables/ods.orders/snapshots").json()["items"]
    assert {i["batch_id"]: i["snapshot_id"] for i in items}[0] == 999
    job.close()


def test_a_crash_between_the_answer_and_the_ack_redelivers_the_report(rig):
    job = Job(rig)
    b0 = job.batch(0)
    rig.clock.advance(SLOT)
    # The request carries the report and is answered, and the driver dies before the
    # outbox records that: the report stays in the outbox.
    taken = job.reporter.take_reports("src")
    assert [e.record for e in taken] == [report_of(0, b0)]
    answer = rig.client.batch_barrier("src", 1, reports=[e.record for e in taken])
    assert answer.carried is not None and answer.carried.reports is not None
    job.reporter.deliverer.close()
    job.reporter.outbox.close()
    job.offline.close(release=False)
    job.listener.stop()
    # The restarted driver's outbox delivers it again: a duplicate, acknowledged.
    mark = len(rig.net.requests)
    again = OutboxReporter(rig.client, rig.state / "outbox", carry_s=30.0)
    assert again.flush(10)
    assert requests_after(rig, mark) == ["POST /api/v1/commits/batch"]
    assert rig.snapshots("ods.orders") == [(0, b0)]
    again.close()


def test_a_report_no_request_comes_for_is_sent_by_the_outbox_in_time(rig):
    job = Job(rig, carry_s=0.3)
    b0 = job.batch(0)
    started = time.monotonic()
    wait_for(lambda: job.reporter.outbox.acked_seq == 1)
    assert time.monotonic() - started >= 0.2  # held for the next request first
    assert rig.snapshots("ods.orders") == [(0, b0)]
    # The held progress goes the same way.
    wait_for(lambda: rig.service.get("/api/v1/jobs/src").json()["status"] == "running")
    job.close()


def test_a_refused_barrier_still_settles_what_it_carried(rig):
    job = Job(rig)
    b0 = job.batch(0)
    rig.clock.advance(SLOT)
    # Another Spark query asks for batch 1 (a reset checkpoint or a second driver).
    mark = len(rig.net.requests)
    with pytest.raises(ConflictError) as refused:
        job.requests.ask(1, query_id="q2")
    assert refused.value.code == "query_reset"
    carried = refused.value.carried
    assert carried is not None and carried.reports is not None and carried.progress
    wait_for(lambda: job.reporter.outbox.acked_seq == 1)
    time.sleep(0.2)
    assert requests_after(rig, mark) == [BARRIER.format(1)]
    assert rig.snapshots("ods.orders") == [(0, b0)]
    job.close()


# -- a derived job: one barrier stream, not one per input ---------------------------------


def test_a_derived_jobs_sources_share_each_ready_end(rig):
    from spark_barrier.source import BarrierStreamReader

    # ods.b has no writer yet: the job's next batch is not ready.
    rig.client.put_job("both", inputs=["ods.orders", "ods.b"], outputs=["dw.both"])
    shared = rig.state / "next-barrier.json"

    def reader(table: str) -> BarrierStreamReader:
        options = {"url": "http://testserver", "job": "both", "table": table, "catalog": "{}"}
        r = BarrierStreamReader({**options, "shared_ends": str(shared)}, None)  # type: ignore[arg-type]
        r._client = rig.client
        return r

    a, b = reader("ods.orders"), reader("ods.b")
    start = {"barrier": 0}
    # Not ready: each source asks (a "not ready" is never shared).
    mark = len(rig.net.requests)
    assert a.latestOffset(start, None) == start  # type: ignore[arg-type]
    assert b.latestOffset(start, None) == start  # type: ignore[arg-type]
    assert len(requests_after(rig, mark)) == 2
    rig.client.put_job("src_b", outputs=["ods.b"])
    rig.clock.advance(2 * SLOT)
    # Ready: the first source of the trigger asks, the other answers the same end from
    # the shared file.
    mark = len(rig.net.requests)
    end = a.latestOffset(start, None)  # type: ignore[arg-type]
    assert end["barrier"] >= T0
    assert b.latestOffset(start, None) == end  # type: ignore[arg-type]
    assert requests_after(rig, mark) == ["GET /api/v1/jobs/both/next-barrier"]
    # Another start is not answered from it.
    assert b._shared_end(end["barrier"]) is None
