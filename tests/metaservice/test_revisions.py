"""Revisions on real Iceberg tables: POST/GET/DELETE /revisions, the mirrors they make
(metadata only), the expiry that keeps their start snapshots, and ``metaservice revision``.

The tables, jobs and fixtures are test_expiry's: a pyiceberg SQL catalog in the
service's own database (SQLite or PostgreSQL) with a warehouse folder, one stamped
commit of real Parquet files per batch, barriers from the service and commits reported
to it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from metaservice.catalog_loading import open_catalog
from metaservice.cli import app as cli_app
from metaservice.client import ConflictError, MetaServiceClient, NotFoundError
from metaservice.clock import ManualClock
from metaservice.contract import encode_stamp
from metaservice.db import normalise_url
from metaservice.lifecycle.expiry import CatalogUnavailable, expire_table
from metaservice.revisions import mirrors
from metaservice.revisions import service as revisions
from metaservice.revisions.schemas import RevisionRequest
from metaservice.settings import Settings
from tests.faults.processes import ServiceProcess
from tests.metaservice import test_expiry
from tests.metaservice.helpers import (
    API,
    SLOT,
    assert_error,
    consistent,
    get_json,
    put_job,
    unchanged,
)
from tests.metaservice.test_expiry import (
    Lake,
    Written,
    expire,
    ids,
    local,
    on_disk,
    rows_at,
    services,
    wait_for,
)
from tests.metaservice.test_layering import SERVER, SPARK, run_blocked

ALL = ["dw.detail", "dws.summary", "ods.items", "ods.orders"]
CLOSURE = ["dw.detail", "dws.summary", "ods.orders"]  # ods.orders and what is downstream
IN_CATALOG = sorted([*ALL, "ods.feed"])  # the Iceberg tables pipeline makes

# test_expiry's fixtures: a warehouse folder, the service's settings with it, the jobs'
# catalog on the service's database, and the Lake of tables and jobs.
warehouse = test_expiry.warehouse
settings = test_expiry.settings
catalog = test_expiry.catalog
lake = test_expiry.lake


# -- helpers --------------------------------------------------------------------------------


def pipeline(client: TestClient, lake: Lake) -> tuple[dict[str, Written], dict[str, Any]]:
    """``src`` reads ods.feed (written by the source ``feed``) and writes ods.orders,
    ``der`` reads it and writes dw.detail, ``agg`` reads
    dw.detail and ods.items (written by ``items``) and writes dws.summary:

    ods.orders:  s0 [0], s1 [0, 1]            | then s2 [20] (overwrite), s3 [3, 20]
    ods.items:   i0 [500]                      |
    dw.detail:   d0 [100]                      | then d1 [100, 101], d2 [102] (overwrite)
    dws.summary: a0 [1000]                     | then a1 [1000, 1001]

    Returns the batches and the consistent version of every table after the first part
    (the barrier revisions start from): every table is exact there."""
    put_job(client, "feed", ["ods.feed"])  # a source: revisions re-run derived jobs only
    put_job(client, "src", ["ods.orders"], inputs=["ods.feed"])
    put_job(client, "items", ["ods.items"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    put_job(client, "agg", ["dws.summary"], inputs=["dw.detail", "ods.items"])
    w: dict[str, Written] = {}

    def orders(batch_id: int, rows: list[int], replace: bool = False) -> Written:
        lake.batch("feed", batch_id, "ods.feed", rows)  # what src's batch reads
        return lake.batch("src", batch_id, "ods.orders", rows, replace=replace)

    w["s0"] = orders(0, [0])
    w["s1"] = orders(1, [1])
    w["i0"] = lake.batch("items", 0, "ods.items", [500])
    w["d0"] = lake.batch("der", 0, "dw.detail", [100])
    w["a0"] = lake.batch("agg", 0, "dws.summary", [1000])
    version = consistent(client, ",".join(ALL)).json()
    assert version["snapshots"] == {
        "ods.orders": w["s1"].snapshot_id,
        "ods.items": w["i0"].snapshot_id,
        "dw.detail": w["d0"].snapshot_id,
        "dws.summary": w["a0"].snapshot_id,
    }, version
    w["s2"] = orders(2, [20], replace=True)
    w["d1"] = lake.batch("der", 1, "dw.detail", [101])
    w["s3"] = orders(3, [3])
    w["d2"] = lake.batch("der", 2, "dw.detail", [102], replace=True)
    w["a1"] = lake.batch("agg", 1, "dws.summary", [1001])
    assert w["a1"].barrier > version["barrier"]
    return w, version


def revise(client: TestClient, table: str, from_barrier: int) -> Any:
    return client.post(f"{API}/revisions", json={"table": table, "from_barrier": from_barrier})


def created(client: TestClient, table: str, from_barrier: int) -> dict[str, Any]:
    r = revise(client, table, from_barrier)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def catalog_tables(catalog: Catalog) -> list[str]:
    """Every table in the catalog, namespace.name, sorted."""
    return sorted(".".join(t) for ns in catalog.list_namespaces() for t in catalog.list_tables(ns))


def data_files(t: Table, snapshot_id: int | None = None) -> set[str]:
    """The data files a scan of the table (at the snapshot) reads."""
    return {task.file.file_path for task in t.scan(snapshot_id=snapshot_id).plan_files()}


def catalog_state(catalog: Catalog, warehouse: Path) -> tuple[list[str], dict[str, int]]:
    """What a refused request must leave as it was: the catalog's tables and every file."""
    return catalog_tables(catalog), on_disk(warehouse)


