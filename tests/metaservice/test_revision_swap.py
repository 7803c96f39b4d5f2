"""Running and swapping a revision on real Iceberg tables (SQLite and PostgreSQL): the
revision jobs registered and seeded at the barrier, the states, and the swap.

The pipeline is test_revisions': ``feed`` (a source) -> ods.feed -> ``src`` -> ods.orders
-> ``der`` -> dw.detail -> ``agg`` (with ods.items from the source ``items``) ->
dws.summary. The revisions here revise dw.detail from the consistent version's barrier:
``der`` and ``agg`` are re-run as ``der__revN`` and ``agg__revN``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from fastapi.testclient import TestClient

from metaservice.catalog_loading import open_catalog, sql_catalog_properties
from metaservice.clock import ManualClock
from metaservice.contract import encode_stamp
from metaservice.revisions import swap as swap_module
from metaservice.settings import Settings
from tests.metaservice import test_expiry
from tests.metaservice.helpers import (
    API,
    SLOT,
    assert_error,
    consistent,
    custom_client,
    get_json,
    unchanged,
)
from tests.metaservice.test_expiry import (
    Lake,
    Written,
    expire,
    ids,
    lake_for,
    local,
    rows_at,
    wait_for,
)
from tests.metaservice.test_revisions import catalog_state, created, pipeline, revise

warehouse = test_expiry.warehouse
catalog = test_expiry.catalog
lake = test_expiry.lake

AFFECTED = ["dw.detail", "dws.summary"]


@pytest.fixture
def settings(db_url: str, warehouse: Path) -> Settings:
    """test_expiry's settings, with a revision ready only once its mirrors have caught up
    completely (the pipeline's originals are a few slots past the revisions' barrier)."""
    return Settings(db_url=db_url, warehouse=str(warehouse), revision_ready_lag_ms=0)


def revision(client: TestClient, rid: int) -> dict[str, Any]:
    return get_json(client, f"/revisions/{rid}")  # type: ignore[no-any-return]


def by_table(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["table"]: m for m in view["tables"]}


def run_revision(lake: Lake, rid: int, batch_id: int) -> dict[str, Written]:
    """One batch of each revision job, upstream first: der__rev writes its mirror of
    dw.detail, agg__rev its mirror of dws.summary."""
    return {
        "dw.detail": lake.batch(
            f"der__rev{rid}", batch_id, f"dw.detail__rev{rid}", [200 + batch_id]
        ),
        "dws.summary": lake.batch(
            f"agg__rev{rid}", batch_id, f"dws.summary__rev{rid}", [2000 + batch_id]
        ),
    }


# -- A: revision jobs ---------------------------------------------------------------------


def test_revision_jobs_are_registered_and_seeded_at_the_barrier(
    client: TestClient, lake: Lake
) -> None:
    w, version = pipeline(client, lake)
    b = version["barrier"]

    made = created(client, "dw.detail", b)

    rid = made["id"]
    assert [(j["job"], j["revision_job"]) for j in made["must_run"]] == [
        ("agg", f"agg__rev{rid}"),
        ("der", f"der__rev{rid}"),
    ]
    der = get_json(client, f"/jobs/der__rev{rid}")
    agg = get_json(client, f"/jobs/agg__rev{rid}")
    assert (der["kind"], der["inputs"], der["outputs"]) == (
        "derived",
        ["ods.orders"],  # not affected: the original
        [f"dw.detail__rev{rid}"],
    )
    assert (agg["kind"], sorted(agg["inputs"]), agg["outputs"]) == (
        "derived",
        sorted([f"dw.detail__rev{rid}", "ods.items"]),
        [f"dws.summary__rev{rid}"],
    )
    assert der["frontier"] == agg["frontier"] == b
    # the mirrors are registered tables whose history starts at their start snapshots
    for table, start in (("dw.detail", w["d0"]), ("dws.summary", w["a0"])):
        mirror = get_json(client, f"/tables/{table}__rev{rid}")
        assert mirror["frontier"] == b
        snaps = get_json(client, f"/tables/{table}__rev{rid}/snapshots")
        assert [(s["barrier"], s["snapshot_id"]) for s in snaps["items"]] == [
            (b, start.snapshot_id)
        ], snaps
    mirrors = [f"{t}__rev{rid}" for t in AFFECTED]
    at_b = consistent(client, ",".join(mirrors)).json()
    assert (at_b["barrier"], at_b["snapshots"]) == (
        b,
        {mirrors[0]: w["d0"].snapshot_id, mirrors[1]: w["a0"].snapshot_id},
    )

    # a driver registering the job as must_run says is a no-op
    r = client.put(
        f"{API}/jobs/der__rev{rid}",
        json={"inputs": ["ods.orders"], "outputs": [f"dw.detail__rev{rid}"]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["frontier"] == b

    # its first batch starts at the barrier and reads only what changed after it
    first = client.post(f"{API}/jobs/der__rev{rid}/batches/0/barrier").json()
    assert first["start_barrier"] == b and first["barrier"] > b
    (orders,) = first["inputs"]
    assert (orders["table"], orders["from_barrier"]) == ("ods.orders", b)
    assert orders["from_snapshot"] == w["s1"].snapshot_id  # ods.orders at b, not None
    at_end = [x for x in lake.written["ods.orders"] if x.barrier <= first["barrier"]][-1]
    assert orders["to_snapshot"] == at_end.snapshot_id != orders["from_snapshot"]
    written = lake.commit(
        f"dw.detail__rev{rid}",
        {"metaservice.barrier": str(first["barrier"]), "metaservice.job": f"der__rev{rid}",
         "metaservice.batch": "0"},
        first["barrier"],
        [201],
        False,
    )  # fmt: skip
    lake.report(f"der__rev{rid}", 0, first["barrier"], f"dw.detail__rev{rid}", written.snapshot_id)
    # the mirror holds the original's rows at b and the revision's
    assert rows_at(lake.catalog.load_table(f"dw.detail__rev{rid}"), written.snapshot_id) == [
        100,
        201,
    ]
    # downstream, agg's revision job reads the mirror from its start snapshot on
    second = client.post(f"{API}/jobs/agg__rev{rid}/batches/0/barrier").json()
    assert second["start_barrier"] == b and second["barrier"] == first["barrier"]
    ranges = {i["table"]: i for i in second["inputs"]}
    assert ranges[f"dw.detail__rev{rid}"]["from_snapshot"] == w["d0"].snapshot_id
    assert ranges[f"dw.detail__rev{rid}"]["to_snapshot"] == written.snapshot_id


def test_expiry_plans_a_mirror_but_refuses_to_expire_it_while_the_revision_is_active(
    client: TestClient, lake: Lake
) -> None:
    _, version = pipeline(client, lake)
    rid = created(client, "dw.detail", version["barrier"])["id"]
    run_revision(lake, rid, 0)
    plan = client.get(f"{API}/tables/dw.detail__rev{rid}/expirable")
    assert plan.status_code == 200, plan.text
    r = client.post(f"{API}/tables/dw.detail__rev{rid}/expire")
    assert_error(r, 409, "revision_pending", field="table")


def test_revising_a_table_a_source_job_writes_is_409_source_job_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str, warehouse: Path
) -> None:
    _, version = pipeline(client, lake)
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        body = assert_error(
            revise(client, "ods.items", version["barrier"]), 409, "source_job", field="table"
        )
        assert "source job 'items'" in body["message"] and "re-run" in body["message"]
    assert catalog_state(lake.catalog, warehouse) == before


def test_cancel_deletes_the_revision_jobs_and_their_tables_records(
    client: TestClient, lake: Lake
) -> None:
    _, version = pipeline(client, lake)
    rid = created(client, "dw.detail", version["barrier"])["id"]
    run_revision(lake, rid, 0)
    assert client.delete(f"{API}/revisions/{rid}").json()["state"] == "cancelled"
    for job in ("der", "agg"):
        assert client.get(f"{API}/jobs/{job}__rev{rid}").status_code == 404
    for table in AFFECTED:
        assert client.get(f"{API}/tables/{table}__rev{rid}").status_code == 404
        assert client.get(f"{API}/tables/{table}").status_code == 200
    # the tables are free for a new revision, whose jobs start afresh
    again = created(client, "dw.detail", version["barrier"])
    assert get_json(client, f"/jobs/der__rev{again['id']}")["frontier"] == version["barrier"]


# -- B: states ----------------------------------------------------------------------------


def test_a_revision_is_planned_then_running_then_ready_as_its_mirrors_catch_up(
    client: TestClient, lake: Lake
) -> None:
    _, version = pipeline(client, lake)
    b = version["barrier"]
    made = created(client, "dw.detail", b)
    rid = made["id"]
    lag = client.app.state.services.ctx.settings.revision_ready_lag_ms  # type: ignore[attr-defined]
    tables = by_table(made)
    assert made["state"] == "planned"
    for table in AFFECTED:
        m = tables[table]
        original = get_json(client, f"/tables/{table}")["frontier"]
        assert (m["frontier"], m["original_frontier"], m["lag_ms"]) == (b, original, original - b)
        assert m["lag_ms"] > lag  # the pipeline ran past b
    # the originals keep running meanwhile
    lake.batch("feed", 10, "ods.feed", [10])
    lake.batch("src", 10, "ods.orders", [10])
    lake.batch("der", 10, "dw.detail", [110])
    lake.batch("agg", 10, "dws.summary", [1010])

    lake.batch(f"der__rev{rid}", 0, f"dw.detail__rev{rid}", [200])
    assert revision(client, rid)["state"] == "running"  # agg's mirror is still at b
    states = []
    for batch_id in range(3):
        if batch_id:
            lake.batch(f"der__rev{rid}", batch_id, f"dw.detail__rev{rid}", [200 + batch_id])
        written = lake.batch(
            f"agg__rev{rid}", batch_id, f"dws.summary__rev{rid}", [2000 + batch_id]
        )
        view = revision(client, rid)
        states.append(view["state"])
        for table in AFFECTED:
            m = by_table(view)[table]
            original = get_json(client, f"/tables/{table}")["frontier"]
            job = get_json(client, f"/jobs/{m['revision_job']}")
            assert m["frontier"] == job["frontier"]
            assert m["original_frontier"] == original
            assert m["lag_ms"] == max(0, original - m["frontier"])
        assert by_table(view)["dws.summary"]["frontier"] >= written.barrier
    assert states[-1] == "ready", states
    assert all(m["lag_ms"] <= lag for m in view["tables"])


def test_a_revision_is_not_ready_while_one_mirror_lags(client: TestClient, lake: Lake) -> None:
    _, version = pipeline(client, lake)
    rid = created(client, "dw.detail", version["barrier"])["id"]
    for batch_id in range(2):  # only der__rev runs: agg's mirror stays at the barrier
        lake.batch(f"der__rev{rid}", batch_id, f"dw.detail__rev{rid}", [200 + batch_id])
    view = revision(client, rid)
    assert view["state"] == "running"
    assert by_table(view)["dws.summary"]["frontier"] == version["barrier"]
    assert by_table(view)["dws.summary"]["lag_ms"] > SLOT


# -- C: the swap --------------------------------------------------------------------------


def ready_revision(client: TestClient, lake: Lake) -> tuple[dict[str, Any], int, int]:
    """The pipeline, a revision of dw.detail from its consistent version, and the
    revision jobs run until it is ready; returns the version, the revision's id and the
    next batch id of the revision jobs."""
    return ready_revision_with_history(client, lake)[1:]


def ready_revision_with_history(
    client: TestClient, lake: Lake
) -> tuple[dict[str, Written], dict[str, Any], int, int]:
    """:func:`ready_revision`, and the pipeline's batches first."""
    w, version = pipeline(client, lake)
    rid = created(client, "dw.detail", version["barrier"])["id"]
    batch_id = 0
    while revision(client, rid)["state"] != "ready":
        assert batch_id < 5, revision(client, rid)
        run_revision(lake, rid, batch_id)
        batch_id += 1
    return w, version, rid, batch_id


