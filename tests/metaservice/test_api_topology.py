"""API tests for jobs, tables and the topology: PUT/GET /jobs, events, GET /tables, snapshots."""

from __future__ import annotations

from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    custom_client,
    db_state,
    get_json,
    put_job,
    run_batch,
    unchanged,
)

# -- PUT /jobs/{job} ----------------------------------------------------------------------


def test_put_job_creates_a_source_job_with_201(client):
    r = client.put(f"{API}/jobs/src", json={"outputs": ["ods.orders"], "description": "CDC"})
    assert r.status_code == 201
    assert r.json() == {
        "name": "src",
        "description": "CDC",
        "kind": "source",
        "inputs": [],
        "outputs": ["ods.orders"],
        "status": "registered",
        "frontier": T0 - SLOT,  # idle source: the last closed slot
        "last_barrier": None,
        "last_batch_id": None,
        "pending_target": None,
        "last_seen_ms": None,
        "offline_floor": None,
    }


def test_put_job_again_with_same_spec_answers_200_and_keeps_one_job(client):
    first = put_job(client, "src", ["ods.orders"])
    r = client.put(f"{API}/jobs/src", json={"outputs": ["ods.orders"]})
    assert r.status_code == 200
    assert r.json() == first
    assert get_json(client, "/jobs")["total"] == 1


def test_put_job_with_inputs_makes_a_derived_job_and_registers_its_tables(client):
    put_job(client, "src", ["ods.orders"])
    view = put_job(client, "der", ["dw.detail", "dw.audit"], inputs=["ods.orders", "ods.items"])
    assert view["kind"] == "derived"
    assert view["inputs"] == ["ods.items", "ods.orders"]
    assert view["outputs"] == ["dw.audit", "dw.detail"]
    tables = {t["name"]: t for t in get_json(client, "/tables")["items"]}
    assert set(tables) == {"dw.audit", "dw.detail", "ods.items", "ods.orders"}
    assert tables["ods.orders"]["writer"] == "src"
    assert tables["ods.orders"]["readers"] == ["der"]
    assert tables["ods.items"]["writer"] is None
    assert tables["ods.items"]["frontier"] is None
    assert tables["dw.detail"]["writer"] == "der"


def test_put_job_update_changes_kind_and_edges(client):
    put_job(client, "src", ["ods.orders"])
    put_job(client, "job", ["dw.detail"])
    assert get_json(client, "/jobs/job")["kind"] == "source"
    view = put_job(client, "job", ["dw.detail"], inputs=["ods.orders"])
    assert view["kind"] == "derived" and view["inputs"] == ["ods.orders"]
    assert get_json(client, "/tables/ods.orders")["readers"] == ["job"]
    view = put_job(client, "job", ["dw.detail"])
    assert view["kind"] == "source" and view["inputs"] == []
    assert get_json(client, "/tables/ods.orders")["readers"] == []


def test_put_job_dropping_an_output_frees_the_table_for_another_writer(client):
    put_job(client, "a", ["ods.x", "ods.y"])
    put_job(client, "a", ["ods.x"])
    assert get_json(client, "/tables/ods.y")["writer"] is None
    assert put_job(client, "b", ["ods.y"])["outputs"] == ["ods.y"]
    assert get_json(client, "/tables/ods.y")["writer"] == "b"


def test_put_job_self_loop_is_refused_as_cycle_and_changes_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/loop", json={"inputs": ["dw.t"], "outputs": ["dw.t"]})
        assert_error(r, 409, "cycle", field="inputs")
    assert client.get(f"{API}/jobs/loop").status_code == 404


def test_put_job_closing_a_longer_cycle_is_refused_and_changes_nothing(client, db_url):
    put_job(client, "a", ["s.b"], inputs=["s.a"])
    put_job(client, "b", ["s.c"], inputs=["s.b"])
    put_job(client, "c", ["s.d"], inputs=["s.c"])
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/d", json={"inputs": ["s.d"], "outputs": ["s.a"]})
        assert_error(r, 409, "cycle", field="inputs")
        # updating an existing job into a cycle is refused too
        r = client.put(f"{API}/jobs/a", json={"inputs": ["s.d"], "outputs": ["s.b"]})
        assert_error(r, 409, "cycle", field="inputs")
    # the same job may still be registered without the edge that closes the cycle
    put_job(client, "d", ["s.e"], inputs=["s.d"])


def test_put_job_second_writer_is_refused_and_changes_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/other", json={"outputs": ["ods.new", "ods.orders"]})
        assert_error(r, 409, "second_writer", field="outputs")
    assert client.get(f"{API}/tables/ods.new").status_code == 404


