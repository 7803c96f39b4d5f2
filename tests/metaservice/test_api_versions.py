"""API tests for consistent versions and leases: GET /versions/consistent, POST/DELETE /leases."""

from __future__ import annotations

from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    commit,
    consistent,
    custom_client,
    db_state,
    put_job,
    run_batch,
    source_and_derived,
    unchanged,
)


def _two_readers(client, clock):
    """src -> ods.orders; der1 -> dw.one and der2 -> dw.two both read ods.orders.
    der1 commits T0+1s and T0+2s, der2 only T0+1s. Clock ends at T0+3s."""
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der1", ["dw.one"], inputs=["ods.orders"])
    put_job(client, "der2", ["dw.two"], inputs=["ods.orders"])
    run_batch(client, "src", 0, {"ods.orders": 100})
    clock.advance(SLOT)
    run_batch(client, "src", 1, {"ods.orders": 101})
    clock.advance(SLOT)
    assert run_batch(client, "der1", 0, {"dw.one": 110}) == T0 + SLOT
    assert run_batch(client, "der2", 0, {"dw.two": 120}) == T0 + SLOT
    run_batch(client, "src", 2, {"ods.orders": 102})
    clock.advance(SLOT)
    assert run_batch(client, "der1", 1, {"dw.one": 111}) == T0 + 2 * SLOT


def test_no_consistent_version_before_the_derived_job_commits_gives_409(client, clock):
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    run_batch(client, "src", 0, {"ods.orders": 1})
    clock.advance(3 * SLOT)
    r = consistent(client, "ods.orders,dw.detail")
    assert_error(r, 409, "no_consistent_version", field="tables")
    b = barrier(client, "der", 0)["barrier"]
    assert_error(consistent(client, "dw.detail"), 409, "no_consistent_version")  # still open
    commit(client, "der", 0, b, "dw.detail", 2)
    assert consistent(client, "ods.orders,dw.detail").json() == {
        "barrier": b,
        "snapshots": {"dw.detail": 2, "ods.orders": 1},
    }


def test_source_table_version_waits_for_its_slot_to_close(client, clock):
    put_job(client, "src", ["ods.orders"])
    run_batch(client, "src", 0, {"ods.orders": 7})
    # the slot T0 is still open: the version is the slot before, when the table was empty
    assert consistent(client, "ods.orders").json() == {
        "barrier": T0 - SLOT,
        "snapshots": {"ods.orders": None},
    }
    clock.advance(SLOT)
    assert consistent(client, "ods.orders").json() == {
        "barrier": T0,
        "snapshots": {"ods.orders": 7},
    }


def test_consistent_version_of_source_and_derived_tables(client, clock):
    source_and_derived(client, clock)
    r = consistent(client, "dw.detail,ods.orders")
    assert r.status_code == 200, r.text
    assert r.json() == {"barrier": T0 + SLOT, "snapshots": {"dw.detail": 201, "ods.orders": 102}}
    assert "lease_id" not in r.json()


def test_consistent_version_is_the_largest_barrier_where_every_table_is_exact(client, clock):
    _two_readers(client, clock)
    assert consistent(client, "dw.one").json() == {
        "barrier": T0 + 2 * SLOT,
        "snapshots": {"dw.one": 111},
    }
    assert consistent(client, "dw.one,dw.two").json() == {
        "barrier": T0 + SLOT,
        "snapshots": {"dw.one": 110, "dw.two": 120},
    }
    assert consistent(client, "ods.orders,dw.one").json() == {
        "barrier": T0 + 2 * SLOT,
        "snapshots": {"dw.one": 111, "ods.orders": 102},
    }
    # the order and repetition of names in the query do not matter
    assert consistent(client, " dw.two , dw.one,dw.two").json()["barrier"] == T0 + SLOT


