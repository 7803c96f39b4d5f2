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

from metaservice.contract import encode_stamp
from metaservice.lifecycle.expiry import expire_table
from metaservice.revisions import service as revisions
from tests.metaservice import test_expiry, test_revision_swap
from tests.metaservice.helpers import (
    API,
    assert_error,
    barrier,
    consistent,
    get_json,
    put_job,
    report,
    unchanged,
)
from tests.metaservice.test_expiry import Lake, expire, ids, services
from tests.metaservice.test_revision_swap import catch_up, ready_revision, swap
from tests.metaservice.test_revisions import pipeline, revise

warehouse = test_expiry.warehouse
settings = test_revision_swap.settings  # a revision is ready once its mirrors caught up
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


# -- the swap keeps every consistent version from going back ---------------------------------


def test_the_swap_waits_until_no_consistent_version_would_go_back(
    client: TestClient, lake: Lake
) -> None:
    """``d`` and ``x`` both read ods.s, one slot per batch, ``x`` a round behind at the
    end; ``d__rev`` catches up in aligned batches, so its mirror is not exact at the
    barrier {dw.d, dw.x} is at (x's frontier). Swapped then, that version would go back:
    the swap waits until ``x`` is exact at a barrier the mirror is exact at."""
    put_job(client, "s", ["ods.s"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    put_job(client, "x", ["dw.x"], inputs=["ods.s"])

    def round_(i: int, *, with_x: bool = True) -> None:
        lake.batch("s", i, "ods.s", [i])
        lake.batch("d", i, "dw.d", [10 + i])
        if with_x:
            lake.batch("x", i, "dw.x", [100 + i])

    for i in range(3):
        round_(i)
    start = consistent(client, "dw.d,dw.x").json()["barrier"]
    rid = revise(client, "dw.d", start).json()["id"]
    for i in range(3, 13):
        round_(i, with_x=i < 10)
    mirror_barriers = []
    for k in range(8):
        if frontier(client, f"d__rev{rid}") >= frontier(client, "d"):
            break
        mirror_barriers.append(lake.batch(f"d__rev{rid}", k, f"dw.d__rev{rid}", [20 + k]).barrier)
    handed_out = consistent(client, "dw.d,dw.x").json()["barrier"]
    assert handed_out == frontier(client, "x")
    assert handed_out not in mirror_barriers, (handed_out, mirror_barriers)  # the case at hand

    r = swap(client, rid, wait_seconds=0.3)

    assert r.status_code == 202, r.text
    assert r.json()["state"] == "swapping"
    waits = r.json()["swap_waits_for"]
    assert "'dw.x'" in waits and f"at barrier {handed_out}" in waits, waits
    assert consistent(client, "dw.d,dw.x").json()["barrier"] == handed_out  # nothing swapped
    # x catches up: the swap goes through once x is exact where the mirror is
    for batch_id in range(12, 20):
        lake.batch("x", batch_id, "dw.x", [100 + batch_id])
        if swap(client, rid, wait_seconds=0.3).status_code == 200:
            break
    assert revision_state(client, rid) == "swapped"
    assert get_json(client, f"/revisions/{rid}")["swap_waits_for"] is None
    after = consistent(client, "dw.d,dw.x").json()
    assert after["barrier"] >= handed_out, (after, handed_out, mirror_barriers)
    assert consistent(client, "dw.d").json()["barrier"] >= max(mirror_barriers)


def test_the_swap_waits_for_a_table_of_another_pipeline_a_version_pairs_it_with(
    client: TestClient, lake: Lake
) -> None:
    """As above, but ``x`` reads ``ods.y`` of its own source: nothing connects dw.x to
    the revised table, and a consistent version may still name both. The swap checks
    every table of the topology, not only those connected to the revised ones."""
    put_job(client, "s", ["ods.s"])
    put_job(client, "y", ["ods.y"])
    put_job(client, "d", ["dw.d"], inputs=["ods.s"])
    put_job(client, "x", ["dw.x"], inputs=["ods.y"])

    def round_(i: int, *, with_x: bool = True) -> None:
        lake.batch("s", i, "ods.s", [i])
        lake.batch("y", i, "ods.y", [1000 + i])
        lake.batch("d", i, "dw.d", [10 + i])
        if with_x:
            lake.batch("x", i, "dw.x", [100 + i])

    for i in range(3):
        round_(i)
    start = consistent(client, "dw.d").json()["barrier"]
    rid = revise(client, "dw.d", start).json()["id"]
    for i in range(3, 13):
        round_(i, with_x=i < 10)
    mirror_barriers = []
    for k in range(8):
        if frontier(client, f"d__rev{rid}") >= frontier(client, "d"):
            break
        mirror_barriers.append(lake.batch(f"d__rev{rid}", k, f"dw.d__rev{rid}", [20 + k]).barrier)
    handed_out = consistent(client, "dw.d,dw.x").json()["barrier"]
    assert handed_out == frontier(client, "x")
    assert handed_out not in mirror_barriers, (handed_out, mirror_barriers)  # the case at hand

    r = swap(client, rid, wait_seconds=0.3)

    assert r.status_code == 202, r.text
    assert r.json()["state"] == "swapping"
    waits = r.json()["swap_waits_for"]
    assert "'dw.x'" in waits and f"at barrier {handed_out}" in waits, waits
    assert consistent(client, "dw.d,dw.x").json()["barrier"] == handed_out  # nothing swapped
    for batch_id in range(12, 20):
        lake.batch("y", batch_id + 1, "ods.y", [1000 + batch_id])
        lake.batch("x", batch_id, "dw.x", [100 + batch_id])
        if swap(client, rid, wait_seconds=0.3).status_code == 200:
            break
    assert revision_state(client, rid) == "swapped"
    after = consistent(client, "dw.d,dw.x").json()
    assert after["barrier"] >= handed_out, (after, handed_out, mirror_barriers)


def frontier(client: TestClient, job: str) -> int:
    return get_json(client, f"/jobs/{job}")["frontier"]  # type: ignore[no-any-return]


def revision_state(client: TestClient, rid: int) -> str:
    return get_json(client, f"/revisions/{rid}")["state"]  # type: ignore[no-any-return]


# -- a revision job's batch open at the swap ------------------------------------------------


def test_a_revision_batch_open_at_the_swap_is_recorded_under_the_mirrors_old_name(
    client: TestClient, lake: Lake
) -> None:
    """``der__rev`` committed a batch to its mirror before the swap; its report, queued
    in the outbox under the mirror's name, lands after the swap on the table the mirror
    became, and the batch does not stay open."""
    _, rid, next_id = ready_revision(client, lake)
    next_id = catch_up(client, lake, rid, next_id)
    lake.batch("feed", 10, "ods.feed", [10])
    lake.batch("src", 10, "ods.orders", [10])
    job, mirror = f"der__rev{rid}", f"dw.detail__rev{rid}"
    opened = barrier(client, job, next_id)
    assert opened["committed"] is False
    stamp = encode_stamp(opened["barrier"], job, next_id)
    written = lake.commit(mirror, stamp, opened["barrier"], [250], False)

    done = swap(client, rid, wait_seconds=10)

    assert done.status_code == 200, done.text
    assert done.json()["state"] == "swapped"
    queued = report(job, next_id, opened["barrier"], mirror, written.snapshot_id)
    r = client.post(f"{API}/commits", json=queued)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "recorded" and r.json()["batch_committed"] is True
    table = get_json(client, "/tables/dw.detail")
    assert table["writer"] == job and table["frontier"] == opened["barrier"]
    # the outbox retrying it (its answer lost) gets the same answer again
    again = client.post(f"{API}/commits", json=queued)
    assert again.status_code == 200 and again.json()["status"] == "duplicate", again.text
    # the job goes on: its next batch is given a barrier
    lake.batch("feed", 11, "ods.feed", [11])
    lake.batch("src", 11, "ods.orders", [11])
    assert lake.batch(job, next_id + 1, "dw.detail", [251]).barrier > opened["barrier"]


# -- what is attached to a table by name ----------------------------------------------------


def test_retention_follows_the_name_and_leases_and_tags_stay_with_the_old_table(
    client: TestClient, lake: Lake
) -> None:
    _, rid, next_id = ready_revision(client, lake)
    policy = {"keep_last": 10, "keep_for_seconds": 86400}
    assert client.put(f"{API}/tables/dw.detail/retention", json=policy).status_code == 200
    lease = consistent(client, "dw.detail", lease_seconds=3600).json()
    tagged = client.post(f"{API}/versions/tags", json={"name": "before", "tables": ["dw.detail"]})
    assert tagged.status_code == 201, tagged.text
    catch_up(client, lake, rid, next_id)

    assert swap(client, rid, wait_seconds=10).status_code == 200

    pre = f"dw.detail__pre_rev{rid}"
    for name in ("dw.detail", pre):  # the name's policy, and the old table keeps its own
        kept = get_json(client, f"/tables/{name}/retention")
        assert (kept["keep_last"], kept["keep_for_seconds"]) == (10, 86400), (name, kept)
        assert kept["keep_last_is_default"] is False
    plan = get_json(client, "/tables/dw.detail/expirable")
    assert plan["expirable"] == [], plan  # the policy keeps the swapped-in table's history
    # the lease's snapshot is the old table's: it stays there, kept, readable by id
    snapshot = lease["snapshots"]["dw.detail"]
    old = {
        k["snapshot_id"]: k["reasons"] for k in get_json(client, f"/tables/{pre}/expirable")["kept"]
    }
    assert any(r.startswith(f"lease {lease['lease_id']}") for r in old[snapshot]), old
    assert lake.catalog.load_table(pre).snapshot_by_id(snapshot) is not None
    assert lake.catalog.load_table("dw.detail").snapshot_by_id(snapshot) is None
    # the tag names the old table's snapshot, under the old table's new name
    tag = get_json(client, "/versions/tags/before")
    assert tag["snapshots"] == {pre: tagged.json()["snapshots"]["dw.detail"]}
    assert lake.catalog.load_table(pre).snapshot_by_id(tag["snapshots"][pre]) is not None
