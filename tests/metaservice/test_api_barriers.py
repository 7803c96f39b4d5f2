"""API tests for the barrier clock, batch barriers, next-barrier and commit reports."""

from __future__ import annotations

from fastapi.testclient import TestClient

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.settings import Settings
from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    commit,
    custom_client,
    db_state,
    get_json,
    put_job,
    report,
    run_batch,
    source_and_derived,
    unchanged,
)

# -- source jobs: the barrier clock -------------------------------------------------------


def test_source_batch_gets_the_current_slot_on_the_grid(client, clock):
    put_job(client, "src", ["ods.orders"])
    clock.advance(1234)
    assert barrier(client, "src", 0) == {
        "job": "src",
        "batch_id": 0,
        "barrier": T0 + SLOT,
        "start_barrier": None,
        "committed": False,
        "inputs": [],
    }


def test_source_batches_in_the_same_slot_share_a_barrier(client, clock):
    put_job(client, "src", ["ods.orders"])
    b0 = run_batch(client, "src", 0, {"ods.orders": 1})
    clock.advance(300)
    b1 = barrier(client, "src", 1)["barrier"]
    clock.advance(600)
    b2 = barrier(client, "src", 2)["barrier"]
    assert b0 == b1 == b2 == T0
    clock.advance(100)  # the next slot
    assert barrier(client, "src", 3)["barrier"] == T0 + SLOT


def test_barriers_strictly_increase_from_slot_to_slot_and_stay_on_the_grid(client, clock):
    put_job(client, "src", ["ods.orders"])
    seen = []
    for i, step in enumerate([0, 1700, 10, 990, 2500, 1]):
        clock.advance(step)
        seen.append(run_batch(client, "src", i, {"ods.orders": i}))
    assert all(b % SLOT == 0 for b in seen)
    assert seen == sorted(seen)
    distinct = sorted(set(seen))
    assert distinct == [T0, T0 + SLOT, T0 + 2 * SLOT, T0 + 5 * SLOT]


def test_replayed_source_batch_gets_the_same_barrier_and_records_nothing_new(client, clock, db_url):
    put_job(client, "src", ["ods.orders"])
    first = barrier(client, "src", 0)
    clock.advance(5 * SLOT)
    batches_before = db_state(db_url)["batches"]
    assert barrier(client, "src", 0) == first
    assert db_state(db_url)["batches"] == batches_before
    commit(client, "src", 0, first["barrier"], "ods.orders", 7)
    clock.advance(5 * SLOT)
    again = barrier(client, "src", 0)
    assert again == {**first, "committed": True}


def test_barriers_never_go_backwards_when_the_clock_steps_back_after_a_restart(
    client, clock, settings
):
    put_job(client, "src", ["ods.orders"])
    clock.advance(5 * SLOT)
    issued = barrier(client, "src", 0)["barrier"]
    assert issued == T0 + 5 * SLOT
    behind = ManualClock(T0)  # a restarted replica whose clock is 5 s behind
    with TestClient(create_app(Settings(db_url=settings.db_url), behind)) as restarted:
        put_job(restarted, "other", ["ods.other"])
        assert barrier(restarted, "other", 0)["barrier"] == issued
        assert barrier(restarted, "src", 1)["barrier"] == issued
        behind.advance(6 * SLOT)
        assert barrier(restarted, "other", 1)["barrier"] == T0 + 6 * SLOT


def test_source_frontier_is_one_slot_below_the_oldest_open_batch(client, clock):
    put_job(client, "src", ["ods.orders"])
    b0 = barrier(client, "src", 0)["barrier"]
    clock.advance(5 * SLOT)
    assert get_json(client, "/jobs/src")["frontier"] == b0 - SLOT
    b1 = barrier(client, "src", 1)["barrier"]
    assert b1 == T0 + 5 * SLOT
    commit(client, "src", 0, b0, "ods.orders", 10)
    assert get_json(client, "/jobs/src")["frontier"] == b1 - SLOT
    assert get_json(client, "/tables/ods.orders")["frontier"] == b1 - SLOT
    clock.advance(3 * SLOT)
    assert get_json(client, "/jobs/src")["frontier"] == b1 - SLOT  # still held by batch 1
    commit(client, "src", 1, b1, "ods.orders", 11)
    assert get_json(client, "/jobs/src")["frontier"] == T0 + 7 * SLOT  # the last closed slot