def test_consistent_version_skips_barriers_a_coalescing_reader_never_committed(client, clock):
    """der2 catches up in one batch: its table is exact only at that batch's end."""
    _two_readers(client, clock)
    for i in (3, 4):
        run_batch(client, "src", i, {"ods.orders": 100 + i})
        clock.advance(SLOT)
        assert run_batch(client, "der1", i - 1, {"dw.one": 109 + i}) == T0 + i * SLOT
    assert run_batch(client, "der2", 1, {"dw.two": 121}) == T0 + 4 * SLOT  # covers 2, 3, 4
    assert consistent(client, "dw.one,dw.two").json() == {
        "barrier": T0 + 4 * SLOT,
        "snapshots": {"dw.one": 113, "dw.two": 121},
    }
    r = consistent(client, "dw.one,dw.two", at_or_before=T0 + 3 * SLOT)
    assert r.json() == {"barrier": T0 + SLOT, "snapshots": {"dw.one": 110, "dw.two": 120}}


def test_consistent_version_at_or_before_a_barrier(client, clock):
    _two_readers(client, clock)
    r = consistent(client, "ods.orders,dw.one", at_or_before=T0 + SLOT)
    assert r.json() == {"barrier": T0 + SLOT, "snapshots": {"dw.one": 110, "ods.orders": 101}}
    r = consistent(client, "ods.orders", at_or_before=T0 + SLOT - 1)  # between two barriers
    assert r.json() == {"barrier": T0, "snapshots": {"ods.orders": 100}}
    assert_error(
        consistent(client, "ods.orders", at_or_before=SLOT - 1), 409, "no_consistent_version"
    )
    r = consistent(client, "dw.one", at_or_before=T0 + SLOT - 1)
    assert_error(r, 409, "no_consistent_version", field="tables")
    assert_error(consistent(client, "ods.orders", at_or_before=0), 409, "no_consistent_version")


