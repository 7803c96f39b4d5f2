"""Tags on real Iceberg tables: POST/GET/DELETE /versions/tags, the expiry that keeps
tagged snapshots, retained tags that end, and ``metaservice tag|tags|untag``.

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
from pyiceberg.table.update import RemoveSnapshotsUpdate, SetSnapshotRefUpdate
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from metaservice.auth.schemas import Role
from metaservice.catalog_loading import open_catalog
from metaservice.cli import app as cli_app
from metaservice.client import ConflictError, MetaServiceClient, NotFoundError
from metaservice.clock import ManualClock
from metaservice.db import normalise_url
from metaservice.errors import Conflict
from metaservice.lifecycle.expiry import CatalogUnavailable, expire_table
from metaservice.settings import Settings
from metaservice.versions.tags import publish
from metaservice.versions.tags.schemas import TagRequest
from tests.faults.processes import ServiceProcess
from tests.metaservice import test_expiry
from tests.metaservice.helpers import (
    API,
    SLOT,
    assert_error,
    consistent,
    custom_client,
    get_json,
    put_job,
    unchanged,
)
from tests.metaservice.test_auth import bearer, issue
from tests.metaservice.test_expiry import (
    Lake,
    Written,
    expire,
    ids,
    lake_for,
    local,
    on_disk,
    reachable,
    rows_at,
    services,
    wait_for,
)
from tests.metaservice.test_layering import SERVER, SPARK, run_blocked

TABLES = ["dw.detail", "ods.orders"]

# test_expiry's fixtures: a warehouse folder, the service's settings with it, the jobs'
# catalog on the service's database, and the Lake of tables and jobs.
warehouse = test_expiry.warehouse
settings = test_expiry.settings
catalog = test_expiry.catalog
lake = test_expiry.lake


# -- helpers --------------------------------------------------------------------------------


def pipeline(client: TestClient, lake: Lake) -> dict[str, Written]:
    """``src`` writes ods.orders, ``der`` reads it and writes dw.detail:

    ods.orders: s0 [0], s1 [0, 1], s2 [20] (overwrite), s3 [3, 20]
    dw.detail:  d0 [100] at s1's barrier, d1 [100, 101], d2 [102] (overwrite)

    ``der`` has read up to s3, so its start position in ods.orders is s3."""
    put_job(client, "src", ["ods.orders"])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    w: dict[str, Written] = {}
    w["s0"] = lake.batch("src", 0, "ods.orders", [0])
    w["s1"] = lake.batch("src", 1, "ods.orders", [1])
    w["d0"] = lake.batch("der", 0, "dw.detail", [100])
    assert w["d0"].barrier == w["s1"].barrier
    return w


def more(lake: Lake, w: dict[str, Written]) -> dict[str, Written]:
    """The pipeline goes on past d0: s2, s3, d1, d2 (see :func:`pipeline`)."""
    w["s2"] = lake.batch("src", 2, "ods.orders", [20], replace=True)
    w["s3"] = lake.batch("src", 3, "ods.orders", [3])
    w["d1"] = lake.batch("der", 1, "dw.detail", [101])
    w["d2"] = lake.batch("der", 2, "dw.detail", [102], replace=True)
    assert w["d1"].barrier >= w["s3"].barrier
    return w


def tag(client: TestClient, name: str, tables: list[str] = TABLES, **body: Any) -> Any:
    return client.post(f"{API}/versions/tags", json={"name": name, "tables": tables, **body})


def created(client: TestClient, name: str, tables: list[str] = TABLES, **body: Any) -> Any:
    r = tag(client, name, tables, **body)
    assert r.status_code == 201, r.text
    return r.json()


def refs(catalog: Catalog, tables: list[str] = TABLES) -> dict[str, dict[str, tuple[Any, ...]]]:
    """Every branch and tag of the tables: name -> (type, snapshot id, max-ref-age)."""
    found = {}
    for name in tables:
        t = catalog.load_table(name)
        found[name] = {
            ref: (r.snapshot_ref_type.value, r.snapshot_id, r.max_ref_age_ms)
            for ref, r in t.refs().items()
        }
    return found


def tag_rows(db_url: str) -> list[tuple[Any, ...]]:
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT g.name, t.name, s.snapshot_id FROM version_tags g"
                        " JOIN version_tag_snapshots s ON s.tag_id = g.id"
                        " JOIN tables t ON t.id = s.table_id ORDER BY 1, 2"
                    )
                )
            ]
    finally:
        engine.dispose()


def rows_by_name(catalog: Catalog, table: str, name: str) -> list[int]:
    t = catalog.load_table(table)
    snapshot = t.snapshot_by_name(name)
    assert snapshot is not None, (table, name, t.refs())
    return rows_at(t, snapshot.snapshot_id)


def no_orphans(catalog: Catalog, warehouse: Path) -> None:
    """Every file a snapshot of either table reaches is on disk, and nothing else is."""
    live: set[str] = set()
    for name in TABLES:
        live |= reachable(catalog.load_table(name))
    files = {p for p in on_disk(warehouse) if not p.endswith(".metadata.json")}
    assert files == live


def made_ref(w: Written) -> tuple[str, int, None]:
    """The Iceberg ref a tag without retention makes on ``w``'s snapshot."""
    return ("tag", w.snapshot_id, None)