def test_idle_source_frontier_follows_the_last_closed_slot(client, clock):
    put_job(client, "src", ["ods.orders"])
    assert get_json(client, "/jobs/src")["frontier"] == T0 - SLOT
    run_batch(client, "src", 0, {"ods.orders": 1})
    assert get_json(client, "/jobs/src")["frontier"] == T0 - SLOT  # its slot is still open
    clock.advance(3500)
    assert get_json(client, "/jobs/src")["frontier"] == T0 + 2 * SLOT
    assert get_json(client, "/tables/ods.orders")["frontier"] == T0 + 2 * SLOT


def test_batch_ids_going_backwards_are_refused_and_change_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    barrier(client, "src", 5)
    with unchanged(db_url):
        r = client.post(f"{API}/jobs/src/batches/3/barrier")
        assert_error(r, 409, "batch_out_of_order", field="batch_id")
    # gaps forward are fine, and the newest batch can be replayed
    assert barrier(client, "src", 9)["batch_id"] == 9
    assert barrier(client, "src", 5)["batch_id"] == 5


def test_batch_barrier_for_unknown_job_gives_404_and_changes_nothing(client, db_url):
    with unchanged(db_url):
        assert_error(
            client.post(f"{API}/jobs/ghost/batches/0/barrier"), 404, "not_found", field="job"
        )


def test_batch_barrier_with_bad_batch_id_gives_422_and_changes_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        for bad in ["-1", str(2**63), "abc", "1.5"]:
            r = client.post(f"{API}/jobs/src/batches/{bad}/barrier")
            assert_error(r, 422, "invalid_request", field="batch_id")


# -- derived jobs: aligned targets and input ranges ---------------------------------------


def _src_and_der(client, clock):
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    run_batch(client, "src", 0, {"ods.orders": 101})
    clock.advance(SLOT)
    run_batch(client, "src", 1, {"ods.orders": 102})
    clock.advance(SLOT)


def test_derived_batch_gets_its_target_and_the_input_snapshot_ranges(client, clock):
    _src_and_der(client, clock)
    assert barrier(client, "der", 0) == {
        "job": "der",
        "batch_id": 0,
        "barrier": T0 + SLOT,
        "start_barrier": 0,
        "committed": False,
        "inputs": [
            {
                "table": "ods.orders",
                "from_barrier": 0,
                "to_barrier": T0 + SLOT,
                "from_snapshot": None,
                "to_snapshot": 102,
            }
        ],
    }


def test_derived_next_barrier_is_fixed_until_the_job_commits_it(client, clock):
    _src_and_der(client, clock)
    first = get_json(client, "/jobs/der/next-barrier")
    assert first == {"job": "der", "barrier": T0 + SLOT, "start_barrier": 0, "ready": True}
    assert get_json(client, "/jobs/der")["pending_target"] == T0 + SLOT
    for i in range(2, 5):  # the inputs move on, the target does not
        run_batch(client, "src", i, {"ods.orders": 110 + i})
        clock.advance(SLOT)
        assert get_json(client, "/jobs/der/next-barrier") == first
    b = barrier(client, "der", 0)["barrier"]
    assert b == T0 + SLOT
    assert get_json(client, "/jobs/der/next-barrier") == first
    commit(client, "der", 0, b, "dw.detail", 201)
    after = get_json(client, "/jobs/der/next-barrier")
    assert after["start_barrier"] == b
    assert after["ready"] is True
    assert b < after["barrier"] <= get_json(client, "/tables/ods.orders")["frontier"]