def test_put_job_invalid_table_identifiers_give_422_and_change_nothing(client, db_url):
    cases = [
        ({"outputs": ["orders"]}, "outputs.0"),
        ({"outputs": ["ods.orders", "ods.bad-name"]}, "outputs.1"),
        ({"inputs": ["ods.ok", "1ods.x"], "outputs": ["dw.t"]}, "inputs.1"),
        ({"outputs": ["ods..x"]}, "outputs.0"),
        ({"outputs": ["ods." + "x" * 400]}, "outputs.0"),
    ]
    with unchanged(db_url):
        for body, field in cases:
            assert_error(client.put(f"{API}/jobs/j", json=body), 422, "invalid", field=field)


def test_put_job_listing_a_table_twice_gives_422(client, db_url):
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/j", json={"outputs": ["ods.a", "ods.a"]})
        assert_error(r, 422, "invalid", field="outputs")


def test_put_job_invalid_job_name_gives_422(client, db_url):
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/-bad name", json={"outputs": ["ods.a"]})
        assert_error(r, 422, "invalid_request", field="job")
        r = client.put(f"{API}/jobs/{'j' * 201}", json={"outputs": ["ods.a"]})
        assert_error(r, 422, "invalid_request", field="job")


def test_put_job_malformed_json_gives_400(client, db_url):
    with unchanged(db_url):
        r = client.put(
            f"{API}/jobs/j",
            content=b'{"outputs": ["ods.a"]',
            headers={"content-type": "application/json"},
        )
        assert_error(r, 400, "malformed_json")


def test_put_job_wrong_types_and_unknown_fields_give_422_invalid_request(client, db_url):
    cases = [
        ({"outputs": "ods.a"}, "outputs"),
        ({"outputs": [1]}, "outputs.0"),
        ({"outputs": ["ods.a"], "description": 5}, "description"),
        ({"outputs": []}, "outputs"),
        ({"inputs": ["ods.a"]}, "outputs"),
        ({"outputs": ["ods.a"], "writer": "me"}, "writer"),
        ([], None),
    ]
    with unchanged(db_url):
        for body, field in cases:
            r = client.put(f"{API}/jobs/j", json=body)
            assert_error(r, 422, "invalid_request", field=field)


def test_put_job_body_over_the_size_limit_gives_413(db_url, clock):
    with custom_client(db_url, clock, max_body_bytes=1000) as c:
        with unchanged(db_url):
            body = {"outputs": ["ods.a"], "description": "x" * 2000}
            assert_error(c.put(f"{API}/jobs/j", json=body), 413, "too_large", field="body")
        # just under the limit is fine
        assert (
            c.put(
                f"{API}/jobs/j", json={"outputs": ["ods.a"], "description": "x" * 900}
            ).status_code
            == 201
        )


def test_put_job_streamed_body_over_the_size_limit_gives_413(db_url, clock):
    """A body sent without Content-Length (chunked) is counted as it arrives."""

    def chunks():
        yield b'{"outputs": ["ods.a"], "description": "'
        for _ in range(10):
            yield b"x" * 300
        yield b'"}'

    with custom_client(db_url, clock, max_body_bytes=1000) as c, unchanged(db_url):
        r = c.put(f"{API}/jobs/j", content=chunks(), headers={"content-type": "application/json"})
        assert_error(r, 413, "too_large", field="body")


def test_put_job_description_with_nul_character_is_refused(client, db_url):
    """PostgreSQL text cannot hold NUL, so neither database accepts it."""
    with unchanged(db_url):
        r = client.put(f"{API}/jobs/j", json={"outputs": ["ods.a"], "description": "a\x00b"})
        assert_error(r, 422, "invalid_character", field="description")


# -- GET /jobs, GET /jobs/{job} -----------------------------------------------------------


def test_list_jobs_pages_by_name_with_total(client):
    for name in ["e", "c", "a", "d", "b"]:
        put_job(client, name, [f"ods.{name}"])
    page = get_json(client, "/jobs", limit=2, offset=1)
    assert [j["name"] for j in page["items"]] == ["b", "c"]
    assert (page["total"], page["limit"], page["offset"]) == (5, 2, 1)
    assert [j["name"] for j in get_json(client, "/jobs")["items"]] == ["a", "b", "c", "d", "e"]
    last = get_json(client, "/jobs", limit=2, offset=4)
    assert [j["name"] for j in last["items"]] == ["e"]
    assert get_json(client, "/jobs", offset=10)["items"] == []