# -- a tag reads the version it came from -------------------------------------------------


def test_a_tag_reads_by_name_as_its_consistent_version_also_after_expiry(
    client: TestClient, lake: Lake, warehouse: Path
) -> None:
    w = pipeline(client, lake)
    version = consistent(client, ",".join(TABLES)).json()
    assert version["snapshots"] == {
        "ods.orders": w["s1"].snapshot_id,
        "dw.detail": w["d0"].snapshot_id,
    }

    made = created(client, "v1")

    assert made["barrier"] == version["barrier"] and made["snapshots"] == version["snapshots"]
    assert made["state"] == "published" and made["expires_ms"] is None
    assert refs(lake.catalog) == {
        "ods.orders": {"main": ("branch", w["s1"].snapshot_id, None), "v1": made_ref(w["s1"])},
        "dw.detail": {"main": ("branch", w["d0"].snapshot_id, None), "v1": made_ref(w["d0"])},
    }
    expected = {"ods.orders": [0, 1], "dw.detail": [100]}
    for table, snapshot in version["snapshots"].items():
        assert rows_by_name(lake.catalog, table, "v1") == expected[table]
        assert rows_at(lake.catalog.load_table(table), snapshot) == expected[table]

    more(lake, w)
    for table in TABLES:
        expire(client, table)

    # the tagged snapshots stay, and everything around them that nothing uses went
    orders = lake.catalog.load_table("ods.orders")
    detail = lake.catalog.load_table("dw.detail")
    assert [s.snapshot_id for s in orders.snapshots()] == [w["s1"].snapshot_id, w["s3"].snapshot_id]
    assert [s.snapshot_id for s in detail.snapshots()] == [w["d0"].snapshot_id, w["d2"].snapshot_id]
    for table in TABLES:
        assert rows_by_name(lake.catalog, table, "v1") == expected[table]
    assert Path(local(w["s0"].path)).exists(), "s1 reads batch 0's file"
    no_orphans(lake.catalog, warehouse)
    # readers go by the tag's name: the version itself is below the horizons now
    r = consistent(client, ",".join(TABLES), at_or_before=made["barrier"])
    assert_error(r, 409, "expired")
    assert get_json(client, "/versions/tags/v1") == made