def test_derived_frontier_is_its_last_committed_barrier(client, clock):
    _src_and_der(client, clock)
    b = barrier(client, "der", 0)["barrier"]
    assert get_json(client, "/jobs/der")["frontier"] == 0
    result = commit(client, "der", 0, b, "dw.detail", 201)
    assert result["batch_committed"] is True
    job = get_json(client, "/jobs/der")
    assert (job["frontier"], job["last_barrier"], job["pending_target"]) == (b, b, None)
    table = get_json(client, "/tables/dw.detail")
    assert (table["frontier"], table["latest_snapshot"], table["latest_barrier"]) == (b, 201, b)
    clock.advance(10 * SLOT)
    assert get_json(client, "/tables/dw.detail")["frontier"] == b  # does not follow the clock


def test_derived_next_batch_reads_from_the_previous_barrier(client, clock):
    source_and_derived(client, clock)
    run_batch(client, "src", 2, {"ods.orders": 103})
    clock.advance(SLOT)
    view = barrier(client, "der", 1)
    assert (view["start_barrier"], view["barrier"]) == (T0 + SLOT, T0 + 2 * SLOT)
    assert view["inputs"] == [
        {
            "table": "ods.orders",
            "from_barrier": T0 + SLOT,
            "to_barrier": T0 + 2 * SLOT,
            "from_snapshot": 102,
            "to_snapshot": 103,
        }
    ]


def test_replayed_derived_batch_gets_the_same_barrier_and_ranges(client, clock, db_url):
    _src_and_der(client, clock)
    first = barrier(client, "der", 0)
    for i in range(2, 4):
        run_batch(client, "src", i, {"ods.orders": 110 + i})
        clock.advance(SLOT)
    batches_before = db_state(db_url)["batches"]
    assert barrier(client, "der", 0) == first
    assert db_state(db_url)["batches"] == batches_before
    commit(client, "der", 0, first["barrier"], "dw.detail", 201)
    assert barrier(client, "der", 0) == {**first, "committed": True}


def test_derived_batch_while_another_is_open_is_refused_and_changes_nothing(client, clock, db_url):
    _src_and_der(client, clock)
    barrier(client, "der", 0)
    clock.advance(3 * SLOT)
    with unchanged(db_url):
        r = client.post(f"{API}/jobs/der/batches/1/barrier")
        assert_error(r, 409, "batch_still_open", field="batch_id")


def test_derived_batch_without_new_input_is_409_no_barrier_ready(client, clock, db_url):
    source_and_derived(client, clock)  # der has committed everything src has sealed
    nxt = get_json(client, "/jobs/der/next-barrier")
    assert nxt == {"job": "der", "barrier": T0 + SLOT, "start_barrier": T0 + SLOT, "ready": False}
    with unchanged(db_url):
        assert_error(client.post(f"{API}/jobs/der/batches/1/barrier"), 409, "no_barrier_ready")


def test_derived_job_reading_an_unwritten_table_is_never_ready(client, db_url):
    put_job(client, "der", ["dw.detail"], inputs=["ods.nobody"])
    nxt = get_json(client, "/jobs/der/next-barrier")
    assert nxt == {"job": "der", "barrier": 0, "start_barrier": 0, "ready": False}
    with unchanged(db_url):
        assert_error(client.post(f"{API}/jobs/der/batches/0/barrier"), 409, "no_barrier_ready")


def test_next_barrier_of_a_source_job_is_422_not_derived_and_changes_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        assert_error(client.get(f"{API}/jobs/src/next-barrier"), 422, "not_derived", field="job")


def test_next_barrier_of_unknown_job_gives_404(client, db_url):
    with unchanged(db_url):
        assert_error(client.get(f"{API}/jobs/ghost/next-barrier"), 404, "not_found", field="job")