def revision_rows(db_url: str) -> list[tuple[Any, ...]]:
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT r.id, r.state, t.name, x.mirror FROM revisions r"
                        " JOIN revision_tables x ON x.revision_id = r.id"
                        " JOIN tables t ON t.id = x.table_id ORDER BY 1, 3"
                    )
                )
            ]
    finally:
        engine.dispose()


# -- a revision mirrors the closure at the barrier -----------------------------------------


def test_a_revision_mirrors_the_downstream_closure_at_the_barrier_without_copying_data(
    client: TestClient, lake: Lake, warehouse: Path
) -> None:
    _, version = pipeline(client, lake)
    b = version["barrier"]
    files_before = {p for p in on_disk(warehouse) if not p.endswith(".metadata.json")}

    made = created(client, "ods.orders", b)

    rid = made["id"]
    assert (made["table"], made["from_barrier"], made["state"]) == ("ods.orders", b, "planned")
    assert [m["table"] for m in made["tables"]] == CLOSURE  # not ods.items: it is upstream
    starts = {m["table"]: m["start_snapshot"] for m in made["tables"]}
    assert starts == {t: version["snapshots"][t] for t in CLOSURE}
    mirrors_of = {m["table"]: m["mirror"] for m in made["tables"]}
    assert mirrors_of == {t: f"{t}__rev{rid}" for t in CLOSURE}
    assert {m["table"]: m["writer"] for m in made["tables"]} == {
        "ods.orders": "src",
        "dw.detail": "der",
        "dws.summary": "agg",
    }
    for m in made["tables"]:
        assert m["frontier"] == b and m["original_frontier"] >= b
        assert m["lag_ms"] == m["original_frontier"] - b
    assert made["must_run"] == [
        {
            "job": "agg",
            "revision_job": f"agg__rev{rid}",
            "outputs": [{"table": "dws.summary", "mirror": mirrors_of["dws.summary"]}],
            # ods.items is not revised: agg reads the original
            "mirror_inputs": [{"table": "dw.detail", "mirror": mirrors_of["dw.detail"]}],
        },
        {
            "job": "der",
            "revision_job": f"der__rev{rid}",
            "outputs": [{"table": "dw.detail", "mirror": mirrors_of["dw.detail"]}],
            "mirror_inputs": [{"table": "ods.orders", "mirror": mirrors_of["ods.orders"]}],
        },
        {
            "job": "src",
            "revision_job": f"src__rev{rid}",
            "outputs": [{"table": "ods.orders", "mirror": mirrors_of["ods.orders"]}],
            "mirror_inputs": [],
        },
    ]

    # each mirror reads exactly its original's rows at the barrier, from the original's files
    expected = {"ods.orders": [0, 1], "dw.detail": [100], "dws.summary": [1000]}
    for table in CLOSURE:
        original = lake.catalog.load_table(table)
        mirror = lake.catalog.load_table(mirrors_of[table])
        start = starts[table]
        assert sorted(mirror.scan().to_arrow()["n"].to_pylist()) == expected[table]
        assert rows_at(original, start) == expected[table]
        assert data_files(mirror) == data_files(original, start)
        assert [s.snapshot_id for s in mirror.snapshots()] == [start]
        assert mirror.metadata.current_snapshot_id == start
        assert {n: r.snapshot_id for n, r in mirror.refs().items()} == {"main": start}
        assert mirror.metadata.table_uuid != original.metadata.table_uuid
        assert mirror.location() == original.location() + f"__rev{rid}"
        assert mirror.schema() == original.schema() and mirror.spec() == original.spec()
        # the original goes on as it was
        assert original.metadata.current_snapshot_id == lake.written[table][-1].snapshot_id
    # nothing but the mirrors' metadata files was written: no data file was copied
    files_after = {p for p in on_disk(warehouse) if not p.endswith(".metadata.json")}
    assert files_after == files_before
    assert sorted(catalog_tables(lake.catalog)) == sorted(IN_CATALOG + list(mirrors_of.values()))

    assert get_json(client, f"/revisions/{rid}") == made
    listed = get_json(client, "/revisions")
    assert (listed["items"], listed["total"]) == ([made], 1)


