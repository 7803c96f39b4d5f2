"""What a revision keeps across its life and its swap (SQLite and PostgreSQL, real
Iceberg tables): the inputs its jobs read from the originals, the consistent versions
already handed out, the reports of its jobs' batches open at the swap, and what users
attach to a table by name.

The pipeline is test_revisions': ``feed`` -> ods.feed -> ``src`` -> ods.orders -> ``der``
-> dw.detail -> ``agg`` (with ods.items from ``items``) -> dws.summary. Revising
dw.detail re-runs ``der`` (reading ods.orders from the original) and ``agg`` (reading
ods.items from the original).
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyiceberg")

from fastapi.testclient import TestClient

from metaservice.lifecycle.expiry import expire_table
from metaservice.revisions import service as revisions
from tests.metaservice import test_expiry
from tests.metaservice.helpers import API, assert_error, get_json, unchanged
from tests.metaservice.test_expiry import Lake, expire, ids, services
from tests.metaservice.test_revisions import pipeline, revise

warehouse = test_expiry.warehouse
settings = test_expiry.settings
catalog = test_expiry.catalog
lake = test_expiry.lake


# -- the inputs a revision's jobs read from the originals -----------------------------------


def test_a_revision_whose_unaffected_input_was_expired_at_the_barrier_is_409_expired(
    client: TestClient, lake: Lake, db_url: str
) -> None:
    """``der__rev`` would read ods.orders from its snapshot at the barrier (s1): expired,
    its first batch would read the whole table again on top of a mirror that already
    holds its result."""
    w, version = pipeline(client, lake)
    expired = expire(client, "ods.orders")
    assert w["s1"].snapshot_id in ids(expired["snapshots"])
    horizon = expired["expiry_horizon"]
    with unchanged(db_url):
        r = revise(client, "dw.detail", version["barrier"])
        message = assert_error(r, 409, "expired", field="from_barrier")["message"]
    assert "'ods.orders'" in message and "input" in message
    assert f"the oldest still possible is {horizon}" in message


def test_an_unaffected_input_keeps_its_snapshot_at_the_barrier_while_the_revision_is_recorded(
    client: TestClient, lake: Lake
) -> None:
    """From the record's commit on (state ``creating``, before its jobs are registered),
    expiry keeps each unaffected input's snapshot at the barrier, as a lease would."""
    w, version = pipeline(client, lake)
    svc = services(client)
    found = svc.db.write(
        lambda session: revisions.record_revision(session, svc.ctx, "dw.detail", version["barrier"])
    )
    assert found.state == "creating"
    plan = get_json(client, "/tables/ods.orders/expirable")
    kept = {k["snapshot_id"]: k["reasons"] for k in plan["kept"]}
    assert f"revision {found.id}" in kept[w["s1"].snapshot_id]
    removed = expire_table(svc.db, svc.ctx, "ods.orders")
    assert ids([s.model_dump() for s in removed.snapshots]) == [w["s0"].snapshot_id]
    items = get_json(client, "/tables/ods.items/expirable")
    assert (
        f"revision {found.id}"
        in {k["snapshot_id"]: k["reasons"] for k in items["kept"]}[w["i0"].snapshot_id]
    )
    # cancelled, it keeps nothing
    assert client.delete(f"{API}/revisions/{found.id}").json()["state"] == "cancelled"
    plan = get_json(client, "/tables/ods.orders/expirable")
    assert w["s1"].snapshot_id in ids(plan["expirable"])