def test_catching_up_derived_job_ends_batches_on_the_most_aligned_barriers(client, clock):
    source_and_derived(client, clock)  # der at T0+1s, clock at T0+2s
    clock.advance(6 * SLOT)  # src idle: sealed up to T0+7s
    targets = []
    for batch_id in (1, 2, 3):
        b = barrier(client, "der", batch_id)["barrier"]
        commit(client, "der", batch_id, b, "dw.detail", 300 + batch_id)
        targets.append(b)
    # slot numbers T0/1000 + k: k=4 is divisible by 4, k=6 by 2, then the rest
    assert targets == [T0 + 4 * SLOT, T0 + 6 * SLOT, T0 + 7 * SLOT]
    assert get_json(client, "/jobs/der/next-barrier")["ready"] is False


def test_derived_of_derived_targets_only_barriers_its_input_committed(client, clock):
    source_and_derived(client, clock)  # der committed T0+1s only
    put_job(client, "agg", ["dws.revenue"], inputs=["dw.detail"])
    clock.advance(10 * SLOT)
    # der is idle (its input got nothing new), so the MetaService advanced it; agg's
    # target is a barrier der is exact at: its frontier, where its snapshot is still 201.
    target = get_json(client, "/jobs/agg/next-barrier")["barrier"]
    assert target == get_json(client, "/jobs/der")["frontier"] > T0 + SLOT
    view = barrier(client, "agg", 0)
    assert view["inputs"] == [
        {
            "table": "dw.detail",
            "from_barrier": 0,
            "to_barrier": target,
            "from_snapshot": None,
            "to_snapshot": 201,
        }
    ]


# -- POST /commits ------------------------------------------------------------------------


def test_commit_is_recorded_and_a_repeat_is_a_duplicate_that_changes_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    b = barrier(client, "src", 0)["barrier"]
    first = commit(client, "src", 0, b, "ods.orders", 7)
    assert first == {
        "job": "src",
        "batch_id": 0,
        "table": "ods.orders",
        "barrier": b,
        "snapshot_id": 7,
        "status": "recorded",
        "batch_committed": True,
    }
    with unchanged(db_url):
        assert commit(client, "src", 0, b, "ods.orders", 7) == {**first, "status": "duplicate"}


def test_commit_with_another_snapshot_is_409_conflicting_report_and_changes_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    b = run_batch(client, "src", 0, {"ods.orders": 7})
    with unchanged(db_url):
        r = client.post(f"{API}/commits", json=report("src", 0, b, "ods.orders", 8))
        assert_error(r, 409, "conflicting_report", field="snapshot_id")
        r = client.post(f"{API}/commits", json=report("src", 0, b, "ods.orders", None))
        assert_error(r, 409, "conflicting_report", field="snapshot_id")


def test_commit_with_another_barrier_is_409_barrier_mismatch_and_changes_nothing(
    client, clock, db_url
):
    put_job(client, "src", ["ods.orders"])
    b = run_batch(client, "src", 0, {"ods.orders": 7})
    barrier(client, "src", 1)
    clock.advance(2 * SLOT)
    with unchanged(db_url):
        r = client.post(f"{API}/commits", json=report("src", 0, b - SLOT, "ods.orders", 7))
        assert_error(r, 409, "barrier_mismatch", field="barrier")
        # a first report for an open batch is checked the same way
        r = client.post(f"{API}/commits", json=report("src", 1, b + SLOT, "ods.orders", 8))
        assert_error(r, 409, "barrier_mismatch", field="barrier")


def test_commit_reusing_another_batchs_snapshot_is_409_conflicting_report(client, clock, db_url):
    put_job(client, "src", ["ods.orders"])
    run_batch(client, "src", 0, {"ods.orders": 7})
    clock.advance(SLOT)
    b1 = barrier(client, "src", 1)["barrier"]
    with unchanged(db_url):
        r = client.post(f"{API}/commits", json=report("src", 1, b1, "ods.orders", 7))
        assert_error(r, 409, "conflicting_report", field="snapshot_id")