def test_revising_a_table_further_down_mirrors_only_its_own_closure(
    client: TestClient, lake: Lake
) -> None:
    _, version = pipeline(client, lake)
    made = created(client, "dw.detail", version["barrier"])
    assert [m["table"] for m in made["tables"]] == ["dw.detail", "dws.summary"]
    assert [j["job"] for j in made["must_run"]] == ["agg", "der"]
    assert made["must_run"][1]["mirror_inputs"] == []  # der reads the original ods.orders


def test_a_table_empty_at_the_barrier_gets_an_empty_mirror_with_its_schema(
    client: TestClient, lake: Lake
) -> None:
    put_job(client, "quiet", ["ods.quiet"])  # a source that never writes a row
    put_job(client, "late", ["ods.late"], inputs=["ods.quiet"])
    lake.table("ods.late")  # in the catalog, without a snapshot
    lake.clock.advance(2 * SLOT)
    # late is idle: the MetaService advances it, so it is exact there with no snapshot
    version = consistent(client, "ods.late").json()

    made = created(client, "ods.late", version["barrier"])

    assert made["tables"] == [
        {
            "table": "ods.late",
            "mirror": f"ods.late__rev{made['id']}",
            "start_snapshot": None,
            "writer": "late",
            "revision_job": f"late__rev{made['id']}",
            "frontier": version["barrier"],
            "original_frontier": made["tables"][0]["original_frontier"],
            "lag_ms": made["tables"][0]["lag_ms"],
        }
    ]
    mirror = lake.catalog.load_table(f"ods.late__rev{made['id']}")
    original = lake.catalog.load_table("ods.late")
    assert mirror.metadata.current_snapshot_id is None and mirror.snapshots() == []
    assert mirror.refs() == {}
    assert mirror.scan().to_arrow().num_rows == 0
    assert mirror.schema() == original.schema() and mirror.spec() == original.spec()