def test_the_expiry_plan_keeps_a_tagged_snapshot_for_its_tag_and_nothing_around_it(
    client: TestClient, lake: Lake
) -> None:
    w = more(lake, pipeline(client, lake))
    # a second tag on the same snapshot of ods.orders, one of that table alone
    orders_only = consistent(client, "ods.orders", at_or_before=w["s1"].barrier).json()
    assert orders_only["snapshots"] == {"ods.orders": w["s1"].snapshot_id}
    created(client, "v1", at_or_before=w["d0"].barrier)
    created(client, "orders-v1", ["ods.orders"], at_or_before=w["s1"].barrier)

    plan = get_json(client, "/tables/ods.orders/expirable")

    assert ids(plan["expirable"]) == [w["s0"].snapshot_id, w["s2"].snapshot_id]
    kept = {k["snapshot_id"]: k["reasons"] for k in plan["kept"]}
    assert kept[w["s1"].snapshot_id] == ["tag orders-v1", "tag v1"]
    assert list(kept) == [w["s1"].snapshot_id, w["s3"].snapshot_id]
    assert plan["oldest_in_use"] == w["s3"].snapshot_id
    detail = get_json(client, "/tables/dw.detail/expirable")
    assert ids(detail["expirable"]) == [w["d1"].snapshot_id]
    assert detail["kept"][0]["reasons"] == ["tag v1"]

    # the reservation's horizon is the oldest snapshot in use, not the tagged one
    result = expire(client, "ods.orders")
    assert ids(result["snapshots"]) == [w["s0"].snapshot_id, w["s2"].snapshot_id]
    assert result["held_by_refs"] == [] and result["expiry_horizon"] == w["s3"].barrier


def test_a_table_empty_at_the_version_is_tagged_with_no_snapshot(
    client: TestClient, lake: Lake
) -> None:
    w = pipeline(client, lake)
    put_job(client, "quiet", ["ods.quiet"])  # a source that never wrote a row
    made = created(client, "v1", ["ods.orders", "ods.quiet"])
    assert made["snapshots"] == {"ods.orders": w["s1"].snapshot_id, "ods.quiet": None}
    assert lake.catalog.load_table("ods.orders").refs()["v1"].snapshot_id == w["s1"].snapshot_id
    assert get_json(client, "/versions/tags", table="ods.quiet")["total"] == 1


