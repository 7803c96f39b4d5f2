"""Regression tests for the ways consistency broke on ordinary paths (the consistency
issue; the scenarios of ../shared/repro/consistency/ adapted to the API): one end per
batch, job changes, a reset Spark query, clock skew of one job, stalls (abandon,
auto-advance) and a job deleted under a request."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from metaservice.barriers import repository as barrier_repo
from metaservice.errors import NotFound
from tests.conftest import START_MS as T0
from tests.metaservice.helpers import (
    API,
    SLOT,
    assert_error,
    barrier,
    commit,
    consistent,
    get_json,
    next_barrier,
    put_job,
    report,
    run_batch,
    unchanged,
)


def ask(client, job, batch_id, **body):
    return client.post(f"{API}/jobs/{job}/batches/{batch_id}/barrier", json=body or None)


def two_sources_one_derived(client, clock):
    put_job(client, "sa", ["ods.a"])
    put_job(client, "sb", ["ods.b"])
    put_job(client, "d", ["dw.out"], inputs=["ods.a", "ods.b"])
    run_batch(client, "sa", 0, {"ods.a": 1})
    run_batch(client, "sb", 0, {"ods.b": 2})
    clock.advance(2 * SLOT)


# -- one end per batch (s1_race) -----------------------------------------------------------


def test_sources_of_one_batch_get_one_end_whatever_reports_land_in_between(client, clock):
    two_sources_one_derived(client, clock)
    start = get_json(client, "/jobs/d")["frontier"]
    first = next_barrier(client, "d", after=start, source="ods.a")
    assert first["ready"]
    b0 = first["barrier"]
    assert next_barrier(client, "d", after=start, source="ods.b")["barrier"] == b0
    batch0 = ask(client, "d", 0, start=start, end=b0).json()
    assert (batch0["start_barrier"], batch0["barrier"]) == (start, b0)
    # Batch 0 is in Iceberg; its report waits in the outbox. Sources ingest more.
    clock.advance(SLOT)
    run_batch(client, "sa", 1, {"ods.a": 3})
    run_batch(client, "sb", 1, {"ods.b": 4})
    clock.advance(2 * SLOT)
    a1 = next_barrier(client, "d", after=b0, source="ods.a")["barrier"]
    commit(client, "d", 0, b0, "dw.out", 10)  # delivered between the two sources' calls
    b1 = next_barrier(client, "d", after=b0, source="ods.b")["barrier"]
    assert a1 == b1 > b0
    view = ask(client, "d", 1, start=b0, end=a1).json()
    assert view["barrier"] == a1
    assert {r["table"]: (r["from_snapshot"], r["to_snapshot"]) for r in view["inputs"]} == {
        "ods.a": (1, 3),
        "ods.b": (2, 4),
    }


def test_the_next_batch_may_start_while_the_previous_report_is_on_its_way(client, clock):
    two_sources_one_derived(client, clock)
    b0 = next_barrier(client, "d", after=0, source="ods.a")["barrier"]
    ask(client, "d", 0, start=0, end=b0)
    clock.advance(SLOT)
    run_batch(client, "sa", 1, {"ods.a": 3})
    clock.advance(2 * SLOT)
    b1 = next_barrier(client, "d", after=b0, source="ods.a")["barrier"]
    assert ask(client, "d", 1, start=b0, end=b1).status_code == 200  # batch 0 not reported
    commit(client, "d", 0, b0, "dw.out", 10)
    commit(client, "d", 1, b1, "dw.out", 11)
    assert get_json(client, "/jobs/d")["frontier"] == b1


def test_not_ready_holds_for_the_rest_of_the_trigger(client, clock):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s", "ods.t"])
    # Nobody writes ods.t yet: the first source is told "not ready".
    first = next_barrier(client, "d", after=0, source="ods.s")
    assert not first["ready"] and first["barrier"] == 0
    put_job(client, "t", ["ods.t"])
    run_batch(client, "s", 0, {"ods.s": 1})
    run_batch(client, "t", 0, {"ods.t": 2})
    clock.advance(3 * SLOT)
    # The second source of the same trigger gets the same answer...
    assert not next_barrier(client, "d", after=0, source="ods.t")["ready"]
    # ...and the next trigger, starting with a source that asked before, a new one.
    second = next_barrier(client, "d", after=0, source="ods.s")
    assert second["ready"]
    assert next_barrier(client, "d", after=0, source="ods.t")["barrier"] == second["barrier"]


def test_a_long_poll_answers_as_soon_as_the_batch_is_ready(client, clock):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s", "ods.t"])  # nobody writes ods.t yet
    answers: list[dict] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            next_barrier(client, "d", after=0, source="ods.s", wait_ms=20_000)
        )
    )
    started = time.monotonic()
    waiting.start()
    time.sleep(0.3)
    assert not answers, "the long poll answered before its input had a writer"
    put_job(client, "t", ["ods.t"])
    run_batch(client, "s", 0, {"ods.s": 1})
    run_batch(client, "t", 0, {"ods.t": 2})
    clock.advance(3 * SLOT)  # the sources' slots close
    waiting.join(timeout=15)
    assert answers and answers[0]["ready"], answers
    assert time.monotonic() - started < 10, "the long poll waited out its whole wait_ms"


def test_a_long_poll_times_out_not_ready_and_a_held_round_answers_at_once(client, clock):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s", "ods.t"])  # nobody writes ods.t yet
    started = time.monotonic()
    first = next_barrier(client, "d", after=0, source="ods.s", wait_ms=300)
    assert not first["ready"] and time.monotonic() - started >= 0.3
    put_job(client, "t", ["ods.t"])
    run_batch(client, "s", 0, {"ods.s": 1})
    run_batch(client, "t", 0, {"ods.t": 2})
    clock.advance(3 * SLOT)
    # The other source of the same trigger: held "not ready", answered without waiting.
    started = time.monotonic()
    assert not next_barrier(client, "d", after=0, source="ods.t", wait_ms=20_000)["ready"]
    assert time.monotonic() - started < 5


def test_a_long_poll_longer_than_the_limit_is_refused(client):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    r = client.get(f"{API}/jobs/d/next-barrier", params={"wait_ms": 10**9})
    assert r.status_code == 422, r.text


def test_a_batch_spark_planned_otherwise_is_refused(client, clock, db_url):
    two_sources_one_derived(client, clock)
    b0 = next_barrier(client, "d", after=0, source="ods.a")["barrier"]
    with unchanged(db_url):
        assert_error(ask(client, "d", 0, start=0, end=b0 - SLOT), 409, "batch_plan_mismatch")
        assert_error(ask(client, "d", 0, start=0, end=0), 409, "empty_range")
    ask(client, "d", 0, start=0, end=b0)
    # A replay of the batch must be the same batch.
    assert ask(client, "d", 0, start=0, end=b0).status_code == 200
    assert_error(ask(client, "d", 0, start=0, end=b0 + SLOT), 409, "batch_plan_mismatch")


def test_the_empty_first_batch_of_a_query_is_recognised(client, clock):
    two_sources_one_derived(client, clock)
    frontier = get_json(client, "/jobs/d")["frontier"]
    # Spark's first batch of a new query up to the initial offset: nothing to read.
    assert_error(ask(client, "d", 0, end=frontier), 409, "empty_range")


def test_next_barrier_refuses_a_start_the_job_never_reached(client, clock):
    two_sources_one_derived(client, clock)
    r = client.get(f"{API}/jobs/d/next-barrier", params={"after": T0 + 100 * SLOT})
    assert_error(r, 409, "unknown_start", field="after")


def test_input_ranges_are_the_services_mapping_and_need_final_inputs(client, clock):
    two_sources_one_derived(client, clock)
    next_barrier(client, "d", after=0, source="ods.a")  # seals the sources past T0
    ranges = get_json(client, "/jobs/d/ranges", after=0, to=T0)
    assert {r["table"]: (r["from_snapshot"], r["to_snapshot"]) for r in ranges} == {
        "ods.a": (None, 1),
        "ods.b": (None, 2),
    }
    r = client.get(f"{API}/jobs/d/ranges", params={"after": 0, "to": T0 + 100 * SLOT})
    assert_error(r, 409, "not_final", field="to")


# -- job changes (s3_kind, s4_inputs, s13_out) ----------------------------------------------


def test_a_derived_job_that_ran_cannot_become_a_source_job(client, clock, db_url):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    run_batch(client, "s", 0, {"ods.s": 1})
    clock.advance(3 * SLOT)
    opened = barrier(client, "d", 0)
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/d", json={"inputs": [], "outputs": ["dw.d"]})
        body = assert_error(r, 409, "job_identity_changed", field="inputs")
    assert "new job" in body["message"] and "DELETE" in body["message"]
    commit(client, "d", 0, opened["barrier"], "dw.d", 77)
    assert get_json(client, "/jobs/d")["frontier"] == opened["barrier"]


def test_a_job_that_ran_cannot_change_its_inputs(client, clock, db_url):
    put_job(client, "sa", ["ods.a"])
    put_job(client, "sb", ["ods.b"])
    put_job(client, "d", ["dw.d"], inputs=["ods.a"])
    run_batch(client, "sa", 0, {"ods.a": 1})
    clock.advance(2 * SLOT)
    run_batch(client, "d", 0, {"dw.d": 500})
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/d", json={"inputs": ["ods.a", "ods.b"], "outputs": ["dw.d"]})
        assert_error(r, 409, "job_identity_changed", field="inputs")


def test_a_job_that_never_ran_may_still_change(client):
    put_job(client, "d", ["dw.d"], inputs=["ods.a"])
    assert put_job(client, "d", ["dw.d"], inputs=["ods.a", "ods.b"])["inputs"] == [
        "ods.a",
        "ods.b",
    ]
    assert put_job(client, "d", ["dw.d"])["kind"] == "source"


def test_an_output_can_be_added_and_removed_only_between_batches(client, clock, db_url):
    put_job(client, "s", ["ods.a", "ods.b"])
    b = barrier(client, "s", 0)["barrier"]
    commit(client, "s", 0, b, "ods.a", 1)
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/s", json={"inputs": [], "outputs": ["ods.a"]})
        assert_error(r, 409, "batch_open", field="outputs")
    # Adding one while the batch is open: the batch still completes with its own outputs.
    put_job(client, "s", ["ods.a", "ods.b", "ods.c"])
    assert commit(client, "s", 0, b, "ods.b", 2)["batch_committed"]
    put_job(client, "s", ["ods.a", "ods.c"])  # between batches
    clock.advance(600 * SLOT)
    assert get_json(client, "/jobs/s")["frontier"] >= T0 + 598 * SLOT


# -- a reset Spark query (item 6) -----------------------------------------------------------


def test_batches_of_another_spark_query_are_refused(client, clock, db_url):
    put_job(client, "s", ["ods.s"])
    for batch_id in range(3):
        b = ask(client, "s", batch_id, query_id="q-1").json()["barrier"]
        commit(client, "s", batch_id, b, "ods.s", batch_id + 1)
        clock.advance(SLOT)
    assert ask(client, "s", 2, query_id="q-1").status_code == 200  # a replay
    with unchanged(db_url):
        body = assert_error(ask(client, "s", 0, query_id="q-2"), 409, "query_reset")
        assert_error(ask(client, "s", 3, query_id="q-2"), 409, "query_reset")
    assert "checkpoint" in body["message"] and "new job" in body["message"]
    assert ask(client, "s", 3, query_id="q-1").status_code == 200


# -- one job's clock skew (s10_skew) --------------------------------------------------------


def test_an_offline_claim_ahead_of_the_clock_moves_no_other_jobs_barriers(client, clock):
    put_job(client, "s1", ["ods.a"])
    put_job(client, "s2", ["ods.b"])
    client.put(f"{API}/jobs/s1/offline-grant", json={"floor": 0})
    clock.advance(SLOT)
    ahead = clock.now_ms() + 50_000
    ahead -= ahead % SLOT
    claimed = ask(client, "s1", 0, barrier=ahead)
    assert claimed.status_code == 200 and claimed.json()["barrier"] == ahead
    commit(client, "s1", 0, ahead, "ods.a", 1)  # its own report is accepted
    for i in range(3):
        clock.advance(5 * SLOT)
        b = run_batch(client, "s2", i, {"ods.b": 100 + i})
        assert b == clock.now_ms() - clock.now_ms() % SLOT
        clock.advance(SLOT)
        assert consistent(client, "ods.b").json()["snapshots"] == {"ods.b": 100 + i}
    # The skewed job's own next batch follows its claim, not the service's clock.
    assert barrier(client, "s1", 1)["barrier"] >= ahead


# -- stalls: abandon (s12_dead) and auto-advance -------------------------------------------


def test_an_abandoned_batch_no_longer_holds_its_tables(client, clock, db_url):
    put_job(client, "s", ["ods.s", "ods.t"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    b = barrier(client, "s", 0)["barrier"]
    commit(client, "s", 0, b, "ods.s", 1)  # the driver dies before reporting ods.t
    clock.advance(3600 * SLOT)
    assert consistent(client, "ods.s").json()["barrier"] < b  # held below the open batch
    abandoned = client.post(f"{API}/jobs/s/batches/0/abandon")
    assert abandoned.status_code == 200, abandoned.text
    assert client.post(f"{API}/jobs/s/batches/0/abandon").status_code == 200  # idempotent
    version = consistent(client, "ods.s").json()
    assert version["barrier"] >= T0 + 3598 * SLOT
    assert version["snapshots"] == {"ods.s": None}  # the half-reported batch is forgotten
    with unchanged(db_url):
        r = client.post(f"{API}/commits", json=report("s", 0, b, "ods.t", 2))
        assert_error(r, 409, "batch_abandoned")
    # A restarted driver replaying the batch gets a barrier past what readers saw.
    replay = barrier(client, "s", 0)["barrier"]
    assert replay > version["barrier"]
    commit(client, "s", 0, replay, "ods.s", 3)
    commit(client, "s", 0, replay, "ods.t", 4)
    clock.advance(2 * SLOT)
    assert consistent(client, "ods.s,ods.t").json()["snapshots"] == {"ods.s": 3, "ods.t": 4}


def test_abandon_is_for_an_admin_and_for_open_source_batches(client, clock):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    run_batch(client, "s", 0, {"ods.s": 1})
    clock.advance(2 * SLOT)
    barrier(client, "d", 0)
    assert_error(client.post(f"{API}/jobs/s/batches/0/abandon"), 409, "batch_committed")
    assert_error(client.post(f"{API}/jobs/d/batches/0/abandon"), 409, "not_source")
    assert_error(client.post(f"{API}/jobs/s/batches/9/abandon"), 404, "unknown_batch")


def test_an_idle_derived_job_is_advanced_by_the_service(client, clock):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    put_job(client, "e", ["dws.e"], inputs=["dw.d"])
    run_batch(client, "s", 0, {"ods.s": 1})
    clock.advance(2 * SLOT)
    run_batch(client, "d", 0, {"dw.d": 10})
    run_batch(client, "e", 0, {"dws.e": 20})
    # The source goes on committing empty batches; d and e stop running.
    clock.advance(100 * SLOT)
    version = consistent(client, "ods.s,dw.d,dws.e").json()
    assert version["barrier"] >= T0 + 64 * SLOT
    assert version["snapshots"] == {"ods.s": 1, "dw.d": 10, "dws.e": 20}
    # Once the input changes, the stopped job holds the version back again.
    changed = run_batch(client, "s", 1, {"ods.s": 2})
    clock.advance(100 * SLOT)
    assert consistent(client, "dw.d,dws.e").json()["barrier"] < changed
    assert get_json(client, "/jobs/d")["frontier"] < changed


def test_a_job_spark_runs_behind_an_advance_catches_up_without_reading_twice(client, clock):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    run_batch(client, "s", 0, {"ods.s": 1})
    clock.advance(2 * SLOT)
    b0 = next_barrier(client, "d", after=0, source="ods.s")["barrier"]
    ask(client, "d", 0, start=0, end=b0)
    commit(client, "d", 0, b0, "dw.d", 10)
    clock.advance(50 * SLOT)
    advanced = consistent(client, "dw.d").json()["barrier"]
    assert advanced > b0  # advanced while Spark was away, still at offset b0
    # One read takes every aligned step up to its input's frontier (the last closed slot)
    source = get_json(client, "/jobs/s")["frontier"]
    assert advanced == get_json(client, "/jobs/d")["frontier"] == source
    # Spark, still at b0, plans its next batch a slot later: past the advance, reading
    # nothing it read before (at once, it would be refused as empty: test above).
    clock.advance(SLOT)
    nxt = next_barrier(client, "d", after=b0, source="ods.s")
    assert nxt["ready"] and nxt["barrier"] >= advanced
    view = ask(client, "d", 1, start=b0, end=nxt["barrier"]).json()
    assert [(r["from_snapshot"], r["to_snapshot"]) for r in view["inputs"]] == [(1, 1)]


# -- smaller (item 13) ----------------------------------------------------------------------


def test_a_job_deleted_under_a_request_is_a_404(db_url):
    from sqlalchemy.orm import Session

    from metaservice.db import make_engine

    engine = make_engine(db_url)
    with Session(engine) as session, pytest.raises(NotFound):
        barrier_repo.lock_job(session, 12345)
    engine.dispose()


def test_a_derived_batch_records_the_inputs_it_read(client, clock, db_url):
    put_job(client, "sa", ["ods.a"])
    put_job(client, "d", ["dw.d"], inputs=["ods.a"])
    run_batch(client, "sa", 0, {"ods.a": 1})
    clock.advance(2 * SLOT)
    barrier(client, "d", 0)
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT job_id, batch_id, table_id FROM batch_inputs")).all()
    engine.dispose()
    assert len(rows) == 1 and rows[0][1] == 0


def test_deleting_a_job_forgets_its_plans_and_batch_inputs(client, clock, db_url):
    two_sources_one_derived(client, clock)
    b0 = next_barrier(client, "d", after=0, source="ods.a")["barrier"]
    ask(client, "d", 0, start=0, end=b0)
    assert client.delete(f"{API}/jobs/d").status_code == 204
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        for table in ("batch_plans", "batch_inputs"):
            assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar() == 0
    engine.dispose()
    # Registered again under the same name, it starts from scratch.
    put_job(client, "d", ["dw.out"], inputs=["ods.a", "ods.b"])
    assert next_barrier(client, "d", after=0, source="ods.a")["start_barrier"] == 0


def test_a_planned_batch_of_a_stopped_job_does_not_stop_its_advance(client, clock, db_url):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    run_batch(client, "s", 0, {"ods.s": 1})
    clock.advance(2 * SLOT)
    b0 = next_barrier(client, "d", after=0, source="ods.s")["barrier"]
    ask(client, "d", 0, start=0, end=b0)
    commit(client, "d", 0, b0, "dw.d", 10)
    clock.advance(3 * SLOT)
    b1 = next_barrier(client, "d", after=b0, source="ods.s")["barrier"]  # then the driver stops
    clock.advance(100 * SLOT)
    version = consistent(client, "ods.s,dw.d").json()
    assert version["barrier"] > b1 and version["snapshots"] == {"ods.s": 1, "dw.d": 10}
    # The restarted driver runs the planned batch: nothing to run, it never commits.
    with unchanged(db_url):
        assert_error(ask(client, "d", 1, start=b0, end=b1), 409, "empty_range")
    nxt = next_barrier(client, "d", after=b1, source="ods.s")
    assert nxt["barrier"] >= get_json(client, "/jobs/d")["frontier"]


def test_an_open_batch_holds_the_advance_back(client, clock):
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    run_batch(client, "s", 0, {"ods.s": 1})
    clock.advance(2 * SLOT)
    b0 = next_barrier(client, "d", after=0, source="ods.s")["barrier"]
    ask(client, "d", 0, start=0, end=b0)  # open: it may still commit a snapshot at b0
    clock.advance(100 * SLOT)
    assert get_json(client, "/jobs/d")["frontier"] == 0
    assert_error(consistent(client, "dw.d"), 409, "no_consistent_version")
    commit(client, "d", 0, b0, "dw.d", 10)
    assert consistent(client, "dw.d").json()["snapshots"] == {"dw.d": 10}


def test_claims_delivered_in_bulk_carry_their_spark_query(client, clock, db_url):
    put_job(client, "s", ["ods.s"])
    client.put(f"{API}/jobs/s/offline-grant", json={"floor": 0})
    clock.advance(SLOT)
    b = clock.now_ms()
    claims = [{"batch_id": i, "barrier": b, "query_id": "q-1"} for i in range(2)]
    r = client.post(f"{API}/jobs/s/claims", json={"claims": claims})
    assert r.status_code == 200, r.text
    with unchanged(db_url):
        r = client.post(
            f"{API}/jobs/s/claims",
            json={"claims": [{"batch_id": 0, "barrier": b, "query_id": "q-2"}]},
        )
        assert_error(r, 409, "query_reset", field="claims.0.query_id")
    assert ask(client, "s", 2, query_id="q-2").status_code == 409