def catch_up(client: TestClient, lake: Lake, rid: int, batch_id: int) -> int:
    """Run the revision jobs until every mirror has reached its original; returns the next
    batch id."""
    for _ in range(5):
        if all(m["lag_ms"] == 0 for m in revision(client, rid)["tables"]):
            return batch_id
        run_revision(lake, rid, batch_id)
        batch_id += 1
    raise AssertionError(revision(client, rid))


def swap(client: TestClient, rid: int, **body: Any) -> Any:
    return client.post(f"{API}/revisions/{rid}/swap", json=body or None)


def snapshot_ids(lake: Lake, table: str) -> set[int]:
    return {x.snapshot_id for x in lake.written.get(table, [])}


def test_the_swap_catalog_path_is_the_same_transaction_here(settings: Settings) -> None:
    assert swap_module.catalog_in_database(settings) == "metaservice"
    other = Settings(db_url=settings.db_url, catalog_properties={"uri": "sqlite:///other.db"})
    assert swap_module.catalog_in_database(other) is None


def test_a_swap_before_the_revision_is_ready_is_409_not_ready_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str, warehouse: Path
) -> None:
    _, version = pipeline(client, lake)
    rid = created(client, "dw.detail", version["barrier"])["id"]
    assert revision(client, rid)["state"] == "planned"
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        body = assert_error(swap(client, rid, wait_seconds=0), 409, "not_ready")
        assert "planned" in body["message"] and f"dw.detail__rev{rid}" in body["message"]
    assert catalog_state(lake.catalog, warehouse) == before
    # the original writers are not superseded
    lake.batch("feed", 10, "ods.feed", [10])
    lake.batch("src", 10, "ods.orders", [10])
    lake.batch("der", 10, "dw.detail", [110])


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"wait_seconds": -1}, 422, "invalid_request"),
        ({"wait_seconds": 301}, 422, "invalid_request"),
        ({"wait_seconds": "soon"}, 422, "invalid_request"),
        ({"wait_seconds": 1, "force": True}, 422, "invalid_request"),
    ],
)
def test_bad_swap_bodies_are_422_and_change_nothing(
    client: TestClient, lake: Lake, db_url: str, body: dict[str, Any], status: int, code: str
) -> None:
    _, rid, _ = ready_revision(client, lake)
    with unchanged(db_url):
        assert_error(client.post(f"{API}/revisions/{rid}/swap", json=body), status, code)
    assert revision(client, rid)["state"] == "ready"