def test_a_writers_other_outputs_are_revised_with_the_table(client: TestClient, lake: Lake) -> None:
    """``split`` writes ods.a and ods.b in one batch; ``use_b`` reads ods.b. Revising
    ods.a re-runs ``split``, which rewrites ods.b too: ods.b and what reads it are
    affected."""
    put_job(client, "in", ["ods.in"])  # an idle source split reads
    put_job(client, "split", ["ods.a", "ods.b"], inputs=["ods.in"])
    lake.clock.advance(2 * SLOT)
    put_job(client, "use_b", ["dw.b"], inputs=["ods.b"])
    b = lake.ask("split", 0)
    written = {}
    for table, rows in (("ods.a", [1]), ("ods.b", [2])):
        written[table] = lake.commit(table, encode_stamp(b, "split", 0), b, rows, False)
        lake.report("split", 0, b, table, written[table].snapshot_id)
    lake.clock.advance(SLOT)
    lake.batch("use_b", 0, "dw.b", [20])
    version = consistent(client, "ods.a,ods.b,dw.b").json()

    made = created(client, "ods.a", version["barrier"])

    assert [m["table"] for m in made["tables"]] == ["dw.b", "ods.a", "ods.b"]
    assert [(j["job"], [i["table"] for i in j["mirror_inputs"]]) for j in made["must_run"]] == [
        ("split", []),
        ("use_b", ["ods.b"]),
    ]
    assert [o["table"] for o in made["must_run"][0]["outputs"]] == ["ods.a", "ods.b"]
    for table in ("ods.a", "ods.b"):
        mirror = lake.catalog.load_table(f"{table}__rev{made['id']}")
        assert mirror.scan().to_arrow()["n"].to_pylist() == written[table].rows


# -- bad input: 4xx and nothing changed, in the database and in the catalog ----------------


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"table": "ods.nope", "from_barrier": 0}, 404, "not_found", "table"),
        ({"table": "not a table", "from_barrier": 0}, 422, "invalid", "table"),
        ({"table": "ods.orders"}, 422, "invalid_request", "from_barrier"),
        ({"from_barrier": 0}, 422, "invalid_request", "table"),
        ({"table": "ods.orders", "from_barrier": -1}, 422, "invalid_request", None),
        ({"table": "ods.orders", "from_barrier": 2**63}, 422, "invalid_request", None),
        ({"table": "ods.orders", "from_barrier": "soon"}, 422, "invalid_request", None),
        ({"table": "ods.orders", "from_barrier": 0, "swap": True}, 422, "invalid_request", "swap"),
        ({"table": "ods.orders", "from_barrier": 1}, 422, "off_grid", "from_barrier"),
    ],
)
def test_bad_revision_requests_are_4xx_and_change_nothing(
    client: TestClient,
    lake: Lake,
    db_url: str,
    warehouse: Path,
    body: dict[str, Any],
    status: int,
    code: str,
    field: str | None,
) -> None:
    pipeline(client, lake)
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        found = assert_error(client.post(f"{API}/revisions", json=body), status, code)
    if field is not None:
        assert found.get("field") == field, found
    assert catalog_state(lake.catalog, warehouse) == before


def test_barriers_the_tables_cannot_start_from_are_409_and_change_nothing(
    client: TestClient, lake: Lake, db_url: str, warehouse: Path
) -> None:
    w, version = pipeline(client, lake)
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        # no table has reached it: its state there is not final
        r = revise(client, "ods.orders", version["barrier"] + 1000 * SLOT)
        assert "not final" in assert_error(r, 409, "not_reached", field="from_barrier")["message"]
        # der's first batch spans s1's barrier: at s1, dw.detail's only snapshot also
        # holds rows from after it, so dw.detail is not exact there
        assert w["d0"].barrier > w["s1"].barrier
        r = revise(client, "ods.orders", w["s1"].barrier)
        body = assert_error(r, 409, "not_exact", field="from_barrier")
        assert "dw.detail" in body["message"]
    assert catalog_state(lake.catalog, warehouse) == before