def test_commit_for_a_batch_never_given_a_barrier_is_409_unknown_batch(client, db_url):
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        r = client.post(f"{API}/commits", json=report("src", 0, T0, "ods.orders", 7))
        assert_error(r, 409, "unknown_batch", field="batch_id")


def test_commit_by_a_job_that_does_not_write_the_table_is_409_not_writer(client, clock, db_url):
    _src_and_der(client, clock)
    put_job(client, "other", ["ods.other"])
    b = barrier(client, "der", 0)["barrier"]
    ob = barrier(client, "other", 0)["barrier"]
    with unchanged(db_url):
        r = client.post(f"{API}/commits", json=report("der", 0, b, "ods.orders", 9))  # its input
        assert_error(r, 409, "not_writer", field="table")
        r = client.post(f"{API}/commits", json=report("other", 0, ob, "dw.detail", 9))
        assert_error(r, 409, "not_writer", field="table")


def test_commit_with_a_barrier_from_the_future_is_422(client, db_url):
    put_job(client, "src", ["ods.orders"])
    barrier(client, "src", 0)
    with unchanged(db_url):
        r = client.post(f"{API}/commits", json=report("src", 0, T0 + SLOT, "ods.orders", 7))
        assert_error(r, 422, "barrier_from_future", field="barrier")


def test_commit_for_unknown_job_or_table_gives_404_and_changes_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    b = barrier(client, "src", 0)["barrier"]
    with unchanged(db_url):
        r = client.post(f"{API}/commits", json=report("ghost", 0, b, "ods.orders", 7))
        assert_error(r, 404, "not_found", field="job")
        r = client.post(f"{API}/commits", json=report("src", 0, b, "ods.ghost", 7))
        assert_error(r, 404, "not_found", field="table")


def test_commit_with_malformed_or_mistyped_body_gives_400_or_422(client, db_url):
    put_job(client, "src", ["ods.orders"])
    b = barrier(client, "src", 0)["barrier"]
    good = report("src", 0, b, "ods.orders", 7)
    cases = [
        ({**good, "batch_id": "zero"}, "batch_id"),
        ({**good, "batch_id": -1}, "batch_id"),
        ({**good, "barrier": -5}, "barrier"),
        ({**good, "barrier": 2**63}, "barrier"),
        ({**good, "snapshot_id": "seven"}, "snapshot_id"),
        ({**good, "snapshot_id": 2**64}, "snapshot_id"),
        ({**good, "table": ""}, "table"),
        ({k: v for k, v in good.items() if k != "job"}, "job"),
        ({**good, "rows": 10}, "rows"),
    ]
    with unchanged(db_url):
        for body, field in cases:
            r = client.post(f"{API}/commits", json=body)
            assert_error(r, 422, "invalid_request", field=field)
        r = client.post(
            f"{API}/commits",
            content=b"{'job': 'src'}",
            headers={"content-type": "application/json"},
        )
        assert_error(r, 400, "malformed_json")


def test_multi_output_batch_commits_only_when_every_output_is_reported(client, clock):
    put_job(client, "src", ["ods.a", "ods.b"])
    b = barrier(client, "src", 0)["barrier"]
    assert commit(client, "src", 0, b, "ods.a", 1)["batch_committed"] is False
    clock.advance(5 * SLOT)
    assert get_json(client, "/jobs/src")["frontier"] == b - SLOT  # still open
    assert barrier(client, "src", 0)["committed"] is False
    assert commit(client, "src", 0, b, "ods.b", 2)["batch_committed"] is True
    assert get_json(client, "/jobs/src")["frontier"] == T0 + 4 * SLOT


def test_empty_derived_batch_reports_a_null_snapshot_and_still_advances(client, clock):
    _src_and_der(client, clock)
    b = barrier(client, "der", 0)["barrier"]
    result = commit(client, "der", 0, b, "dw.detail", None)
    assert (result["snapshot_id"], result["batch_committed"]) == (None, True)
    assert get_json(client, "/jobs/der")["frontier"] == b
    assert get_json(client, "/tables/dw.detail")["latest_snapshot"] is None
    assert commit(client, "der", 0, b, "dw.detail", None)["status"] == "duplicate"