def test_swapping_an_unknown_or_cancelled_revision_is_refused_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str
) -> None:
    _, rid, _ = ready_revision(client, lake)
    with unchanged(db_url):
        assert_error(swap(client, rid + 1), 404, "unknown_revision")
        assert_error(client.post(f"{API}/revisions/0/swap"), 422, "invalid_request")
        # beyond the id column's range (PostgreSQL's INTEGER): no revision, not a 500
        for method in ("GET", "DELETE", "POST"):
            path = f"{API}/revisions/{2**31}" + ("/swap" if method == "POST" else "")
            assert_error(client.request(method, path), 422, "invalid_request")
    assert client.delete(f"{API}/revisions/{rid}").status_code == 200
    with unchanged(db_url):
        assert_error(swap(client, rid), 409, "revision_cancelled")


def test_a_swap_supersedes_the_originals_waits_for_the_mirrors_and_renames_in_one_step(
    client: TestClient, lake: Lake
) -> None:
    version, rid, next_id = ready_revision(client, lake)
    tables = ",".join(AFFECTED)
    lease = consistent(client, tables, lease_seconds=3600).json()
    last = consistent(client, tables).json()
    next_id = catch_up(client, lake, rid, next_id)
    assert revision(client, rid)["state"] == "ready"
    # der opens a batch (its input moved) before the swap and is still running it
    lake.batch("feed", 10, "ods.feed", [10])
    lake.batch("src", 10, "ods.orders", [10])
    opened = client.post(f"{API}/jobs/der/batches/10/barrier").json()
    assert opened["committed"] is False

    r = swap(client, rid, wait_seconds=0)

    assert r.status_code == 202, r.text
    assert r.json()["state"] == "swapping"
    # the originals are superseded: no new batch, no next barrier
    for job, batch_id in (("der", 11), ("agg", 10)):
        body = assert_error(
            client.post(f"{API}/jobs/{job}/batches/{batch_id}/barrier"), 409, "superseded"
        )
        assert f"revision {rid}" in body["message"] and f"{job}__rev{rid}" in body["message"]
        assert_error(client.get(f"{API}/jobs/{job}/next-barrier"), 409, "superseded")
    # ... but the batch der opened before is answered again and its report recorded
    assert client.post(f"{API}/jobs/der/batches/10/barrier").json() == opened
    stamp = encode_stamp(opened["barrier"], "der", 10)
    late = lake.commit("dw.detail", stamp, opened["barrier"], [111], False)
    lake.report("der", 10, opened["barrier"], "dw.detail", late.snapshot_id)
    assert get_json(client, "/tables/dw.detail")["frontier"] == opened["barrier"]
    # the mirrors have not reached der's new frontier: still swapping, nothing renamed
    assert swap(client, rid, wait_seconds=0.3).status_code == 202
    assert get_json(client, "/tables/dw.detail")["writer"] == "der"
    assert "__rev" not in lake.catalog.load_table("dw.detail").metadata_location
    lake.clock.advance(SLOT)
    next_id = catch_up(client, lake, rid, next_id)

    mirror_locations = {
        t: lake.catalog.load_table(f"{t}__rev{rid}").metadata_location for t in AFFECTED
    }
    original_locations = {t: lake.catalog.load_table(t).metadata_location for t in AFFECTED}

    done = swap(client, rid, wait_seconds=10)

    assert done.status_code == 200, done.text
    assert done.json()["state"] == "swapped"
    for t in AFFECTED:
        now = get_json(client, f"/tables/{t}")
        pre = get_json(client, f"/tables/{t}__pre_rev{rid}")
        assert now["writer"] == f"{'der' if t == 'dw.detail' else 'agg'}__rev{rid}"
        assert pre["writer"] == ("der" if t == "dw.detail" else "agg")
        assert client.get(f"{API}/tables/{t}__rev{rid}").status_code == 404
        # the catalog switched in the same transaction
        assert lake.catalog.load_table(t).metadata_location == mirror_locations[t]
        pre_location = lake.catalog.load_table(f"{t}__pre_rev{rid}").metadata_location
        assert pre_location == original_locations[t]
    after = consistent(client, tables).json()
    assert after["barrier"] >= last["barrier"] >= version["barrier"]
    assert after["barrier"] >= opened["barrier"]  # not below anything the originals reached
    for t in AFFECTED:
        assert after["snapshots"][t] in snapshot_ids(lake, f"{t}__rev{rid}")
    # the revision jobs write the tables by their names now
    again = lake.batch("feed", 11, "ods.feed", [11])
    assert again.barrier > 0
    lake.batch("src", 11, "ods.orders", [11])
    nxt = lake.batch(f"der__rev{rid}", next_id + 10, "dw.detail", [299])
    assert get_json(client, "/tables/dw.detail")["frontier"] >= nxt.barrier
    assert rows_at(lake.catalog.load_table("dw.detail"), nxt.snapshot_id)[-1] == 299
    # the originals stay superseded, the old tables keep their history and the lease
    assert_error(client.post(f"{API}/jobs/der/batches/12/barrier"), 409, "superseded")
    plan = get_json(client, f"/tables/dw.detail__pre_rev{rid}/expirable")
    kept = {k["snapshot_id"]: k["reasons"] for k in plan["kept"]}
    assert lease["snapshots"]["dw.detail"] in kept, plan
    assert get_json(client, f"/revisions/{rid}")["state"] == "swapped"
    assert swap(client, rid).json()["state"] == "swapped"  # answered again