def test_a_table_with_no_writer_is_409_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str, warehouse: Path
) -> None:
    _, version = pipeline(client, lake)
    put_job(client, "reader", ["dw.audit"], inputs=["ods.orphan"])  # nobody writes ods.orphan
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        r = revise(client, "ods.orphan", version["barrier"])
        assert "ods.orphan" in assert_error(r, 409, "no_writer", field="table")["message"]
    assert catalog_state(lake.catalog, warehouse) == before


def test_an_expired_barrier_is_409_expired_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str, warehouse: Path
) -> None:
    w, version = pipeline(client, lake)
    expired = expire(client, "ods.orders")
    assert w["s1"].snapshot_id in ids(expired["snapshots"])
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        r = revise(client, "ods.orders", version["barrier"])
        assert "expiry" in assert_error(r, 409, "expired", field="from_barrier")["message"]
    assert catalog_state(lake.catalog, warehouse) == before
    # a later version, at or above the horizon, is fine
    lake.batch("feed", 4, "ods.feed", [4])  # one more round past the horizon
    lake.batch("src", 4, "ods.orders", [4])
    lake.batch("der", 3, "dw.detail", [103])
    lake.batch("agg", 2, "dws.summary", [1002])
    later = consistent(client, ",".join(CLOSURE)).json()
    assert later["barrier"] >= expired["expiry_horizon"]
    made = created(client, "ods.orders", later["barrier"])
    assert {m["table"]: m["start_snapshot"] for m in made["tables"]} == later["snapshots"]


def test_an_affected_set_overlapping_an_active_revision_is_409_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str, warehouse: Path
) -> None:
    _, version = pipeline(client, lake)
    b = version["barrier"]
    first = created(client, "dw.detail", b)  # dw.detail, dws.summary
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        for table in ("ods.orders", "dw.detail", "dws.summary"):
            body = assert_error(revise(client, table, b), 409, "revision_overlaps", field="table")
            assert f"revision {first['id']}" in body["message"]
    assert catalog_state(lake.catalog, warehouse) == before
    # once it is cancelled, the tables are free again
    assert client.delete(f"{API}/revisions/{first['id']}").status_code == 200
    assert created(client, "ods.orders", b)["state"] == "planned"


def test_unknown_revisions_are_404(client: TestClient, lake: Lake, db_url: str) -> None:
    pipeline(client, lake)
    with unchanged(db_url):
        for r in (client.get(f"{API}/revisions/7"), client.delete(f"{API}/revisions/7")):
            assert_error(r, 404, "unknown_revision", field="revision_id")
        assert_error(client.get(f"{API}/revisions/0"), 422, "invalid_request")
        assert_error(client.delete(f"{API}/revisions/x"), 422, "invalid_request")


# -- all or nothing --------------------------------------------------------------------------


def failing_catalog(settings: Settings, warehouse: Path, fail_on: str) -> Any:
    """A loader of the jobs' catalog whose registration of ``fail_on``'s mirror fails."""

    class Failing(SqlCatalog):
        def register_table(
            self, identifier: Any, metadata_location: str, overwrite: bool = False
        ) -> Any:
            if str(identifier).startswith(fail_on + "__rev"):
                raise OSError("the object store refused the write")
            return super().register_table(identifier, metadata_location, overwrite)

    def load(_: Settings) -> Catalog:
        return Failing(
            "metaservice", uri=normalise_url(settings.db_url), warehouse=warehouse.as_uri()
        )

    return load