def test_at_or_before_tags_an_older_version(client: TestClient, lake: Lake) -> None:
    w = more(lake, pipeline(client, lake))
    made = created(client, "old", ["ods.orders"], at_or_before=w["s1"].barrier + SLOT // 2)
    assert made["barrier"] == w["s1"].barrier
    assert made["snapshots"] == {"ods.orders": w["s1"].snapshot_id}
    assert rows_by_name(lake.catalog, "ods.orders", "old") == [0, 1]


# -- listing, reading, removing -----------------------------------------------------------


def test_tags_are_listed_by_name_and_filtered_by_table(client: TestClient, lake: Lake) -> None:
    pipeline(client, lake)
    b = created(client, "b-tag")
    a = created(client, "a-tag", ["ods.orders"])

    page = get_json(client, "/versions/tags")
    assert (page["items"], page["total"]) == ([a, b], 2)
    assert get_json(client, "/versions/tags", table="dw.detail")["items"] == [b]
    assert get_json(client, "/versions/tags", limit=1, offset=1)["items"] == [b]
    assert get_json(client, "/versions/tags/a-tag") == a
    assert_error(client.get(f"{API}/versions/tags/c-tag"), 404, "not_found", field="name")
    r = client.get(f"{API}/versions/tags", params={"table": "ods.nope"})
    assert_error(r, 404, "not_found", field="table")


def test_untag_removes_the_iceberg_tags_and_the_record_and_expiry_then_takes_them(
    client: TestClient, lake: Lake, warehouse: Path, db_url: str
) -> None:
    w = more(lake, pipeline(client, lake))
    made = created(client, "v1", at_or_before=w["d0"].barrier)
    created(client, "v2")  # another tag stays as it was
    before = refs(lake.catalog)

    r = client.delete(f"{API}/versions/tags/v1")

    assert r.status_code == 200 and r.json() == made, r.text
    after = refs(lake.catalog)
    for table in TABLES:
        assert after[table] == {k: v for k, v in before[table].items() if k != "v1"}
    assert [name for name, *_ in tag_rows(db_url)] == ["v2", "v2"]
    assert_error(client.get(f"{API}/versions/tags/v1"), 404, "not_found")
    assert_error(client.delete(f"{API}/versions/tags/v1"), 404, "not_found")

    assert w["s1"].snapshot_id in ids(expire(client, "ods.orders")["snapshots"])
    assert w["d0"].snapshot_id in ids(expire(client, "dw.detail")["snapshots"])
    assert not Path(local(w["s0"].path)).exists()
    no_orphans(lake.catalog, warehouse)
    # the name is free again
    assert created(client, "v1")["barrier"] >= w["d2"].barrier


# -- retained tags end ---------------------------------------------------------------------


def test_a_retained_tag_ends_and_the_next_expiry_drops_it(
    client: TestClient, lake: Lake, clock: ManualClock, db_url: str, warehouse: Path
) -> None:
    w = more(lake, pipeline(client, lake))
    made = created(client, "week", at_or_before=w["d0"].barrier, retain_seconds=5)
    kept = created(client, "forever", ["dw.detail"], at_or_before=w["d0"].barrier)

    assert made["expires_ms"] == made["created_ms"] + 5000
    for table, found in refs(lake.catalog).items():
        kind, snapshot, max_age = found["week"]
        assert (kind, snapshot) == ("tag", made["snapshots"][table])
        # Iceberg counts a ref's age from its snapshot's commit: it ends the tag no sooner
        committed = lake.catalog.load_table(table).snapshot_by_id(snapshot).timestamp_ms
        assert max_age is not None and max_age >= 5000
        assert committed + max_age >= made["expires_ms"]
    assert [t["name"] for t in get_json(client, "/versions/tags")["items"]] == ["forever", "week"]

    clock.advance(5 * SLOT)  # it has ended

    assert [t["name"] for t in get_json(client, "/versions/tags")["items"]] == ["forever"]
    assert_error(client.get(f"{API}/versions/tags/week"), 404, "not_found")
    plan = get_json(client, "/tables/ods.orders/expirable")
    assert w["s1"].snapshot_id in ids(plan["expirable"])

    result = expire(client, "ods.orders")

    assert w["s1"].snapshot_id in ids(result["snapshots"]) and result["held_by_refs"] == []
    assert "week" not in refs(lake.catalog)["ods.orders"]
    assert [r[:2] for r in tag_rows(db_url)] == [("forever", "dw.detail"), ("week", "dw.detail")]
    # dw.detail's d0 is still tagged by "forever": the ended tag's ref goes, d0 stays
    expire(client, "dw.detail")
    assert refs(lake.catalog)["dw.detail"].keys() == {"main", "forever"}
    assert [r[:2] for r in tag_rows(db_url)] == [("forever", "dw.detail")]
    assert rows_by_name(lake.catalog, "dw.detail", "forever") == [100]
    assert kept == get_json(client, "/versions/tags/forever")
    no_orphans(lake.catalog, warehouse)


def test_an_ended_tags_name_can_be_used_again(
    client: TestClient, lake: Lake, clock: ManualClock, db_url: str
) -> None:
    pipeline(client, lake)
    first = created(client, "daily", retain_seconds=1)
    clock.advance(2 * SLOT)
    lake.batch("src", 2, "ods.orders", [2])
    d1 = lake.batch("der", 1, "dw.detail", [101])
    version = consistent(client, ",".join(TABLES)).json()
    assert version["snapshots"]["dw.detail"] == d1.snapshot_id

    again = created(client, "daily")

    assert again["snapshots"] == version["snapshots"] != first["snapshots"]
    assert again["expires_ms"] is None
    for table, found in refs(lake.catalog).items():
        assert found["daily"] == ("tag", again["snapshots"][table], None)
    assert [r[2] for r in tag_rows(db_url)] == [d1.snapshot_id, version["snapshots"]["ods.orders"]]


# -- bad input: 4xx and nothing changed -----------------------------------------------------


@pytest.mark.parametrize(
    "name", ["main", "MAIN", "-x", ".x", "a b", "a/b", "ü", "x" * 101, "", "v1\x00"]
)
def test_a_bad_name_is_422_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str, name: str
) -> None:
    pipeline(client, lake)
    before = refs(lake.catalog)
    # A NUL is refused for every field at the door, before the name's own rule.
    code = "invalid_character" if "\x00" in name else "invalid_tag_name"
    with unchanged(db_url):
        assert_error(tag(client, name), 422, code, field="name")
    assert refs(lake.catalog) == before


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"name": "v", "tables": ["ods.nope"]}, 404, "not_found", "tables"),
        ({"name": "v", "tables": ["ods.orders", "ods.nope"]}, 404, "not_found", "tables"),
        ({"name": "v", "tables": ["not a table"]}, 422, "invalid", "tables"),
        ({"name": "v", "tables": []}, 422, "invalid_request", "tables"),
        ({"name": "v", "tables": [" "]}, 422, "invalid", "tables"),
        ({"name": "v"}, 422, "invalid_request", "tables"),
        ({"tables": TABLES}, 422, "invalid_request", "name"),
        ({"name": "v", "tables": TABLES, "retain_seconds": 0}, 422, "invalid_request", None),
        ({"name": "v", "tables": TABLES, "retain_seconds": 2**62}, 422, "invalid_request", None),
        ({"name": "v", "tables": TABLES, "at_or_before": -1}, 422, "invalid_request", None),
        ({"name": "v", "tables": TABLES, "keep": True}, 422, "invalid_request", "keep"),
        ({"name": "v", "tables": TABLES, "at_or_before": 5}, 409, "no_consistent_version", None),
    ],
)
def test_bad_tag_requests_are_4xx_and_change_nothing(
    client: TestClient,
    lake: Lake,
    db_url: str,
    body: dict[str, Any],
    status: int,
    code: str,
    field: str | None,
) -> None:
    pipeline(client, lake)
    before = refs(lake.catalog)
    with unchanged(db_url):
        r = client.post(f"{API}/versions/tags", json=body)
        found = assert_error(r, status, code)
    if field is not None:
        assert found.get("field") == field, found
    assert refs(lake.catalog) == before