def test_list_jobs_page_limit_over_max_gives_413(client):
    assert_error(client.get(f"{API}/jobs", params={"limit": 1001}), 413, "too_large", field="limit")
    assert client.get(f"{API}/jobs", params={"limit": 1000}).status_code == 200


def test_list_jobs_bad_paging_gives_422(client):
    for params in [{"limit": 0}, {"limit": "ten"}, {"offset": -1}]:
        assert_error(client.get(f"{API}/jobs", params=params), 422, "invalid_request")


def test_list_jobs_offset_beyond_64_bits_is_not_a_server_error(client):
    r = client.get(f"{API}/jobs", params={"offset": 2**70})
    assert_error(r, 422, "invalid_request", field="offset")


def test_get_job_shows_progress_after_a_commit(client, clock):
    put_job(client, "src", ["ods.orders"])
    b = run_batch(client, "src", 3, {"ods.orders": 7})
    view = get_json(client, "/jobs/src")
    assert view["last_barrier"] == b == T0
    assert view["last_batch_id"] == 3
    assert view["last_seen_ms"] == T0
    assert view["frontier"] == T0 - SLOT
    clock.advance(2 * SLOT)
    assert get_json(client, "/jobs/src")["frontier"] == T0 + SLOT


def test_get_unknown_job_gives_404(client):
    assert_error(client.get(f"{API}/jobs/nope"), 404, "not_found", field="job")


# -- POST /jobs/{job}/events --------------------------------------------------------------


def test_job_events_set_status_and_last_seen(client, clock):
    put_job(client, "src", ["ods.orders"])
    clock.advance(1234)
    r = client.post(f"{API}/jobs/src/events", json={"event": "started", "run_id": "r1"})
    assert r.status_code == 200
    assert r.json()["status"] == "running"
    assert r.json()["last_seen_ms"] == T0 + 1234
    body = {"event": "progress", "batch_id": 4, "num_input_rows": 10, "duration_ms": 5}
    assert client.post(f"{API}/jobs/src/events", json=body).json()["status"] == "running"
    assert (
        client.post(f"{API}/jobs/src/events", json={"event": "failed", "message": "boom"}).json()[
            "status"
        ]
        == "failed"
    )
    assert (
        client.post(f"{API}/jobs/src/events", json={"event": "terminated"}).json()["status"]
        == "terminated"
    )


def test_job_event_for_unknown_job_gives_404(client, db_url):
    with unchanged(db_url):
        assert_error(
            client.post(f"{API}/jobs/nope/events", json={"event": "started"}), 404, "not_found"
        )


def test_job_event_bad_body_gives_422_and_changes_nothing(client, db_url):
    put_job(client, "src", ["ods.orders"])
    cases = [
        ({"event": "exploded"}, "event"),
        ({"event": "progress", "batch_id": -1}, "batch_id"),
        ({"event": "started", "extra": 1}, "extra"),
        ({}, "event"),
    ]
    with unchanged(db_url):
        for body, field in cases:
            r = client.post(f"{API}/jobs/src/events", json=body)
            assert_error(r, 422, "invalid_request", field=field)


MINIMAL = {"Prefer": "return=minimal"}


def test_job_event_with_prefer_return_minimal_answers_204_and_records_it(client, clock):
    put_job(client, "src", ["ods.orders"])
    clock.advance(1234)
    body = {"event": "progress", "run_id": "r1", "batch_id": 4, "num_input_rows": 10}
    r = client.post(f"{API}/jobs/src/events", json=body, headers=MINIMAL)
    assert r.status_code == 204
    assert r.content == b""
    assert r.headers["preference-applied"] == "return=minimal"
    view = get_json(client, "/jobs/src")
    assert (view["status"], view["last_seen_ms"]) == ("running", T0 + 1234)
    r = client.post(f"{API}/jobs/src/events", json={"event": "failed"}, headers=MINIMAL)
    assert r.status_code == 204
    assert get_json(client, "/jobs/src")["status"] == "failed"


def test_job_event_answers_the_view_unless_the_preference_is_return_minimal(client):
    put_job(client, "src", ["ods.orders"])
    full = {"event": "started", "run_id": "r1"}
    for prefer, status in [
        ("return=representation", 200),
        ("respond-async", 200),
        ("return=minimal-ish", 200),
        ("respond-async, RETURN = Minimal", 204),
        ('return="minimal"; x=1', 204),
    ]:
        r = client.post(f"{API}/jobs/src/events", json=full, headers={"Prefer": prefer})
        assert r.status_code == status, prefer
        if status == 200:
            assert r.json() == get_json(client, "/jobs/src")
            assert "preference-applied" not in r.headers