def test_consistent_version_with_lease_seconds_takes_a_lease(client, clock, db_url):
    source_and_derived(client, clock)
    r = consistent(client, "ods.orders,dw.detail", lease_seconds=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["barrier"] == T0 + SLOT
    assert body["snapshots"] == {"dw.detail": 201, "ods.orders": 102}
    assert body["lease_expires_ms"] == clock.now_ms() + 60_000
    state = db_state(db_url)
    assert [(row[0], row[1], row[3]) for row in state["leases"]] == [
        (body["lease_id"], T0 + SLOT, clock.now_ms() + 60_000)
    ]
    assert sorted(row[2] for row in state["lease_snapshots"]) == [102, 201]


def test_post_lease_pins_a_version_and_delete_ends_it(client, clock, db_url):
    source_and_derived(client, clock)
    r = client.post(
        f"{API}/leases",
        json={
            "tables": ["dw.detail", "ods.orders"],
            "lease_seconds": 30,
            "at_or_before": T0 + SLOT,
        },
    )
    assert r.status_code == 201, r.text
    lease = r.json()
    assert lease["barrier"] == T0 + SLOT
    assert lease["lease_expires_ms"] == clock.now_ms() + 30_000
    r = client.delete(f"{API}/leases/{lease['lease_id']}")
    assert r.status_code == 204 and r.content == b""
    state = db_state(db_url)
    assert state["leases"] == [] and state["lease_snapshots"] == []
    with unchanged(db_url):
        r = client.delete(f"{API}/leases/{lease['lease_id']}")
        assert_error(r, 404, "not_found", field="lease_id")


def test_delete_unknown_lease_gives_404(client, db_url):
    with unchanged(db_url):
        assert_error(
            client.delete(f"{API}/leases/no-such-lease"), 404, "not_found", field="lease_id"
        )


def test_consistent_version_with_empty_table_list_gives_422(client, db_url):
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        for tables in ["", ",", " , "]:
            assert_error(consistent(client, tables), 422, "invalid", field="tables")
        assert_error(
            client.get(f"{API}/versions/consistent"), 422, "invalid_request", field="tables"
        )
        r = client.post(f"{API}/leases", json={"tables": [], "lease_seconds": 5})
        assert_error(r, 422, "invalid_request", field="tables")


def test_consistent_version_of_invalid_or_unknown_tables_gives_422_or_404(client, db_url):
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        assert_error(consistent(client, "ods.orders,orders"), 422, "invalid", field="tables")
        assert_error(consistent(client, "ods.orders,ods.nope"), 404, "not_found", field="tables")
        r = consistent(client, "ods.nope", lease_seconds=10)
        assert_error(r, 404, "not_found", field="tables")


def test_consistent_version_of_a_table_nobody_writes_gives_409_no_writer(client, db_url):
    put_job(client, "der", ["dw.detail"], inputs=["ods.orphan"])
    with unchanged(db_url):
        assert_error(consistent(client, "ods.orphan"), 409, "no_writer", field="tables")


def test_consistent_version_bad_numbers_give_422_and_take_no_lease(client, clock, db_url):
    source_and_derived(client, clock)
    clock.advance(5 * SLOT)  # a lease request would seal src: it must be rolled back too
    with unchanged(db_url):
        r = consistent(client, "ods.orders", lease_seconds=0)
        assert_error(r, 422, "invalid_request", field="lease_seconds")
        r = consistent(client, "ods.orders", lease_seconds=7 * 24 * 3600 + 1)
        assert_error(r, 422, "invalid", field="lease_seconds")
        r = consistent(client, "ods.orders", at_or_before=-1)
        assert_error(r, 422, "invalid_request", field="at_or_before")
        r = consistent(client, "ods.orders", lease_seconds="soon")
        assert_error(r, 422, "invalid_request", field="lease_seconds")


def test_lease_without_a_consistent_version_is_409_and_takes_no_lease(client, clock, db_url):
    # Nobody writes ods.orders yet, so der cannot run, nor be advanced as idle.
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    clock.advance(5 * SLOT)
    with unchanged(db_url):
        r = client.post(f"{API}/leases", json={"tables": ["dw.detail"], "lease_seconds": 5})
        assert_error(r, 409, "no_consistent_version", field="tables")
        r = consistent(client, "dw.detail", lease_seconds=5)
        assert_error(r, 409, "no_consistent_version", field="tables")


def test_post_lease_bad_body_gives_400_or_422_and_takes_no_lease(client, clock, db_url):
    source_and_derived(client, clock)
    cases = [
        ({"tables": ["ods.orders"]}, "lease_seconds"),
        ({"tables": ["ods.orders"], "lease_seconds": 0}, "lease_seconds"),
        ({"tables": "ods.orders", "lease_seconds": 5}, "tables"),
        ({"tables": ["ods.orders"], "lease_seconds": 5, "owner": "me"}, "owner"),
        ({"tables": ["ods.orders"], "lease_seconds": 5, "at_or_before": -1}, "at_or_before"),
    ]
    with unchanged(db_url):
        for body, field in cases:
            r = client.post(f"{API}/leases", json=body)
            assert_error(r, 422, "invalid_request", field=field)
        r = client.post(
            f"{API}/leases", content=b'{"tables": [', headers={"content-type": "application/json"}
        )
        assert_error(r, 400, "malformed_json")
        r = client.post(f"{API}/leases", json={"tables": ["ods.bad-name"], "lease_seconds": 5})
        assert_error(r, 422, "invalid", field="tables")


def test_consistent_version_of_too_many_tables_gives_413(db_url, clock):
    with custom_client(db_url, clock, max_tables_per_query=2) as c:
        put_job(c, "src", ["ods.a", "ods.b", "ods.c"])
        with unchanged(db_url):
            assert_error(consistent(c, "ods.a,ods.b,ods.c"), 413, "too_large", field="tables")
        assert consistent(c, "ods.a,ods.b").status_code == 200
