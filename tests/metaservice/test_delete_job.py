"""DELETE /jobs/{job}: removing a job nobody reads from, and refusing the others."""

from __future__ import annotations

from fastapi.testclient import TestClient

from metaservice.clock import ManualClock
from tests.metaservice.helpers import (
    API,
    assert_error,
    consistent,
    get_json,
    put_job,
    run_batch,
    source_and_derived,
    unchanged,
)


def test_deleting_a_job_removes_it_and_its_edges_and_its_tables_keep_their_history(
    client: TestClient, clock: ManualClock
) -> None:
    barriers = source_and_derived(client, clock)
    r = client.delete(f"{API}/jobs/der")
    assert r.status_code == 204, r.text
    assert_error(client.get(f"{API}/jobs/der"), 404, "not_found")
    assert [j["name"] for j in get_json(client, "/jobs")["items"]] == ["src"]
    detail = get_json(client, "/tables/dw.detail")
    assert (detail["writer"], detail["frontier"], detail["latest_snapshot"]) == (None, None, 201)
    [kept] = get_json(client, "/tables/dw.detail/snapshots")["items"]
    assert (kept["snapshot_id"], kept["barrier"], kept["job"]) == (201, barriers["der0"], None)
    assert get_json(client, "/tables/ods.orders")["readers"] == []
    graph = get_json(client, "/lineage", table="ods.orders", direction="downstream")
    assert [n["name"] for n in graph["nodes"]] == ["ods.orders"]  # der is gone
    # the source keeps working, and the table can get a new writer
    clock.advance(1000)
    run_batch(client, "src", 2, {"ods.orders": 103})
    assert consistent(client, "ods.orders").status_code == 200
    # ... which starts above the table's history (its first batch starts after it)
    view = put_job(client, "der2", ["dw.detail"], inputs=["ods.orders"])
    assert view["frontier"] == barriers["der0"]


def test_a_job_whose_outputs_are_read_is_not_deleted(
    db_url: str, client: TestClient, clock: ManualClock
) -> None:
    source_and_derived(client, clock)
    with unchanged(db_url):
        body = assert_error(client.delete(f"{API}/jobs/src"), 409, "has_readers", field="job")
    assert "'der'" in body["message"] and "ods.orders" in body["message"]
    assert client.delete(f"{API}/jobs/der").status_code == 204
    assert client.delete(f"{API}/jobs/src").status_code == 204
    assert get_json(client, "/jobs")["items"] == []


def test_deleting_an_unknown_job_is_404(db_url: str, client: TestClient) -> None:
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        assert_error(client.delete(f"{API}/jobs/nope"), 404, "not_found")