def test_no_consistent_version_yet_is_409_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str
) -> None:
    put_job(client, "src", ["ods.orders"])
    lake.batch("src", 0, "ods.orders", [0])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])  # has committed nothing
    before = refs(lake.catalog, ["ods.orders"])
    with unchanged(db_url):
        assert_error(tag(client, "v1"), 409, "no_consistent_version", field="tables")
    assert refs(lake.catalog, ["ods.orders"]) == before


def test_a_name_in_use_is_409_tag_exists_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str
) -> None:
    w = more(lake, pipeline(client, lake))
    created(client, "v1", at_or_before=w["d0"].barrier)
    # a branch and a tag someone made in Iceberg, outside the MetaService
    orders = lake.catalog.load_table("ods.orders")
    orders.manage_snapshots().create_branch(w["s2"].snapshot_id, "audit").commit()
    orders.manage_snapshots().create_tag(w["s3"].snapshot_id, "theirs").commit()
    before = refs(lake.catalog)
    with unchanged(db_url):
        for name, tables in [
            ("v1", TABLES),  # the same name, another (the latest) version
            ("v1", ["ods.orders"]),
            ("v1", ["dw.detail"]),
            ("audit", TABLES),
            ("theirs", ["ods.orders"]),
        ]:
            body = assert_error(tag(client, name, tables), 409, "tag_exists", field="name")
            assert name in body["message"]
    assert refs(lake.catalog) == before


def test_a_version_below_the_expiry_horizon_is_409_expired_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str
) -> None:
    w = more(lake, pipeline(client, lake))
    expire(client, "ods.orders")
    before = refs(lake.catalog)
    with unchanged(db_url):
        r = tag(client, "late", ["ods.orders"], at_or_before=w["s1"].barrier)
        assert_error(r, 409, "expired")
    assert refs(lake.catalog) == before


def test_bad_names_to_get_and_delete_are_refused(client: TestClient, db_url: str) -> None:
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        assert_error(client.get(f"{API}/versions/tags/main"), 422, "invalid_tag_name")
        assert_error(client.delete(f"{API}/versions/tags/a%20b"), 422, "invalid_tag_name")
        assert_error(client.delete(f"{API}/versions/tags/nope"), 404, "not_found")


