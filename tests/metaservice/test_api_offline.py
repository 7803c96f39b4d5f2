"""API tests for offline grants: a source job giving its batches barriers while the
MetaService is unreachable, and the frontier rules that keep that safe (G1, G4)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from metaservice.clock import ManualClock
from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    commit,
    consistent,
    get_json,
    put_job,
    run_batch,
    unchanged,
)


def grant(client: TestClient, job: str, floor: int) -> dict:  # type: ignore[type-arg]
    r = client.put(f"{API}/jobs/{job}/offline-grant", json={"floor": floor})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def claim(client: TestClient, job: str, batch_id: int, barrier_: int):  # type: ignore[no-untyped-def]
    return client.post(f"{API}/jobs/{job}/batches/{batch_id}/barrier", json={"barrier": barrier_})


def frontier(client: TestClient, table: str) -> int:
    return get_json(client, f"/tables/{table}")["frontier"]  # type: ignore[no-any-return]


def source_and_reader(client: TestClient) -> None:
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])


def test_first_grant_floors_at_the_current_slot_and_the_frontier_does_not_step_back(
    client, clock: ManualClock
):
    source_and_reader(client)
    clock.advance(5 * SLOT + 300)
    before = frontier(client, "ods.orders")
    g = grant(client, "src", floor=0)  # a first grant ignores the promise: the job learns the slot
    assert g == {
        "job": "src",
        "floor": T0 + 5 * SLOT,
        "barrier": T0 + 5 * SLOT,
        "now_ms": T0 + 5 * SLOT + 300,
        "interval_ms": SLOT,
    }
    assert frontier(client, "ods.orders") == before == T0 + 4 * SLOT
    assert get_json(client, "/jobs/src")["offline_floor"] == T0 + 5 * SLOT


def test_the_frontier_of_a_granted_job_stays_below_its_floor_until_it_reports_in(
    client, clock: ManualClock
):
    source_and_reader(client)
    grant(client, "src", floor=T0)
    clock.advance(10 * SLOT)
    # Silent (maybe offline, giving itself barriers): the frontier waits at the floor.
    assert frontier(client, "ods.orders") == T0 - SLOT
    assert get_json(client, "/jobs/der/next-barrier")["barrier"] == T0 - SLOT
    # Reporting in with a promise moves the floor to min(promise, now).
    assert grant(client, "src", floor=T0 + 7 * SLOT)["floor"] == T0 + 7 * SLOT
    assert frontier(client, "ods.orders") == T0 + 6 * SLOT
    assert grant(client, "src", floor=T0 + 99 * SLOT)["floor"] == T0 + 10 * SLOT
    assert frontier(client, "ods.orders") == T0 + 9 * SLOT
    # A smaller promise never lowers the floor (the frontier never steps back).
    assert grant(client, "src", floor=T0)["floor"] == T0 + 10 * SLOT


def test_release_lets_the_frontier_follow_the_clock_again(client, clock: ManualClock):
    source_and_reader(client)
    grant(client, "src", floor=T0)
    clock.advance(4 * SLOT)
    assert frontier(client, "ods.orders") == T0 - SLOT
    r = client.delete(f"{API}/jobs/src/offline-grant")
    assert r.status_code == 204, r.text
    assert frontier(client, "ods.orders") == T0 + 3 * SLOT
    assert client.delete(f"{API}/jobs/src/offline-grant").status_code == 204  # idempotent
    assert get_json(client, "/jobs/src")["offline_floor"] is None


def test_offline_batches_claimed_later_are_exact_and_readers_never_skipped_them(
    client, clock: ManualClock
):
    """The whole G4 story at the API: grant, silence while batches commit offline,
    then the outbox delivers claims and commits in order."""
    source_and_reader(client)
    b0 = run_batch(client, "src", 0, {"ods.orders": 100})
    grant(client, "src", floor=b0)
    clock.advance(SLOT)
    g = grant(client, "src", floor=T0 + SLOT)  # reports in: the frontier reaches b0
    assert run_batch(client, "der", 0, {"dw.detail": 200}) == T0  # der reads up to the floor
    # Offline: batches 1 and 2 take barriers from the job's clock at or above the floor.
    offline = [g["floor"] + 2 * SLOT, g["floor"] + 4 * SLOT]
    clock.advance(5 * SLOT)
    assert get_json(client, "/jobs/der/next-barrier")["ready"] is False
    # Back online: the outbox delivers claim, commit, claim, commit.
    for batch_id, b in enumerate(offline, start=1):
        assert claim(client, "src", batch_id, b).json()["barrier"] == b
        assert frontier(client, "ods.orders") == g["floor"] - SLOT  # until the job reports in
        commit(client, "src", batch_id, b, "ods.orders", 100 + batch_id)
    grant(client, "src", floor=T0 + 6 * SLOT)  # reports in once the claims are delivered
    assert frontier(client, "ods.orders") == T0 + 5 * SLOT
    d1 = run_batch(client, "der", 1, {"dw.detail": 201})
    # The catch-up batch ends on an aligned barrier: one or both offline batches.
    read_upto = 102 if d1 >= offline[1] else 101
    assert offline[0] <= d1 <= offline[1]
    ranges = barrier(client, "der", 1)["inputs"][0]
    assert (ranges["from_snapshot"], ranges["to_snapshot"]) == (100, read_upto)
    v = consistent(client, "ods.orders,dw.detail").json()
    assert v["barrier"] == d1 and v["snapshots"] == {"ods.orders": read_upto, "dw.detail": 201}


def test_a_claim_is_idempotent_and_a_conflicting_claim_changes_nothing(
    client, db_url, clock: ManualClock
):
    source_and_reader(client)
    g = grant(client, "src", floor=T0)
    assert claim(client, "src", 0, g["floor"]).status_code == 200
    commit(client, "src", 0, g["floor"], "ods.orders", 100)
    assert claim(client, "src", 0, g["floor"]).json()["committed"] is True  # replay
    with unchanged(db_url):
        assert_error(claim(client, "src", 0, g["floor"] + SLOT), 409, "barrier_mismatch", "barrier")


def test_a_claim_replaces_the_barrier_of_an_open_batch_whose_answer_was_lost(
    client, clock: ManualClock
):
    source_and_reader(client)
    grant(client, "src", floor=T0)
    clock.advance(3 * SLOT)
    assert barrier(client, "src", 0)["barrier"] == T0 + 3 * SLOT  # the answer never arrived
    r = claim(client, "src", 0, T0 + SLOT)  # the job went on offline with its own barrier
    assert r.status_code == 200 and r.json()["barrier"] == T0 + SLOT
    commit(client, "src", 0, T0 + SLOT, "ods.orders", 100)
    assert get_json(client, "/tables/ods.orders/snapshots")["items"][0]["barrier"] == T0 + SLOT


def test_claims_that_would_break_the_model_are_refused_and_change_nothing(
    client, db_url, clock: ManualClock
):
    source_and_reader(client)
    with unchanged(db_url):
        assert_error(claim(client, "src", 0, T0), 409, "no_offline_grant", "barrier")
    g = grant(client, "src", floor=T0)
    run_batch(client, "src", 0, {"ods.orders": 100})
    clock.advance(3 * SLOT)
    grant(client, "src", floor=T0 + 3 * SLOT)
    with unchanged(db_url):
        assert_error(claim(client, "src", 1, T0 + SLOT), 409, "claim_below_floor", "barrier")
        assert_error(claim(client, "src", 1, T0 + 3 * SLOT + 1), 422, "off_grid", "barrier")
        assert_error(
            claim(client, "src", 1, T0 + 1000 * SLOT), 422, "barrier_from_future", "barrier"
        )
        assert_error(claim(client, "der", 0, T0 + 3 * SLOT), 422, "not_source", "job")
        assert_error(
            client.put(f"{API}/jobs/der/offline-grant", json={"floor": T0}), 422, "not_source"
        )
        assert_error(
            client.put(f"{API}/jobs/nope/offline-grant", json={"floor": T0}), 404, "not_found"
        )
        assert_error(
            client.put(f"{API}/jobs/src/offline-grant", json={"floor": -1}), 422, "invalid_request"
        )
        assert_error(
            client.post(f"{API}/jobs/src/batches/1/barrier", json={"barrier": "soon"}),
            422,
            "invalid_request",
        )
    assert g["floor"] == T0


def test_a_claim_behind_an_earlier_batch_is_refused(client, db_url, clock: ManualClock):
    source_and_reader(client)
    grant(client, "src", floor=T0)
    assert claim(client, "src", 0, T0 + 4 * SLOT).status_code == 200
    with unchanged(db_url):
        assert_error(claim(client, "src", 1, T0 + 2 * SLOT), 409, "barrier_went_back", "barrier")


def claims(client: TestClient, job: str, pairs: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    body = {"claims": [{"batch_id": b, "barrier": barrier_} for b, barrier_ in pairs]}
    return client.post(f"{API}/jobs/{job}/claims", json=body)


def test_many_claims_in_one_request_are_recorded_in_order(client, clock: ManualClock):
    source_and_reader(client)
    grant(client, "src", floor=T0)
    clock.advance(5 * SLOT)
    pairs = [(0, T0), (1, T0 + SLOT), (2, T0 + SLOT), (3, T0 + 4 * SLOT)]
    r = claims(client, "src", pairs)
    assert r.status_code == 200, r.text
    assert [(x["batch_id"], x["barrier"]) for x in r.json()["results"]] == pairs
    for batch_id, b in pairs:
        commit(client, "src", batch_id, b, "ods.orders", 100 + batch_id)
    assert claims(client, "src", pairs).status_code == 200  # a redelivery: the same answers
    assert frontier(client, "ods.orders") == T0 - SLOT  # until the job reports in


def test_a_batch_claimed_twice_in_one_request_keeps_the_later_claim(
    client, db_url, clock: ManualClock
):
    """Claims opened by a request are written together at its end: a second claim of one
    of them in the same request replaces its barrier, checked against the batches the
    request opened before it."""
    source_and_reader(client)
    grant(client, "src", floor=T0)
    clock.advance(5 * SLOT)
    with unchanged(db_url):
        r = claims(client, "src", [(0, T0 + 2 * SLOT), (1, T0 + 3 * SLOT), (1, T0 + SLOT)])
        assert_error(r, 409, "barrier_went_back", "claims.2.barrier")
    r = claims(client, "src", [(0, T0), (1, T0 + 3 * SLOT), (1, T0 + SLOT), (2, T0 + 2 * SLOT)])
    assert r.status_code == 200, r.text
    assert [x["barrier"] for x in r.json()["results"]] == [T0, T0 + SLOT, T0 + SLOT, T0 + 2 * SLOT]
    for batch_id, b in ((0, T0), (1, T0 + SLOT), (2, T0 + 2 * SLOT)):
        assert commit(client, "src", batch_id, b, "ods.orders", 100 + batch_id)["batch_committed"]
    assert claim(client, "src", 1, T0 + SLOT).json()["committed"] is True


def test_a_claims_request_with_one_bad_claim_changes_nothing(client, db_url, clock: ManualClock):
    source_and_reader(client)
    grant(client, "src", floor=T0)
    clock.advance(5 * SLOT)
    with unchanged(db_url):
        r = claims(client, "src", [(0, T0), (1, T0 + 3 * SLOT), (2, T0 + SLOT)])
        assert_error(r, 409, "barrier_went_back", "claims.2.barrier")
        assert_error(claims(client, "src", [(0, T0), (1, T0 + 7)]), 422, "off_grid")
        assert_error(claims(client, "der", [(0, T0)]), 422, "not_source", "job")
        assert_error(claims(client, "nope", [(0, T0)]), 404, "not_found")
        assert_error(claims(client, "src", []), 422, "invalid_request")
        assert_error(
            client.post(f"{API}/jobs/src/claims", json={"claims": [{"batch_id": 0}]}),
            422,
            "invalid_request",
        )
