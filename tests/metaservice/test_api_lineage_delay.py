"""API tests for table lineage, snapshot lineage and delay: GET /lineage..., GET /delay."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from metaservice.app import create_app
from metaservice.db import normalise_url
from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    assert_error,
    barrier,
    commit,
    get_json,
    put_job,
    run_batch,
    source_and_derived,
    unchanged,
)


def _warehouse(client):
    """src -> ods.orders, src2 -> ods.items; der(ods.orders, ods.items) -> dw.detail;
    agg(dw.detail) -> dws.revenue; audit(ods.orders) -> dw.audit."""
    put_job(client, "src", ["ods.orders"])
    put_job(client, "src2", ["ods.items"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders", "ods.items"])
    put_job(client, "agg", ["dws.revenue"], inputs=["dw.detail"])
    put_job(client, "audit", ["dw.audit"], inputs=["ods.orders"])


def _lineage(client, **params):
    return get_json(client, "/lineage", **params)


def _edges(graph):
    return {(e["source"], e["target"]) for e in graph["edges"]}


def _ids(graph):
    return [n["id"] for n in graph["nodes"]]


# -- GET /lineage -------------------------------------------------------------------------


def test_lineage_upstream_lists_jobs_and_tables_with_typed_node_ids(client):
    _warehouse(client)
    graph = _lineage(client, table="dw.detail", direction="upstream")
    assert (graph["root"], graph["direction"], graph["depth"]) == (
        "table:dw.detail",
        "upstream",
        None,
    )
    assert graph["nodes"] == [
        {"id": "job:der", "kind": "job", "name": "der"},
        {"id": "job:src", "kind": "job", "name": "src"},
        {"id": "job:src2", "kind": "job", "name": "src2"},
        {"id": "table:dw.detail", "kind": "table", "name": "dw.detail"},
        {"id": "table:ods.items", "kind": "table", "name": "ods.items"},
        {"id": "table:ods.orders", "kind": "table", "name": "ods.orders"},
    ]
    # inputs run table -> job, outputs job -> table
    assert _edges(graph) == {
        ("job:der", "table:dw.detail"),
        ("table:ods.orders", "job:der"),
        ("table:ods.items", "job:der"),
        ("job:src", "table:ods.orders"),
        ("job:src2", "table:ods.items"),
    }


def test_lineage_downstream_follows_readers(client):
    _warehouse(client)
    graph = _lineage(client, table="ods.orders", direction="downstream")
    assert _ids(graph) == [
        "job:agg",
        "job:audit",
        "job:der",
        "table:dw.audit",
        "table:dw.detail",
        "table:dws.revenue",
        "table:ods.orders",
    ]
    assert _edges(graph) == {
        ("table:ods.orders", "job:der"),
        ("table:ods.orders", "job:audit"),
        ("job:der", "table:dw.detail"),
        ("job:audit", "table:dw.audit"),
        ("table:dw.detail", "job:agg"),
        ("job:agg", "table:dws.revenue"),
    }


def test_lineage_both_directions_is_the_union_by_default(client):
    _warehouse(client)
    up = _lineage(client, table="dw.detail", direction="upstream")
    down = _lineage(client, table="dw.detail", direction="downstream")
    both = _lineage(client, table="dw.detail")
    assert both["direction"] == "both"
    assert set(_ids(both)) == set(_ids(up)) | set(_ids(down))
    assert _edges(both) == _edges(up) | _edges(down)
    assert "job:audit" not in _ids(both)  # a sibling branch is neither up- nor downstream


def test_lineage_depth_counts_jobs_away_from_the_table(client):
    _warehouse(client)
    graph = _lineage(client, table="dws.revenue", direction="upstream", depth=0)
    assert (_ids(graph), graph["edges"], graph["depth"]) == (["table:dws.revenue"], [], 0)
    graph = _lineage(client, table="dws.revenue", direction="upstream", depth=1)
    assert _ids(graph) == ["job:agg", "table:dw.detail", "table:dws.revenue"]
    assert _edges(graph) == {("table:dw.detail", "job:agg"), ("job:agg", "table:dws.revenue")}
    graph = _lineage(client, table="dws.revenue", direction="upstream", depth=2)
    assert set(_ids(graph)) == {
        "table:dws.revenue",
        "job:agg",
        "table:dw.detail",
        "job:der",
        "table:ods.orders",
        "table:ods.items",
    }
    full = _lineage(client, table="dws.revenue", direction="upstream", depth=3)
    assert full["nodes"] == _lineage(client, table="dws.revenue", direction="upstream")["nodes"]
    graph = _lineage(client, table="ods.orders", direction="downstream", depth=1)
    assert set(_ids(graph)) == {
        "table:ods.orders",
        "job:der",
        "job:audit",
        "table:dw.detail",
        "table:dw.audit",
    }


def test_lineage_follows_topology_changes(client):
    _warehouse(client)
    assert "job:audit" in _ids(_lineage(client, table="ods.orders", direction="downstream"))
    put_job(client, "audit", ["dw.audit"], inputs=["ods.items"])
    down = _lineage(client, table="ods.orders", direction="downstream")
    assert "job:audit" not in _ids(down)
    assert "job:audit" in _ids(_lineage(client, table="ods.items", direction="downstream"))


def test_lineage_on_one_replica_follows_a_topology_change_made_on_another(settings, clock):
    """Each replica caches the graph; the topology version in the database tells a
    replica that another one changed the jobs since it built its graph."""
    with (
        TestClient(create_app(settings, clock)) as one,
        TestClient(create_app(settings, clock)) as other,
    ):
        _warehouse(one)
        assert "job:audit" in _ids(_lineage(one, table="ods.orders", direction="downstream"))
        put_job(other, "audit", ["dw.audit"], inputs=["ods.items"])
        assert "job:audit" not in _ids(_lineage(one, table="ods.orders", direction="downstream"))
        assert "job:audit" in _ids(_lineage(one, table="ods.items", direction="downstream"))


def test_lineage_answers_exact_bytes_and_shows_events_observed_after_caching(client):
    """The answer's JSON byte for byte (fields in schema order, an observed node's three
    fields only on it); OpenLineage events change no topology version, and the cached
    graph still shows what they observed."""
    _warehouse(client)
    r = client.get(f"{API}/lineage", params={"table": "dws.revenue", "depth": 1})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.content == (
        b'{"root":"table:dws.revenue","direction":"both","depth":1,"nodes":['
        b'{"id":"job:agg","kind":"job","name":"agg"},'
        b'{"id":"table:dw.detail","kind":"table","name":"dw.detail"},'
        b'{"id":"table:dws.revenue","kind":"table","name":"dws.revenue"}],"edges":['
        b'{"source":"job:agg","target":"table:dws.revenue"},'
        b'{"source":"table:dw.detail","target":"job:agg"}]}'
    )
    event = {
        "eventType": "COMPLETE",
        "eventTime": "2026-11-27T10:00:00Z",
        "producer": "https://example.com/producer",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": "9a3c6f3e-5d2b-4e0e-8a43-2f1e3c0d7b11"},
        "job": {"namespace": "spark", "name": "report"},
        "inputs": [{"namespace": "iceberg", "name": "dws.revenue"}],
        "outputs": [],
    }
    assert client.post(f"{API}/lineage", json=event).status_code == 201
    r = client.get(f"{API}/lineage", params={"table": "dws.revenue", "direction": "downstream"})
    assert r.status_code == 200
    assert r.content == (
        b'{"root":"table:dws.revenue","direction":"downstream","depth":null,"nodes":['
        b'{"id":"job:spark/report","kind":"job","name":"report","observed":true,'
        b'"source":"openlineage","namespace":"spark"},'
        b'{"id":"table:dws.revenue","kind":"table","name":"dws.revenue"}],"edges":['
        b'{"source":"table:dws.revenue","target":"job:spark/report","observed":true}]}'
    )


def test_lineage_bad_parameters_give_4xx(client, db_url):
    _warehouse(client)
    with unchanged(db_url):
        r = client.get(f"{API}/lineage", params={"table": "ods.nope"})
        assert_error(r, 404, "not_found", field="table")
        r = client.get(f"{API}/lineage", params={"table": "orders"})
        assert_error(r, 422, "invalid", field="table")
        r = client.get(f"{API}/lineage", params={"table": "ods.orders", "direction": "sideways"})
        assert_error(r, 422, "invalid_request", field="direction")
        r = client.get(f"{API}/lineage", params={"table": "ods.orders", "depth": -1})
        assert_error(r, 422, "invalid_request", field="depth")
        r = client.get(f"{API}/lineage", params={"table": "ods.orders", "depth": 1001})
        assert_error(r, 413, "too_large", field="depth")
        assert_error(client.get(f"{API}/lineage"), 422, "invalid_request", field="table")


# -- GET /lineage/snapshots/{table}/{snapshot_id} -----------------------------------------


def test_snapshot_lineage_of_a_derived_snapshot_lists_the_consumed_ranges(client, clock):
    source_and_derived(client, clock)
    run_batch(client, "src", 2, {"ods.orders": 103})
    clock.advance(SLOT)
    run_batch(client, "der", 1, {"dw.detail": 202})
    assert get_json(client, "/lineage/snapshots/dw.detail/201") == {
        "table": "dw.detail",
        "snapshot_id": 201,
        "job": "der",
        "batch_id": 0,
        "barrier": T0 + SLOT,
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
    second = get_json(client, "/lineage/snapshots/dw.detail/202")
    assert (second["batch_id"], second["barrier"]) == (1, T0 + 2 * SLOT)
    assert second["inputs"] == [
        {
            "table": "ods.orders",
            "from_barrier": T0 + SLOT,
            "to_barrier": T0 + 2 * SLOT,
            "from_snapshot": 102,
            "to_snapshot": 103,
        }
    ]


def _sql(db_url, statement, **params):
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.begin() as conn:
            conn.execute(text(statement), params)
    finally:
        engine.dispose()


def test_snapshot_lineage_lists_every_input_a_multi_input_batch_read(client, clock):
    put_job(client, "src", ["ods.orders"])
    put_job(client, "src2", ["ods.items"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders", "ods.items"])
    run_batch(client, "src", 0, {"ods.orders": 101})
    run_batch(client, "src2", 0, {"ods.items": 301})
    clock.advance(2 * SLOT)
    assert run_batch(client, "der", 0, {"dw.detail": 201}) == T0 + SLOT
    lineage = get_json(client, "/lineage/snapshots/dw.detail/201")
    assert [(r["table"], r["from_snapshot"], r["to_snapshot"]) for r in lineage["inputs"]] == [
        ("ods.items", None, 301),
        ("ods.orders", None, 101),
    ]


def test_snapshot_lineage_lists_the_inputs_the_batch_read_not_the_jobs_current_ones(
    client, clock, db_url
):
    """The batch was opened reading ods.orders; ods.items became an input afterwards (as
    the topology allowed before job changes were refused): its lineage is unchanged."""
    source_and_derived(client, clock)
    put_job(client, "src2", ["ods.items"])
    run_batch(client, "src2", 0, {"ods.items": 301})
    _sql(
        db_url,
        "INSERT INTO job_inputs (job_id, table_id) SELECT j.id, t.id FROM jobs j, tables t "
        "WHERE j.name = 'der' AND t.name = 'ods.items'",
    )
    assert get_json(client, "/jobs/der")["inputs"] == ["ods.items", "ods.orders"]
    inputs = get_json(client, "/lineage/snapshots/dw.detail/201")["inputs"]
    assert [(r["table"], r["to_snapshot"]) for r in inputs] == [("ods.orders", 102)]


def test_snapshot_lineage_of_a_batch_without_recorded_inputs_uses_the_jobs_inputs(
    client, clock, db_url
):
    """Batches from before their inputs were recorded (migration 0004) fall back."""
    source_and_derived(client, clock)
    _sql(db_url, "DELETE FROM batch_inputs")
    inputs = get_json(client, "/lineage/snapshots/dw.detail/201")["inputs"]
    assert [(r["table"], r["from_snapshot"], r["to_snapshot"]) for r in inputs] == [
        ("ods.orders", None, 102)
    ]


def test_snapshot_lineage_of_a_source_snapshot_has_no_inputs(client, clock):
    source_and_derived(client, clock)
    assert get_json(client, "/lineage/snapshots/ods.orders/101") == {
        "table": "ods.orders",
        "snapshot_id": 101,
        "job": "src",
        "batch_id": 0,
        "barrier": T0,
        "inputs": [],
    }


def test_snapshot_lineage_of_unknown_snapshot_or_table_gives_404(client, clock):
    source_and_derived(client, clock)
    r = client.get(f"{API}/lineage/snapshots/ods.orders/999")
    assert_error(r, 404, "not_found", field="snapshot_id")
    r = client.get(f"{API}/lineage/snapshots/dw.detail/101")  # a snapshot of another table
    assert_error(r, 404, "not_found", field="snapshot_id")
    assert_error(
        client.get(f"{API}/lineage/snapshots/ods.nope/101"), 404, "not_found", field="table"
    )


def test_snapshot_lineage_with_bad_snapshot_id_gives_422(client, clock):
    source_and_derived(client, clock)
    for bad in ["abc", str(2**63), str(-(2**63) - 1), "1e3"]:
        r = client.get(f"{API}/lineage/snapshots/ods.orders/{bad}")
        assert_error(r, 422, "invalid_request", field="snapshot_id")


# -- GET /delay ---------------------------------------------------------------------------


def _chain(client, clock):
    """src -> ods.orders -> der -> dw.detail -> agg -> dws.revenue, each job further behind.
    Ends at T0+6.5s: src sealed at T0+5s, der at T0+4s, agg at T0+1s."""
    source_and_derived(client, clock)  # der at T0+1s, clock T0+2s
    put_job(client, "agg", ["dws.revenue"], inputs=["dw.detail"])
    assert run_batch(client, "agg", 0, {"dws.revenue": 301}) == T0 + SLOT
    clock.advance(3 * SLOT)
    assert run_batch(client, "der", 1, {"dw.detail": 202}) == T0 + 4 * SLOT
    clock.advance(1500)


def test_delay_splits_into_per_job_contributions_along_the_critical_path(client, clock):
    _chain(client, clock)
    now = T0 + 6500
    delay = get_json(client, "/delay", table="dws.revenue")
    assert (delay["table"], delay["now_ms"], delay["frontier"]) == ("dws.revenue", now, T0 + SLOT)
    assert delay["delay_ms"] == now - (T0 + SLOT) == 5500
    assert delay["critical_path"] == [
        {
            "job": "agg",
            "output": "dws.revenue",
            "outputs": ["dws.revenue"],
            "slowest_input": "dw.detail",
            "input_frontier": T0 + 4 * SLOT,
            "output_frontier": T0 + SLOT,
            "contribution_ms": 3000,
        },
        {
            "job": "der",
            "output": "dw.detail",
            "outputs": ["dw.detail"],
            "slowest_input": "ods.orders",
            "input_frontier": T0 + 5 * SLOT,
            "output_frontier": T0 + 4 * SLOT,
            "contribution_ms": 1000,
        },
        {
            "job": "src",
            "output": "ods.orders",
            "outputs": ["ods.orders"],
            "slowest_input": None,
            "input_frontier": now,
            "output_frontier": T0 + 5 * SLOT,
            "contribution_ms": 1500,
        },
    ]
    assert sum(j["contribution_ms"] for j in delay["critical_path"]) == delay["delay_ms"]
    assert [(j["job"], j["contribution_ms"]) for j in delay["jobs"]] == [
        ("agg", 3000),
        ("src", 1500),
        ("der", 1000),
    ]
    assert get_json(client, "/tables/dws.revenue")["delay_ms"] == delay["delay_ms"]


def test_delay_critical_path_follows_the_slowest_input(client, clock):
    put_job(client, "src", ["ods.orders"])
    put_job(client, "src2", ["ods.items"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders", "ods.items"])
    barrier(client, "src2", 0)  # open batch holds ods.items at T0-1s
    run_batch(client, "src", 0, {"ods.orders": 1})
    clock.advance(3 * SLOT)
    delay = get_json(client, "/delay", table="dw.detail")
    assert [j["job"] for j in delay["critical_path"]] == ["der", "src2"]
    assert delay["critical_path"][0]["slowest_input"] == "ods.items"
    assert delay["critical_path"][0]["input_frontier"] == T0 - SLOT
    assert delay["critical_path"][1]["contribution_ms"] == 4000
    # der never committed: no delay and no contribution of its own, not the epoch's age
    assert (delay["delay_ms"], delay["critical_path"][0]["contribution_ms"]) == (None, None)
    assert {j["job"] for j in delay["jobs"]} == {"der", "src", "src2"}
    # once src2 commits, src is the slowest input
    commit(client, "src2", 0, T0, "ods.items", 2)
    clock.advance(SLOT)
    barrier(client, "src", 1)  # src now holds ods.orders at T0+3s
    clock.advance(SLOT)
    delay = get_json(client, "/delay", table="dw.detail")
    assert [j["job"] for j in delay["critical_path"]] == ["der", "src"]
    assert delay["critical_path"][1]["contribution_ms"] == 2000


def test_delay_names_the_output_of_a_multi_output_job_that_is_on_the_path(client, clock):
    """der writes dw.a and dw.b; agg reads only dw.b. Both outputs share der's frontier."""
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.a", "dw.b"], inputs=["ods.orders"])
    put_job(client, "agg", ["dws.c"], inputs=["dw.b"])
    run_batch(client, "src", 0, {"ods.orders": 1})
    clock.advance(2 * SLOT)
    assert run_batch(client, "der", 0, {"dw.a": 11, "dw.b": 21}) == T0 + SLOT
    clock.advance(3 * SLOT)
    delay = get_json(client, "/delay", table="dws.c")
    path = [(j["job"], j["output"], j["outputs"]) for j in delay["critical_path"]]
    assert path == [
        ("agg", "dws.c", ["dws.c"]),
        ("der", "dw.b", ["dw.a", "dw.b"]),
        ("src", "ods.orders", ["ods.orders"]),
    ]
    assert delay["delay_ms"] is None  # agg never committed
    assert {j["job"]: j["output"] for j in delay["jobs"]} == {
        "agg": "dws.c",
        "der": "dw.b",
        "src": "ods.orders",
    }
    for table in ("dw.a", "dw.b"):
        delay = get_json(client, "/delay", table=table)
        assert delay["frontier"] == T0 + SLOT
        assert [(j["job"], j["output"]) for j in delay["critical_path"]] == [
            ("der", table),
            ("src", "ods.orders"),
        ]
        assert delay["critical_path"][0]["outputs"] == ["dw.a", "dw.b"]