def test_a_reader_sees_every_consistent_version_all_old_or_all_new_during_a_swap(
    client: TestClient, lake: Lake
) -> None:
    _, rid, _ = ready_revision(client, lake)
    tables = ",".join(AFFECTED)
    old = set().union(*(snapshot_ids(lake, t) for t in AFFECTED))
    new = set().union(*(snapshot_ids(lake, f"{t}__rev{rid}") for t in AFFECTED))
    seen: list[tuple[int, list[int]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            r = consistent(client, tables)
            if r.status_code == 200:
                seen.append((r.json()["barrier"], list(r.json()["snapshots"].values())))

    reader = threading.Thread(target=sample)
    reader.start()
    try:
        assert wait_for(lambda: len(seen) >= 3)
        assert swap(client, rid, wait_seconds=10).json()["state"] == "swapped"
        count = len(seen)
        assert wait_for(lambda: len(seen) >= count + 3)
    finally:
        stop.set()
        reader.join()
    kinds = []
    for barrier, named in seen:
        if all(i in old - new for i in named):
            kinds.append("old")
        elif all(i in new - old for i in named):
            kinds.append("new")
        else:
            raise AssertionError(f"a mixed version at {barrier}: {named} (old {old}, new {new})")
    assert kinds[0] == "old" and kinds[-1] == "new"
    assert kinds == sorted(kinds, key=lambda k: k == "new")  # never back to old
    barriers = [b for b, _ in seen]
    assert barriers == sorted(barriers)


def test_expiring_the_swapped_in_table_never_deletes_the_old_tables_files(
    client: TestClient, lake: Lake
) -> None:
    w, _, rid, _ = ready_revision_with_history(client, lake)
    assert swap(client, rid, wait_seconds=10).json()["state"] == "swapped"
    for batch_id in range(20, 23):  # the new dw.detail moves on past its start snapshot
        lake.batch("feed", batch_id, "ods.feed", [batch_id])
        lake.batch("src", batch_id, "ods.orders", [batch_id])
        lake.batch(f"der__rev{rid}", batch_id, "dw.detail", [300 + batch_id], replace=True)

    result = expire(client, "dw.detail")

    assert w["d0"].snapshot_id in ids(result["snapshots"])  # its start snapshot went
    assert Path(local(w["d0"].path)).exists()  # the old table's file did not
    old = lake.catalog.load_table(f"dw.detail__pre_rev{rid}")
    assert rows_at(old, w["d0"].snapshot_id) == [100]
    assert all(f"/detail__rev{rid}/" in f["path"] for f in result["files"])  # its own only
    assert result["files"]


def test_with_another_catalog_the_tables_are_renamed_right_after_the_swap(
    db_url: str, clock: ManualClock, tmp_path: Path
) -> None:
    """A catalog outside the MetaService's database (its own SQLite file) is renamed
    through pyiceberg after the swap's commit."""
    properties = sql_catalog_properties(f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path))
    assert (
        swap_module.catalog_in_database(Settings(db_url=db_url, catalog_properties=properties))
        is None
    )
    elsewhere = open_catalog(properties["uri"], properties["warehouse"])
    try:
        with custom_client(
            db_url, clock, catalog_properties=properties, revision_ready_lag_ms=0
        ) as client:
            lake = lake_for(client, elsewhere, clock)
            _, rid, _ = ready_revision(client, lake)
            mirror_location = elsewhere.load_table(f"dw.detail__rev{rid}").metadata_location
            original_location = elsewhere.load_table("dw.detail").metadata_location

            done = swap(client, rid, wait_seconds=10)

            assert done.status_code == 200, done.text
            assert elsewhere.load_table("dw.detail").metadata_location == mirror_location
            renamed = elsewhere.load_table(f"dw.detail__pre_rev{rid}")
            assert renamed.metadata_location == original_location
            assert get_json(client, "/tables/dw.detail")["writer"] == f"der__rev{rid}"
            # swapping again answers it again, and renames nothing twice
            assert swap(client, rid).json()["state"] == "swapped"
            assert elsewhere.load_table("dw.detail").metadata_location == mirror_location
    finally:
        elsewhere.engine.dispose()  # type: ignore[attr-defined]