# -- the Iceberg part fails half-way: nothing is left published ----------------------------


def failing_catalog(settings: Settings, warehouse: Path, fail_on: str) -> Any:
    """A loader of the jobs' catalog whose tag commit on table ``fail_on`` fails."""

    class Failing(SqlCatalog):
        def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
            if table.name()[-1] == fail_on.split(".")[-1] and any(
                isinstance(u, SetSnapshotRefUpdate) for u in updates
            ):
                raise OSError("the object store refused the write")
            return super().commit_table(table, requirements, updates)

    def load(_: Settings) -> Catalog:
        return Failing(
            "metaservice", uri=normalise_url(settings.db_url), warehouse=warehouse.as_uri()
        )

    return load


def test_a_failure_half_way_undoes_the_tags_made(
    client: TestClient, lake: Lake, settings: Settings, warehouse: Path, db_url: str
) -> None:
    pipeline(client, lake)
    svc = services(client)
    before = refs(lake.catalog)
    # tables are tagged in name order: dw.detail first, then ods.orders fails
    load = failing_catalog(settings, warehouse, "ods.orders")
    with pytest.raises(CatalogUnavailable) as failed:
        publish.create_tag(svc.db, svc.ctx, TagRequest(name="v1", tables=TABLES), load_catalog=load)
    assert "Nothing was published" in failed.value.message
    assert refs(lake.catalog) == before
    assert tag_rows(db_url) == []
    assert get_json(client, "/versions/tags")["total"] == 0
    # and the name is free: the same request through the service's own catalog works
    assert created(client, "v1")["state"] == "published"


def test_a_ref_made_elsewhere_meanwhile_is_409_and_only_the_tags_made_are_undone(
    client: TestClient, lake: Lake, settings: Settings, warehouse: Path, db_url: str
) -> None:
    """Another engine tags ods.orders as v1 (on another snapshot) just before the
    MetaService's own tag commit there: the request is refused, the tag it made on
    dw.detail is removed, and the other engine's tag stays."""
    w = pipeline(client, lake)
    svc = services(client)
    theirs = w["s0"].snapshot_id

    class Racing(SqlCatalog):
        raced = False

        def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
            if (
                not Racing.raced
                and table.name()[-1] == "orders"
                and any(isinstance(u, SetSnapshotRefUpdate) for u in updates)
            ):
                Racing.raced = True
                lake.catalog.load_table("ods.orders").manage_snapshots().create_tag(
                    theirs, "v1"
                ).commit()
            return super().commit_table(table, requirements, updates)

    def racing(_: Settings) -> Catalog:
        return Racing(
            "metaservice", uri=normalise_url(settings.db_url), warehouse=warehouse.as_uri()
        )

    with pytest.raises(Conflict) as refused:
        publish.create_tag(
            svc.db, svc.ctx, TagRequest(name="v1", tables=TABLES), load_catalog=racing
        )
    assert refused.value.code == "tag_exists" and "ods.orders" in refused.value.message
    assert Racing.raced
    found = refs(lake.catalog)
    assert "v1" not in found["dw.detail"]
    assert found["ods.orders"]["v1"] == ("tag", theirs, None)
    assert tag_rows(db_url) == []


def test_an_unreachable_catalog_is_503_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str
) -> None:
    pipeline(client, lake)
    svc = services(client)

    def unreachable(_: Settings) -> Catalog:
        return SqlCatalog("x", uri="postgresql+psycopg://nobody@127.0.0.1:9/none", warehouse="/x")

    with unchanged(db_url), pytest.raises(CatalogUnavailable) as failed:
        publish.create_tag(
            svc.db, svc.ctx, TagRequest(name="v1", tables=TABLES), load_catalog=unreachable
        )
    assert failed.value.status == 503


# -- tags and expiries running at the same time --------------------------------------------