def test_a_failure_half_way_drops_the_mirrors_made_and_records_nothing(
    client: TestClient, lake: Lake, settings: Settings, warehouse: Path, db_url: str
) -> None:
    _, version = pipeline(client, lake)
    svc = services(client)
    before = catalog_state(lake.catalog, warehouse)
    # mirrors are made in table order: dw.detail's, dws.summary's, then ods.orders' fails
    load = failing_catalog(settings, warehouse, "ods.orders")
    request = RevisionRequest(table="ods.orders", from_barrier=version["barrier"])
    with pytest.raises(CatalogUnavailable) as failed:
        mirrors.create_revision(svc.db, svc.ctx, request, load_catalog=load)
    assert "Nothing was changed" in failed.value.message
    assert catalog_state(lake.catalog, warehouse) == before  # metadata files deleted too
    assert revision_rows(db_url) == []
    assert get_json(client, "/revisions")["total"] == 0
    for table in CLOSURE:  # no start snapshot is kept for it
        kept = get_json(client, f"/tables/{table}/expirable")["kept"]
        assert not any("revision" in why for k in kept for why in k["reasons"]), kept
    # and the same request through the service's own catalog works
    assert created(client, "ods.orders", version["barrier"])["state"] == "planned"


def test_a_mirror_name_taken_in_the_catalog_is_409_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str, warehouse: Path
) -> None:
    _, version = pipeline(client, lake)
    lake.table("dws.summary__rev1")  # someone made a table of the first mirror's name
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        r = revise(client, "ods.orders", version["barrier"])
        assert "dws.summary__rev1" in assert_error(r, 409, "mirror_exists")["message"]
    assert catalog_state(lake.catalog, warehouse) == before


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_drops_the_mirrors_and_the_originals_files_stay_readable(
    client: TestClient, lake: Lake, warehouse: Path
) -> None:
    _, version = pipeline(client, lake)
    made = created(client, "ods.orders", version["barrier"])
    files = {p for p in on_disk(warehouse) if not p.endswith(".metadata.json")}

    r = client.delete(f"{API}/revisions/{made['id']}")

    assert r.status_code == 200, r.text
    cancelled = r.json()
    assert cancelled["state"] == "cancelled"
    assert cancelled["tables"] == made["tables"] and cancelled["must_run"] == made["must_run"]
    assert catalog_tables(lake.catalog) == IN_CATALOG
    for m in made["tables"]:
        with pytest.raises(NoSuchTableError):
            lake.catalog.load_table(m["mirror"])
    # no file was deleted: the mirrors read the originals' files, which read as before
    assert {p for p in on_disk(warehouse) if not p.endswith(".metadata.json")} == files
    for table in CLOSURE:
        original = lake.catalog.load_table(table)
        start = next(m["start_snapshot"] for m in made["tables"] if m["table"] == table)
        assert rows_at(original, start) == next(
            x.rows for x in lake.written[table] if x.snapshot_id == start
        )
        assert rows_at(original, lake.written[table][-1].snapshot_id) == (
            lake.written[table][-1].rows
        )
        assert original.metadata.current_snapshot_id == lake.written[table][-1].snapshot_id
    # cancelling again answers the same cancelled revision
    again = client.delete(f"{API}/revisions/{made['id']}")
    assert again.status_code == 200 and again.json() == cancelled
    assert get_json(client, f"/revisions/{made['id']}") == cancelled


# -- expiry ----------------------------------------------------------------------------------