def test_delay_of_a_source_table_is_its_own_lag(client, clock):
    put_job(client, "src", ["ods.orders"])
    clock.advance(2500)
    delay = get_json(client, "/delay", table="ods.orders")
    assert delay["delay_ms"] == 1500
    assert [(j["job"], j["contribution_ms"]) for j in delay["critical_path"]] == [("src", 1500)]


def test_delay_bad_tables_give_4xx(client, db_url):
    put_job(client, "der", ["dw.detail"], inputs=["ods.orphan"])
    with unchanged(db_url):
        assert_error(client.get(f"{API}/delay", params={"table": "ods.nope"}), 404, "not_found")
        r = client.get(f"{API}/delay", params={"table": "nope"})
        assert_error(r, 422, "invalid", field="table")
        r = client.get(f"{API}/delay", params={"table": "ods.orphan"})
        assert_error(r, 409, "no_writer", field="table")
        assert_error(client.get(f"{API}/delay"), 422, "invalid_request", field="table")


def test_a_table_that_never_committed_has_a_null_frontier_and_delay_not_the_epochs_age(
    client, clock
):
    """der was registered and committed nothing: no data yet, everywhere the API says it;
    its first commit gives it numbers."""
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    clock.advance(2500)
    for view in (get_json(client, "/tables/dw.detail"), get_json(client, "/tables")["items"][0]):
        assert view["name"] == "dw.detail" and view["writer"] == "der"
        assert (view["frontier"], view["delay_ms"]) == (None, None)
    source = get_json(client, "/tables/ods.orders")  # an idle source follows the clock
    assert (source["frontier"], source["delay_ms"]) == (T0 + SLOT, 1500)
    delay = get_json(client, "/delay", table="dw.detail")
    assert (delay["frontier"], delay["delay_ms"]) == (None, None)
    assert [
        (j["job"], j["output_frontier"], j["contribution_ms"]) for j in delay["critical_path"]
    ] == [
        ("der", 0, None),
        ("src", T0 + SLOT, 1500),
    ]
    assert [j["job"] for j in delay["jobs"]] == ["der", "src"]  # no data yet comes first

    first = run_batch(client, "der", 0, {"dw.detail": 201})
    clock.advance(SLOT)
    now = get_json(client, "/delay", table="dw.detail")["now_ms"]
    view = get_json(client, "/tables/dw.detail")
    assert (view["frontier"], view["delay_ms"]) == (first, now - first)
    delay = get_json(client, "/delay", table="dw.detail")
    assert (delay["frontier"], delay["delay_ms"]) == (first, now - first)
    assert sum(j["contribution_ms"] for j in delay["critical_path"]) == delay["delay_ms"]