def test_a_tag_on_a_snapshot_being_expired_is_refused_and_one_above_survives(
    client: TestClient, lake: Lake, settings: Settings, warehouse: Path
) -> None:
    """The expiry is paused just before its Iceberg commit, its reservation committed:
    a tag on a reserved snapshot is refused (409 expired), a tag on the latest version
    is made, and the expiry then leaves the snapshot that tag names."""
    w = more(lake, pipeline(client, lake))
    svc = services(client)
    reached, release = threading.Event(), threading.Event()

    class PausingCatalog(SqlCatalog):
        def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
            if any(isinstance(u, RemoveSnapshotsUpdate) for u in updates):
                reached.set()
                assert release.wait(30)
            return super().commit_table(table, requirements, updates)

    def pausing(_: Settings) -> Catalog:
        return PausingCatalog(
            "metaservice", uri=normalise_url(settings.db_url), warehouse=warehouse.as_uri()
        )

    out: list[Any] = []
    runner = threading.Thread(
        target=lambda: out.append(expire_table(svc.db, svc.ctx, "ods.orders", load_catalog=pausing))
    )
    runner.start()
    assert reached.wait(30), out
    try:
        for at in (w["s0"].barrier, w["s1"].barrier, w["s2"].barrier):
            r = tag(client, f"at-{at}", ["ods.orders"], at_or_before=at)
            assert_error(r, 409, "expired")
        latest = created(client, "latest", ["ods.orders"])
    finally:
        release.set()
        runner.join(30)
    assert ids([s.model_dump() for s in out[0].snapshots]) == [
        w["s0"].snapshot_id,
        w["s1"].snapshot_id,
        w["s2"].snapshot_id,
    ]
    assert latest["snapshots"] == {"ods.orders": w["s3"].snapshot_id}
    assert rows_by_name(lake.catalog, "ods.orders", "latest") == [3, 20]
    assert [t["name"] for t in get_json(client, "/versions/tags")["items"]] == ["latest"]


def test_an_expiry_waits_for_a_tag_being_recorded_and_keeps_its_snapshot(
    client: TestClient, lake: Lake
) -> None:
    w = more(lake, pipeline(client, lake))
    svc = services(client)
    inside, release = threading.Event(), threading.Event()
    from metaservice.versions.tags import service as tags

    def record(session: Any) -> Any:
        found = tags.record_tag(session, svc.ctx, "v1", ["ods.orders"], w["s1"].barrier, None)
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
    assert runner.is_alive(), "the reservation must wait for the tag's transaction"
    release.set()
    recorder.join(30)
    runner.join(30)
    assert ids([s.model_dump() for s in out[0].snapshots]) == [
        w["s0"].snapshot_id,
        w["s2"].snapshot_id,
    ]
    assert w["s1"].snapshot_id in {
        s.snapshot_id for s in lake.catalog.load_table("ods.orders").snapshots()
    }


# -- who may ------------------------------------------------------------------------------


def test_a_reader_lists_tags_but_cannot_create_or_delete_them(
    db_url: str, clock: ManualClock, catalog: Catalog, warehouse: Path
) -> None:
    with custom_client(db_url, clock, warehouse=str(warehouse), auth_required=True) as c:
        admin, reader, writer = (
            bearer(issue(db_url, role)) for role in (Role.ADMIN, Role.READER, Role.WRITER)
        )
        c.headers.update(admin)
        pipeline(c, lake_for(c, catalog, clock))
        created(c, "v1")
        del c.headers["Authorization"]
        before = refs(catalog)
        with unchanged(db_url):
            for who in (reader, writer):
                r = c.post(
                    f"{API}/versions/tags", json={"name": "v2", "tables": TABLES}, headers=who
                )
                assert "needs the admin role" in assert_error(r, 403, "forbidden")["message"]
                r = c.delete(f"{API}/versions/tags/v1", headers=who)
                assert_error(r, 403, "forbidden")
            assert c.get(f"{API}/versions/tags", headers=reader).json()["total"] == 1
            assert c.get(f"{API}/versions/tags/v1", headers=reader).status_code == 200
            assert_error(c.get(f"{API}/versions/tags"), 401, "unauthenticated")
        assert refs(catalog) == before