def test_expiry_keeps_the_start_snapshot_while_the_revision_is_pending_and_not_after_cancel(
    client: TestClient, lake: Lake, warehouse: Path
) -> None:
    w, version = pipeline(client, lake)
    made = created(client, "ods.orders", version["barrier"])
    rid = made["id"]
    mirror = f"ods.orders__rev{rid}"
    assert version["snapshots"]["ods.orders"] == w["s1"].snapshot_id

    # s1 is the oldest in use now: s0 may go, s2 (newer than it) stays for now
    plan = get_json(client, "/tables/ods.orders/expirable")
    assert ids(plan["expirable"]) == [w["s0"].snapshot_id]
    kept = {k["snapshot_id"]: k["reasons"] for k in plan["kept"]}
    assert kept[w["s1"].snapshot_id] == [f"revision {rid}"]
    assert plan["oldest_in_use"] == w["s1"].snapshot_id
    result = expire(client, "ods.orders")
    assert ids(result["snapshots"]) == [w["s0"].snapshot_id]
    assert result["expiry_horizon"] == w["s1"].barrier
    # every file the mirror reads is still there (s0's file too: s1 reads it)
    m = lake.catalog.load_table(mirror)
    assert sorted(m.scan().to_arrow()["n"].to_pylist()) == [0, 1]
    assert all(Path(local(p)).exists() for p in data_files(m))
    assert Path(local(w["s0"].path)).exists()
    dw_plan = get_json(client, "/tables/dw.detail/expirable")
    assert {k["snapshot_id"]: k["reasons"] for k in dw_plan["kept"]}[w["d0"].snapshot_id] == [
        f"revision {rid}"
    ]

    assert client.delete(f"{API}/revisions/{rid}").status_code == 200

    plan = get_json(client, "/tables/ods.orders/expirable")
    assert ids(plan["expirable"]) == [w["s1"].snapshot_id, w["s2"].snapshot_id]
    result = expire(client, "ods.orders")
    assert ids(result["snapshots"]) == [w["s1"].snapshot_id, w["s2"].snapshot_id]
    assert not Path(local(w["s0"].path)).exists()  # nothing reads it any more
    current = lake.catalog.load_table("ods.orders")
    assert rows_at(current, w["s3"].snapshot_id) == [3, 20]


def test_expiring_a_mirror_of_an_active_revision_is_409_revision_pending(
    client: TestClient, lake: Lake, db_url: str, warehouse: Path
) -> None:
    _, version = pipeline(client, lake)
    made = created(client, "ods.orders", version["barrier"])
    before = catalog_state(lake.catalog, warehouse)
    with unchanged(db_url):
        for m in made["tables"]:
            r = client.post(f"{API}/tables/{m['mirror']}/expire", json=None)
            body = assert_error(r, 409, "revision_pending", field="table")
            assert f"revision {made['id']}" in body["message"]
    assert catalog_state(lake.catalog, warehouse) == before
    client.delete(f"{API}/revisions/{made['id']}")
    # cancelled: the mirror is gone, and the name is just an unknown table
    r = client.post(f"{API}/tables/{made['tables'][0]['mirror']}/expire", json=None)
    assert_error(r, 404, "not_found")


def test_an_expiry_waits_for_a_revision_being_recorded_and_keeps_its_start_snapshot(
    client: TestClient, lake: Lake
) -> None:
    w, version = pipeline(client, lake)
    svc = services(client)
    inside, release = threading.Event(), threading.Event()

    def record(session: Any) -> Any:
        found = revisions.record_revision(session, svc.ctx, "ods.orders", version["barrier"])
        inside.set()
        assert release.wait(30)
        return found

    recorder = threading.Thread(target=lambda: svc.db.write(record))
    recorder.start()
    assert inside.wait(30)
    out: list[Any] = []
    runner = threading.Thread(
        target=lambda: out.append(expire_table(svc.db, svc.ctx, "ods.orders"))
    )
    runner.start()
    runner.join(0.5)
    assert runner.is_alive(), "the reservation must wait for the revision's transaction"
    release.set()
    recorder.join(30)
    runner.join(30)
    # the revision is still 'creating' (no mirror made here): its start snapshot is kept
    assert ids([s.model_dump() for s in out[0].snapshots]) == [w["s0"].snapshot_id]
    plan = get_json(client, "/tables/ods.orders/expirable")
    kept = {k["snapshot_id"]: k["reasons"] for k in plan["kept"]}
    assert kept[w["s1"].snapshot_id] == ["revision 1"]
    assert get_json(client, "/revisions/1")["state"] == "creating"
    # a DELETE finishes a revision left 'creating'
    assert client.delete(f"{API}/revisions/1").json()["state"] == "cancelled"
    assert w["s1"].snapshot_id in ids(get_json(client, "/tables/ods.orders/expirable")["expirable"])


# -- the CLI and the client ----------------------------------------------------------------