def test_job_event_with_return_minimal_still_refuses_unknown_jobs_and_bad_bodies(client, db_url):
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        r = client.post(f"{API}/jobs/nope/events", json={"event": "started"}, headers=MINIMAL)
        assert_error(r, 404, "not_found")
        r = client.post(f"{API}/jobs/src/events", json={"event": "exploded"}, headers=MINIMAL)
        assert_error(r, 422, "invalid_request", field="event")


def test_job_event_with_return_minimal_still_queues_its_openlineage_event(db_url, clock):
    # Nobody listens on the port: the event stays queued, which is what this checks.
    with custom_client(db_url, clock, openlineage_url="http://127.0.0.1:9") as c:
        put_job(c, "src", ["ods.orders"])
        run = "5b0f3c4e-7d55-4a4b-9b7e-0a6c1d1f2e3a"
        body = {"event": "started", "run_id": run}
        r = c.post(f"{API}/jobs/src/events", json=body, headers=MINIMAL)
        assert r.status_code == 204
        queued = db_state(db_url)["openlineage_outbox"]
    assert [(row[1], row[2]) for row in queued] == [("src", "START")]


def test_openapi_documents_the_return_minimal_preference_of_job_events(client):
    operation = client.get("/openapi.json").json()["paths"]["/api/v1/jobs/{job}/events"]["post"]
    (prefer,) = [p for p in operation["parameters"] if p["in"] == "header"]
    assert prefer["name"] == "prefer" and "return=minimal" in prefer["description"]
    assert {"200", "204"} <= set(operation["responses"])
    assert "Preference-Applied" in operation["responses"]["204"]["headers"]


# -- GET /tables, GET /tables/{table} -----------------------------------------------------


def test_list_tables_pages_by_name_with_total(client):
    put_job(client, "src", ["ods.c", "ods.a", "ods.b"])
    put_job(client, "der", ["dw.d"], inputs=["ods.a"])
    page = get_json(client, "/tables", limit=2, offset=1)
    assert [t["name"] for t in page["items"]] == ["ods.a", "ods.b"]
    assert (page["total"], page["limit"], page["offset"]) == (4, 2, 1)
    assert_error(
        client.get(f"{API}/tables", params={"limit": 5000}), 413, "too_large", field="limit"
    )


def test_get_table_shows_writer_frontier_latest_snapshot_and_delay(client, clock):
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    empty = get_json(client, "/tables/ods.orders")
    assert empty["latest_snapshot"] is None and empty["latest_barrier"] is None
    run_batch(client, "src", 0, {"ods.orders": 11})
    clock.advance(2500)
    view = get_json(client, "/tables/ods.orders")
    assert view == {
        "name": "ods.orders",
        "writer": "src",
        "readers": ["der"],
        "frontier": T0 + SLOT,
        "latest_snapshot": 11,
        "latest_barrier": T0,
        "delay_ms": 1500,
        "log": None,
    }


def test_get_unknown_table_gives_404(client):
    assert_error(client.get(f"{API}/tables/ods.nope"), 404, "not_found", field="table")


# -- GET /tables/{table}/snapshots --------------------------------------------------------


def _five_snapshots(client, clock):
    put_job(client, "src", ["ods.orders"])
    barriers = []
    for i in range(5):
        barriers.append(run_batch(client, "src", i, {"ods.orders": 100 + i}))
        clock.advance(SLOT)
    return barriers


def test_table_snapshots_list_the_barrier_mapping_oldest_first(client, clock):
    barriers = _five_snapshots(client, clock)
    page = get_json(client, "/tables/ods.orders/snapshots")
    assert page["total"] == 5
    assert [(s["snapshot_id"], s["barrier"], s["batch_id"], s["job"]) for s in page["items"]] == [
        (100 + i, T0 + i * SLOT, i, "src") for i in range(5)
    ]
    assert barriers == [T0 + i * SLOT for i in range(5)]
    assert page["items"][2]["reported_ms"] == T0 + 2 * SLOT


def test_table_snapshots_filter_by_barrier_range(client, clock):
    _five_snapshots(client, clock)
    page = get_json(
        client, "/tables/ods.orders/snapshots", from_barrier=T0 + SLOT, to_barrier=T0 + 3 * SLOT
    )
    assert [s["snapshot_id"] for s in page["items"]] == [101, 102, 103]
    assert page["total"] == 3
    page = get_json(client, "/tables/ods.orders/snapshots", from_barrier=T0 + 3 * SLOT + 1)
    assert [s["snapshot_id"] for s in page["items"]] == [104]
    page = get_json(client, "/tables/ods.orders/snapshots", to_barrier=T0)
    assert [s["snapshot_id"] for s in page["items"]] == [100]


