"""One request per batch: a barrier request carrying the job's earlier commit reports,
its listener progress and its offline-grant promise, each part applied and answered on
its own (``metaservice/barriers/carried.py``)."""

from __future__ import annotations

from typing import Any

from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    get_json,
    put_job,
    report,
)

PROGRESS = {"event": "progress", "run_id": "r1", "batch_id": 0, "num_input_rows": 5}


def carrying(client: Any, job: str, batch_id: int, **body: Any) -> Any:
    return client.post(f"{API}/jobs/{job}/batches/{batch_id}/barrier", json=body)


def snapshots(client: Any, table: str) -> list[tuple[int, int | None]]:
    items = get_json(client, f"/tables/{table}/snapshots")["items"]
    return sorted((i["batch_id"], i["snapshot_id"]) for i in items)


def test_a_source_batch_carries_the_last_ones_report_progress_and_promise(client, clock):
    put_job(client, "src", ["ods.a"])
    b0 = barrier(client, "src", 0)["barrier"]
    clock.advance(SLOT)
    r = carrying(
        client,
        "src",
        1,
        query_id="q1",
        reports=[report("src", 0, b0, "ods.a", 100)],
        progress=PROGRESS,
        floor=T0 + SLOT,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["barrier"] == T0 + SLOT and body["batch_id"] == 1
    carried = body["carried"]
    assert carried["reports"]["recorded"] == 1
    assert carried["reports"]["results"][0]["batch_committed"] is True
    assert carried["reports_refused"] is None
    assert carried["progress"] is True and carried["progress_refused"] is None
    assert carried["grant"]["floor"] == T0 + SLOT and carried["grant_refused"] is None
    assert snapshots(client, "ods.a") == [(0, 100)]
    job = get_json(client, "/jobs/src")
    assert job["status"] == "running"
    # Batch 0 is reported, batch 1 open at the new slot: the table is complete up to
    # the slot before it.
    assert get_json(client, "/tables/ods.a")["frontier"] == T0
    # The same request again (an answer lost on the way back): the same barrier, the
    # report a duplicate.
    again = carrying(client, "src", 1, query_id="q1", reports=[report("src", 0, b0, "ods.a", 100)])
    assert again.status_code == 200, again.text
    assert again.json()["barrier"] == body["barrier"]
    assert again.json()["carried"]["reports"]["duplicates"] == 1


def test_a_plain_barrier_answer_has_no_carried_part(client, clock):
    put_job(client, "src", ["ods.a"])
    assert "carried" not in barrier(client, "src", 0)


def test_a_refused_report_refuses_nothing_else(client, clock, db_url):
    put_job(client, "src", ["ods.a"])
    b0 = barrier(client, "src", 0)["barrier"]
    r = client.post(f"{API}/commits", json=report("src", 0, b0, "ods.a", 100))
    assert r.status_code == 200, r.text
    clock.advance(SLOT)
    # A report conflicting with the recorded one (another snapshot), beside a good one.
    r = carrying(
        client,
        "src",
        1,
        reports=[report("src", 0, b0, "ods.a", 999)],
        progress=PROGRESS,
        floor=T0 + SLOT,
    )
    assert r.status_code == 200, r.text
    carried = r.json()["carried"]
    assert carried["reports"] is None
    refused = carried["reports_refused"]
    assert refused["status"] == 409 and refused["code"] == "conflicting_report"
    assert refused["field"] == "reports.0.snapshot_id"
    assert carried["progress"] is True and carried["grant"]["floor"] == T0 + SLOT
    assert r.json()["barrier"] == T0 + SLOT
    assert snapshots(client, "ods.a") == [(0, 100)]  # unchanged
    # All or nothing within the reports: a batch with a good and a bad report records
    # neither, as POST /commits/batch.
    b1 = r.json()["barrier"]
    clock.advance(SLOT)
    r = carrying(
        client,
        "src",
        2,
        reports=[report("src", 1, b1, "ods.a", 101), report("src", 1, b1 + SLOT, "ods.a", 101)],
    )
    assert r.status_code == 200, r.text
    assert r.json()["carried"]["reports_refused"]["code"] == "barrier_mismatch"
    assert snapshots(client, "ods.a") == [(0, 100)]


def test_a_report_of_another_job_or_too_many_are_refused_alone(client, clock):
    put_job(client, "src", ["ods.a"])
    put_job(client, "other", ["ods.b"])
    ob = barrier(client, "other", 0)["barrier"]
    r = carrying(client, "src", 0, reports=[report("other", 0, ob, "ods.b", 7)])
    assert r.status_code == 200, r.text
    refused = r.json()["carried"]["reports_refused"]
    assert (refused["code"], refused["field"]) == ("other_job", "reports.0.job")
    assert snapshots(client, "ods.b") == []


def test_a_refused_grant_or_progress_refuses_nothing_else(client, clock):
    put_job(client, "src", ["ods.a"])
    put_job(client, "der", ["dw.b"], inputs=["ods.a"])
    b0 = barrier(client, "src", 0)["barrier"]
    clock.advance(SLOT)
    # A derived job has no offline grant: its promise is refused, nothing else.
    r = carrying(client, "src", 1, reports=[report("src", 0, b0, "ods.a", 100)], floor=0)
    assert r.status_code == 200 and r.json()["carried"]["grant"] is not None
    nxt = get_json(client, "/jobs/der/next-barrier")
    assert nxt["ready"], nxt
    r = carrying(
        client,
        "der",
        0,
        start=nxt["start_barrier"],
        end=nxt["barrier"],
        floor=T0,
        progress=PROGRESS,
    )
    assert r.status_code == 200, r.text
    carried = r.json()["carried"]
    assert carried["grant"] is None and carried["grant_refused"]["code"] == "not_source"
    assert carried["progress"] is True
    assert r.json()["barrier"] == nxt["barrier"]


def test_the_barrier_still_catches_a_reset_query_and_the_parts_stand_alone(client, clock):
    put_job(client, "src", ["ods.a"])
    r = carrying(client, "src", 0, query_id="q1")
    b0 = r.json()["barrier"]
    clock.advance(SLOT)
    # A second driver (another Spark query) asks for batch 1 carrying batch 0's report
    # (it ran batch 0 of the first query's checkpoint, say): its barrier is refused, the
    # report, which is right, is recorded on its own, and the answer says so.
    r = carrying(
        client,
        "src",
        1,
        query_id="q2",
        reports=[report("src", 0, b0, "ods.a", 100)],
        progress=PROGRESS,
        floor=T0 + SLOT,
    )
    body = assert_error(r, 409, "query_reset")
    assert body["carried"]["reports"]["recorded"] == 1
    assert body["carried"]["progress"] is True
    assert body["carried"]["grant"]["floor"] == T0 + SLOT
    assert snapshots(client, "ods.a") == [(0, 100)]
    # Nothing of batch 1 was opened: the first query's batch 1 gets the current slot.
    assert carrying(client, "src", 1, query_id="q1").json()["barrier"] == T0 + SLOT
    # A reset checkpoint (batch 0 again from a new query) is refused the same way.
    r = carrying(client, "src", 0, query_id="q3", progress=PROGRESS)
    assert assert_error(r, 409, "query_reset")["carried"]["progress"] is True


def test_a_claim_carries_nothing_else(client, clock):
    put_job(client, "src", ["ods.a"])
    # Offline claims go through the outbox, the batch's reports after them.
    r = carrying(client, "src", 0, barrier=T0, floor=T0)
    assert_error(r, 422, "claim_carries", "barrier")