# -- POST /commits/batch ------------------------------------------------------------------


def test_commit_batch_records_many_and_counts_duplicates(client, clock):
    put_job(client, "src", ["ods.a", "ods.b"])
    put_job(client, "src2", ["ods.c"])
    b0 = barrier(client, "src", 0)["barrier"]
    c0 = barrier(client, "src2", 0)["barrier"]
    commit(client, "src", 0, b0, "ods.a", 1)
    body = {
        "commits": [
            report("src", 0, b0, "ods.a", 1),
            report("src", 0, b0, "ods.b", 2),
            report("src2", 0, c0, "ods.c", 3),
        ]
    }
    r = client.post(f"{API}/commits/batch", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["recorded"], out["duplicates"]) == (2, 1)
    assert [x["status"] for x in out["results"]] == ["duplicate", "recorded", "recorded"]
    assert [x["batch_committed"] for x in out["results"]] == [False, True, True]
    again = client.post(f"{API}/commits/batch", json=body).json()
    assert (again["recorded"], again["duplicates"]) == (0, 3)


def test_commit_batch_with_one_bad_report_records_nothing(client, clock, db_url):
    put_job(client, "src", ["ods.a"])
    put_job(client, "src2", ["ods.c"])
    b0 = run_batch(client, "src", 0, {"ods.a": 1})
    clock.advance(SLOT)
    b1 = barrier(client, "src", 1)["barrier"]
    c0 = barrier(client, "src2", 0)["barrier"]
    good = [report("src", 1, b1, "ods.a", 2), report("src2", 0, c0, "ods.c", 3)]
    bad_cases = [
        (report("src", 0, b0, "ods.a", 99), 409, "conflicting_report", "commits.2.snapshot_id"),
        (report("src", 1, b0, "ods.a", 2), 409, "barrier_mismatch", "commits.2.barrier"),
        (report("src", 5, b1, "ods.a", 5), 409, "unknown_batch", "commits.2.batch_id"),
        (report("src2", 0, c0, "ods.a", 5), 409, "not_writer", "commits.2.table"),
        (
            report("src", 1, b1 + 9 * SLOT, "ods.a", 5),
            422,
            "barrier_from_future",
            "commits.2.barrier",
        ),
        (report("src", 1, b1, "ods.zzz", 5), 404, "not_found", "commits.2.table"),
        (report("ghost", 1, b1, "ods.a", 5), 404, "not_found", "commits.2.job"),
    ]
    with unchanged(db_url):
        for bad, status, code, field in bad_cases:
            r = client.post(f"{API}/commits/batch", json={"commits": [*good, bad]})
            assert_error(r, status, code, field=field)
        r = client.post(f"{API}/commits/batch", json={"commits": [good[0], {**good[1], "x": 1}]})
        assert_error(r, 422, "invalid_request", field="commits.1.x")
    assert get_json(client, "/tables/ods.c/snapshots")["total"] == 0


def test_commit_batch_with_a_bad_report_mid_batch_records_nothing(client, clock, db_url):
    put_job(client, "src", ["ods.a"])
    put_job(client, "src2", ["ods.c"])
    b0 = barrier(client, "src", 0)["barrier"]
    c0 = barrier(client, "src2", 0)["barrier"]
    good = [report("src", 0, b0, "ods.a", 1), report("src2", 0, c0, "ods.c", 2)]
    for bad, code, field in (
        (report("src", 5, b0, "ods.a", 5), "unknown_batch", "commits.1.batch_id"),
        (report("src", 0, b0, "ods.a", 7), "conflicting_report", "commits.1.snapshot_id"),
        (report("src", 0, b0 - SLOT, "ods.a", 8), "barrier_mismatch", "commits.1.barrier"),
    ):
        # Refused mid-request, some conflicting with the good report before it.
        with unchanged(db_url):
            r = client.post(f"{API}/commits/batch", json={"commits": [good[0], bad, good[1]]})
            assert_error(r, 409, code, field=field)
    out = client.post(f"{API}/commits/batch", json={"commits": good}).json()
    assert (out["recorded"], out["duplicates"]) == (2, 0)