# -- the CLI and the client ------------------------------------------------------------------


def test_the_cli_tags_lists_and_untags_through_a_running_service(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'ms.db'}"
    with ServiceProcess(db_url, tmp_path / "service.log", workdir=tmp_path) as service:
        catalog = open_catalog(db_url, str(tmp_path / "warehouse"))
        with MetaServiceClient(service.url) as ms:
            ms.put_job("src", outputs=["ods.orders"])
            lake = Lake(
                catalog,
                report=ms.report_commit,
                ask=lambda job, b: ms.batch_barrier(job, b).barrier,
                clock=ManualClock(0),  # unused: the service's clock is the wall clock
            )
            s: list[Written] = []
            for i in range(2):
                # each batch in its own slot, once the one before is in a consistent version
                s.append(lake.batch("src", i, "ods.orders", [i]))
                assert wait_for(
                    lambda: (
                        ms.consistent_version(["ods.orders"]).snapshots["ods.orders"]
                        == s[-1].snapshot_id
                    )
                ), service.log()
        runner = CliRunner()
        url = ["--url", service.url]
        done = runner.invoke(cli_app, ["tag", "daily", "ods.orders", "--retain", "7d", *url])
        assert done.exit_code == 0, done.output
        assert "tag daily" in done.output and f"snapshot {s[1].snapshot_id}" in done.output
        done = runner.invoke(
            cli_app,
            ["tag", "v1", "ods.orders", "--at-or-before", str(s[0].barrier), "--json", *url],
        )
        assert done.exit_code == 0, done.output
        v1 = json.loads(done.stdout)
        assert v1["snapshots"] == {"ods.orders": s[0].snapshot_id}

        again = runner.invoke(cli_app, ["tag", "v1", "ods.orders", *url])
        assert again.exit_code == 1 and "tag_exists" in again.output, again.output
        bad = runner.invoke(cli_app, ["tag", "x", "ods.orders", "--retain", "soon", *url])
        assert bad.exit_code == 2 and "'soon' is not a duration" in bad.output, bad.output

        listed = runner.invoke(cli_app, ["tags", "--json", *url])
        assert listed.exit_code == 0, listed.output
        items = json.loads(listed.stdout)
        assert [t["name"] for t in items] == ["daily", "v1"]
        assert items[0]["expires_ms"] - items[0]["created_ms"] == 7 * 86_400_000
        table = runner.invoke(cli_app, ["tags", *url])
        assert table.exit_code == 0 and "2 tags" in table.output, table.output

        done = runner.invoke(cli_app, ["untag", "v1", *url])
        assert done.exit_code == 0 and "tag v1 removed" in done.output, done.output
        gone = runner.invoke(cli_app, ["untag", "v1", *url])
        assert gone.exit_code == 1 and "does not exist" in gone.output, gone.output
        assert set(catalog.load_table("ods.orders").refs()) == {"main", "daily"}

        with MetaServiceClient(service.url) as ms:
            assert [t.name for t in ms.all_tags(table="ods.orders")] == ["daily"]
            assert ms.get_tag("daily").snapshots == {"ods.orders": s[1].snapshot_id}
            with pytest.raises(ConflictError) as conflict:
                ms.create_tag("daily", ["ods.orders"])
            assert conflict.value.code == "tag_exists"
            with pytest.raises(NotFoundError):
                ms.delete_tag("v1")
            assert ms.delete_tag("daily").name == "daily"
        assert set(catalog.load_table("ods.orders").refs()) == {"main"}
        catalog.engine.dispose()  # type: ignore[attr-defined]


def test_the_tag_commands_need_no_server_install(tmp_path: Path) -> None:
    for command in ("tag", "tags", "untag"):
        done = run_blocked(
            'from metaservice.cli import app\napp(args=sys.argv[1:], prog_name="metaservice")',
            SERVER + SPARK,
            tmp_path,
            command,
            "--help",
        )
        assert done.returncode == 0, done.stderr
        assert f"Usage: metaservice {command}" in done.stdout