def test_table_snapshots_page_with_limit_and_offset(client, clock):
    _five_snapshots(client, clock)
    page = get_json(client, "/tables/ods.orders/snapshots", limit=2, offset=2)
    assert [s["snapshot_id"] for s in page["items"]] == [102, 103]
    assert (page["total"], page["limit"], page["offset"]) == (5, 2, 2)
    page = get_json(
        client, "/tables/ods.orders/snapshots", from_barrier=T0 + SLOT, limit=1, offset=1
    )
    assert [s["snapshot_id"] for s in page["items"]] == [102]
    assert page["total"] == 4


def test_table_snapshots_bad_range_and_paging_give_4xx(client, clock):
    _five_snapshots(client, clock)
    path = f"{API}/tables/ods.orders/snapshots"
    r = client.get(path, params={"from_barrier": T0 + 2 * SLOT, "to_barrier": T0})
    assert_error(r, 422, "invalid", field="from_barrier")
    assert_error(
        client.get(path, params={"from_barrier": -1}), 422, "invalid_request", field="from_barrier"
    )
    assert_error(client.get(path, params={"limit": 1001}), 413, "too_large", field="limit")
    assert_error(client.get(f"{API}/tables/ods.nope/snapshots"), 404, "not_found")


def test_table_snapshots_barrier_beyond_64_bits_is_not_a_server_error(client, clock):
    _five_snapshots(client, clock)
    path = f"{API}/tables/ods.orders/snapshots"
    assert_error(
        client.get(path, params={"from_barrier": 2**70}),
        422,
        "invalid_request",
        field="from_barrier",
    )
    assert_error(
        client.get(path, params={"to_barrier": 2**70}), 422, "invalid_request", field="to_barrier"
    )


def test_table_snapshots_show_empty_batches_with_null_snapshot(client, clock):
    put_job(client, "src", ["ods.orders"])
    run_batch(client, "src", 0, {"ods.orders": 5})
    clock.advance(SLOT)
    run_batch(client, "src", 1, {"ods.orders": None})
    items = get_json(client, "/tables/ods.orders/snapshots")["items"]
    assert [(s["snapshot_id"], s["batch_id"]) for s in items] == [(5, 0), (None, 1)]
    # an empty batch is not the table's latest snapshot
    assert get_json(client, "/tables/ods.orders")["latest_snapshot"] == 5


# -- names that can never exist -----------------------------------------------------------


NUL_NAME_REQUESTS = [
    ("GET", "/jobs/a%00b", None),
    ("POST", "/jobs/a%00b/events", {"event": "started"}),
    ("POST", "/jobs/a%00b/batches/0/barrier", None),
    ("GET", "/jobs/a%00b/next-barrier", None),
    ("GET", "/tables/a%00b", None),
    ("GET", "/tables/a%00b/snapshots", None),
    ("GET", "/lineage/snapshots/a%00b/1", None),
    ("DELETE", "/leases/a%00b", None),
    ("POST", "/commits", {"job": "a\x00b", "batch_id": 0, "barrier": 0, "table": "ods.a"}),
    ("POST", "/commits", {"job": "src", "batch_id": 0, "barrier": 0, "table": "ods.a\x00"}),
]


def test_names_with_nul_character_give_4xx_not_500(client, db_url):
    """Job, table and lease names that cannot exist are answered 404/422 and change nothing."""
    put_job(client, "src", ["ods.a"])
    before = db_state(db_url)
    failures = []
    for method, path, body in NUL_NAME_REQUESTS:
        r = client.request(method, f"{API}{path}", **({"json": body} if body else {}))
        if not (400 <= r.status_code < 500 and {"code", "message"} <= set(r.json())):
            failures.append((method, path, r.status_code))
    assert not failures
    assert db_state(db_url) == before
    assert db_state(db_url) == before


def test_the_topological_order_is_kept_until_the_topology_changes(client):
    """Jobs advanced together are locked downstream first, by a topological order that
    is computed once per topology version (not per request) and never stale."""
    put_job(client, "src", ["ods.orders"])
    put_job(client, "enrich", ["dw.detail"], inputs=["ods.orders"])
    services = client.app.state.services
    first = services.db.read(services.ctx.graph.order)
    assert first["job:src"] < first["table:ods.orders"] < first["job:enrich"]
    assert services.db.read(services.ctx.graph.order) is first, "sorted again, unchanged"

    put_job(client, "rollup", ["dws.totals"], inputs=["dw.detail"])
    after = services.db.read(services.ctx.graph.order)
    assert after is not first
    assert after["job:enrich"] < after["table:dw.detail"] < after["job:rollup"]