def test_commit_batch_completing_several_batches_of_a_job_moves_it_as_one_by_one(client, clock):
    """A request completing batches 0 and 2 of a source job while 1 stays open, then one
    completing 1: the job's frontier, last barrier and last batch as reported singly."""
    put_job(client, "src", ["ods.a"])
    put_job(client, "der", inputs=["ods.a"], outputs=["dw.b"])
    barriers = []
    for batch_id in range(3):
        barriers.append(barrier(client, "src", batch_id)["barrier"])
        clock.advance(SLOT)
    first = [report("src", 0, barriers[0], "ods.a", 10), report("src", 2, barriers[2], "ods.a", 12)]
    out = client.post(f"{API}/commits/batch", json={"commits": first}).json()
    assert [x["batch_committed"] for x in out["results"]] == [True, True]
    job = get_json(client, "/jobs/src")
    assert job["frontier"] == barriers[1] - SLOT  # batch 1 still holds it
    assert (job["last_barrier"], job["last_batch_id"]) == (barriers[2], 2)
    out = client.post(
        f"{API}/commits/batch", json={"commits": [report("src", 1, barriers[1], "ods.a", 11)]}
    ).json()
    assert out["recorded"] == 1
    job = get_json(client, "/jobs/src")
    assert job["frontier"] == T0 + 2 * SLOT  # the last closed slot: nothing open
    assert (job["last_barrier"], job["last_batch_id"]) == (barriers[2], 2)
    # An empty derived batch (no snapshot) and a source batch in one request.
    nxt = get_json(client, "/jobs/der/next-barrier")
    assert nxt["ready"], nxt
    view = client.post(
        f"{API}/jobs/der/batches/0/barrier",
        json={"start": nxt["start_barrier"], "end": nxt["barrier"]},
    ).json()
    b3 = barrier(client, "src", 3)["barrier"]
    both = [report("der", 0, view["barrier"], "dw.b", None), report("src", 3, b3, "ods.a", 13)]
    out = client.post(f"{API}/commits/batch", json={"commits": both}).json()
    assert [(x["snapshot_id"], x["batch_committed"]) for x in out["results"]] == [
        (None, True),
        (13, True),
    ]
    assert get_json(client, "/jobs/der")["frontier"] == view["barrier"]
    assert get_json(client, "/tables/dw.b")["latest_snapshot"] is None
    again = client.post(f"{API}/commits/batch", json={"commits": both}).json()
    assert again["duplicates"] == 2


def test_commit_batch_empty_list_gives_422(client, db_url):
    with unchanged(db_url):
        assert_error(
            client.post(f"{API}/commits/batch", json={"commits": []}),
            422,
            "invalid_request",
            field="commits",
        )
        assert_error(
            client.post(f"{API}/commits/batch", json={}), 422, "invalid_request", field="commits"
        )


def test_commit_batch_over_the_report_or_body_limit_gives_413(db_url, clock):
    with custom_client(db_url, clock, max_commits_per_request=2, max_body_bytes=2000) as c:
        put_job(c, "src", ["ods.a"])
        b = barrier(c, "src", 0)["barrier"]
        with unchanged(db_url):
            three = {"commits": [report("src", 0, b, "ods.a", i) for i in range(3)]}
            assert_error(
                c.post(f"{API}/commits/batch", json=three), 413, "too_large", field="commits"
            )
            many = {"commits": [report("src", 0, b, "ods.a", i) for i in range(30)]}
            assert_error(c.post(f"{API}/commits/batch", json=many), 413, "too_large", field="body")