def test_the_cli_creates_follows_and_cancels_a_revision_through_a_running_service(
    tmp_path: Path,
) -> None:
    db_url = f"sqlite:///{tmp_path / 'ms.db'}"
    with ServiceProcess(db_url, tmp_path / "service.log", workdir=tmp_path) as service:
        catalog = open_catalog(db_url, str(tmp_path / "warehouse"))
        with MetaServiceClient(service.url) as ms:
            ms.put_job("in", outputs=["ods.in"])  # an idle source
            ms.put_job("src", outputs=["ods.orders"], inputs=["ods.in"])
            lake = Lake(
                catalog,
                report=ms.report_commit,
                ask=lambda job, b: ms.batch_barrier(job, b).barrier,
                clock=ManualClock(0),  # unused: the service's clock is the wall clock
            )
            s = lake.batch("src", 0, "ods.orders", [0])
            assert wait_for(
                lambda: ms.get_table("ods.orders").frontier >= s.barrier  # type: ignore[operator]
            ), service.log()
        runner = CliRunner()
        url = ["--url", service.url]
        done = runner.invoke(
            cli_app,
            ["revision", "create", "ods.orders", "--from-barrier", str(s.barrier), "--json", *url],
        )
        assert done.exit_code == 0, done.output
        made = json.loads(done.stdout)
        assert made["tables"][0]["start_snapshot"] == s.snapshot_id
        mirror = made["tables"][0]["mirror"]
        assert sorted(catalog.load_table(mirror).scan().to_arrow()["n"].to_pylist()) == [0]

        again = runner.invoke(
            cli_app, ["revision", "create", "ods.orders", "--from-barrier", str(s.barrier), *url]
        )
        assert again.exit_code == 1 and "revision_overlaps" in again.output, again.output
        shown = runner.invoke(cli_app, ["revision", "status", str(made["id"]), *url])
        assert shown.exit_code == 0 and mirror in shown.output, shown.output
        # ready while the original has not moved past the barrier; the service's advancer
        # may already have moved it (its input is idle), and then the revision job has
        # slots to catch up: planned
        assert "ready" in shown.output or "planned" in shown.output, shown.output
        listed = runner.invoke(cli_app, ["revision", "status", "--json", *url])
        assert listed.exit_code == 0, listed.output
        assert [r["id"] for r in json.loads(listed.stdout)] == [made["id"]]

        done = runner.invoke(cli_app, ["revision", "cancel", str(made["id"]), *url])
        assert done.exit_code == 0 and "cancelled" in done.output, done.output
        gone = runner.invoke(cli_app, ["revision", "status", "99", *url])
        assert gone.exit_code == 1 and "does not exist" in gone.output, gone.output

        with MetaServiceClient(service.url) as ms:
            assert ms.get_revision(made["id"]).state == "cancelled"
            assert ms.cancel_revision(made["id"]).state == "cancelled"
            with pytest.raises(NotFoundError) as missing:
                ms.get_revision(99)
            assert missing.value.code == "unknown_revision"
            with pytest.raises(ConflictError) as conflict:
                ms.create_revision("ods.orders", s.barrier + 10**9)
            assert conflict.value.code == "not_reached"
            again_made = ms.create_revision("ods.orders", s.barrier)
            assert [r.id for r in ms.all_revisions()] == [again_made.id, made["id"]]
        with pytest.raises(NoSuchTableError):
            catalog.load_table(mirror)
        catalog.engine.dispose()  # type: ignore[attr-defined]


def test_the_revision_commands_need_no_server_install(tmp_path: Path) -> None:
    for command in ("create", "status", "swap", "cancel"):
        done = run_blocked(
            'from metaservice.cli import app\napp(args=sys.argv[1:], prog_name="metaservice")',
            SERVER + SPARK,
            tmp_path,
            "revision",
            command,
            "--help",
        )
        assert done.returncode == 0, done.stderr
        assert f"Usage: metaservice revision {command}" in done.stdout
