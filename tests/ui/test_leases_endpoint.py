"""GET /api/v1/tables/{table}/leases: the console's read of a table's live leases."""

from __future__ import annotations

from fastapi.testclient import TestClient

from metaservice.clock import ManualClock
from tests.metaservice.helpers import API, assert_error, get_json, source_and_derived


def lease(client: TestClient, tables: list[str], seconds: int) -> dict[str, object]:
    r = client.post(f"{API}/leases", json={"tables": tables, "lease_seconds": seconds})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def test_lists_a_tables_live_leases_soonest_to_end_first(
    client: TestClient, clock: ManualClock
) -> None:
    source_and_derived(client, clock)
    long = lease(client, ["ods.orders", "dw.detail"], 600)
    short = lease(client, ["ods.orders"], 60)
    page = get_json(client, "/tables/ods.orders/leases")
    assert page["total"] == 2
    assert [i["lease_id"] for i in page["items"]] == [short["lease_id"], long["lease_id"]]
    first = page["items"][0]
    assert first["snapshot_id"] == short["snapshots"]["ods.orders"]
    assert (first["barrier"], first["tables"]) == (short["barrier"], 1)
    assert first["expires_ms"] == short["lease_expires_ms"]
    assert page["items"][1]["tables"] == 2
    assert get_json(client, "/tables/dw.detail/leases")["total"] == 1
    # Paged like every list; an ended lease is gone.
    assert len(get_json(client, "/tables/ods.orders/leases", limit=1)["items"]) == 1
    clock.advance(61_000)
    assert [i["lease_id"] for i in get_json(client, "/tables/ods.orders/leases")["items"]] == [
        long["lease_id"]
    ]


def test_an_unknown_table_is_404(client: TestClient) -> None:
    assert_error(client.get(f"{API}/tables/no.such/leases"), 404, "not_found", "table")


def test_a_catalog_sessions_lease_of_all_tables_is_listed_on_each_table(
    client: TestClient, clock: ManualClock
) -> None:
    source_and_derived(client, clock)
    r = client.get("/iceberg/v1/config")
    assert r.status_code == 200, r.text
    prefix = r.json()["overrides"]["prefix"]
    version = get_json(client, "/versions/consistent", tables="ods.orders,dw.detail")
    tables = get_json(client, "/tables")["total"]
    for name in ("ods.orders", "dw.detail"):
        page = get_json(client, f"/tables/{name}/leases")
        assert page["total"] == 1, page
        (item,) = page["items"]
        assert item["lease_id"] == prefix
        assert (item["barrier"], item["tables"]) == (version["barrier"], tables)
        assert item["snapshot_id"] == version["snapshots"][name]
