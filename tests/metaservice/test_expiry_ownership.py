"""What an expiry may touch: a dry run decides as the run does (ended tags included), the
clean-up of ended tags never takes a tag made again under the same name, and only files
the service owns are deleted (under the table's location or a log spill location).

The tables, jobs and fixtures are test_expiry's (a pyiceberg SQL catalog in the service's
own database, SQLite or PostgreSQL, one stamped commit of real Parquet files per batch).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.contract import encode_log_files, encode_stamp
from metaservice.settings import Settings
from metaservice.versions.tags import iceberg as tag_iceberg
from metaservice.versions.tags import publish
from metaservice.versions.tags.repository import TaggedSnapshot
from metaservice.versions.tags.schemas import TagRequest
from tests.metaservice import test_expiry
from tests.metaservice.helpers import API, SLOT, barrier, commit, get_json, put_job
from tests.metaservice.test_expiry import Lake, expire, ids, lake_for, local, services
from tests.metaservice.test_tags import refs, rows_by_name, tag_rows

warehouse = test_expiry.warehouse
catalog = test_expiry.catalog


@pytest.fixture
def spill(tmp_path: Path) -> Path:
    """An external log service's spill folder (its --spill-dir)."""
    return tmp_path / "spill"


@pytest.fixture
def settings(db_url: str, warehouse: Path, spill: Path) -> Settings:
    return Settings(db_url=db_url, warehouse=str(warehouse), log_spill_locations=[str(spill)])


@pytest.fixture
def client(settings: Settings, clock: ManualClock) -> Iterator[TestClient]:
    with TestClient(create_app(settings, clock), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def lake(client: TestClient, catalog: Catalog, clock: ManualClock) -> Lake:
    return lake_for(client, catalog, clock)


def three_batches(client: TestClient, lake: Lake) -> list[Any]:
    put_job(client, "src", ["ods.orders"])
    return [lake.batch("src", i, "ods.orders", [i]) for i in range(3)]


def tag(client: TestClient, name: str, **body: Any) -> dict[str, Any]:
    r = client.post(f"{API}/versions/tags", json={"name": name, "tables": ["ods.orders"], **body})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


# -- a dry run decides as the run does -----------------------------------------------------


def test_a_dry_run_lists_the_snapshot_of_an_ended_tag_that_the_run_then_removes(
    client: TestClient, lake: Lake, clock: ManualClock
) -> None:
    w = three_batches(client, lake)
    tag(client, "t1", at_or_before=w[0].barrier, retain_seconds=5)
    clock.advance(10_000)  # the retained tag has ended; its Iceberg tag is still there
    assert "t1" in refs(lake.catalog, ["ods.orders"])["ods.orders"]

    dry = expire(client, "ods.orders", dry_run=True)
    assert "t1" in refs(lake.catalog, ["ods.orders"])["ods.orders"], "a dry run changes nothing"
    real = expire(client, "ods.orders")

    assert ids(dry["snapshots"]) == [w[0].snapshot_id, w[1].snapshot_id]
    assert dry["held_by_refs"] == []
    for key in ("snapshots", "held_by_refs", "files", "snapshots_removed", "files_removed"):
        assert real[key] == dry[key], key
    assert [s.snapshot_id for s in lake.catalog.load_table("ods.orders").snapshots()] == [
        w[2].snapshot_id
    ]


# -- the clean-up of ended tags takes no tag made again ------------------------------------


@pytest.mark.parametrize("when", ["after the read", "during the removal"])
def test_a_tag_made_again_while_an_expiry_drops_its_ended_namesake_stays_with_its_snapshot(
    client: TestClient,
    lake: Lake,
    clock: ManualClock,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """The expiry reads the ended tag 'daily', then 'daily' is published again on the same
    snapshot (after the read, or while the expiry removes the old Iceberg tag): the new
    tag keeps its record, its Iceberg tag and its snapshot."""
    w = three_batches(client, lake)
    tag(client, "daily", at_or_before=w[1].barrier, retain_seconds=5)
    clock.advance(10_000)  # it has ended
    svc = services(client)
    made: list[Any] = []
    started: list[bool] = []

    def publish_again() -> None:
        if not started:  # once (the publish removes the ended tag's Iceberg tag itself)
            started.append(True)
            request = TagRequest(name="daily", tables=["ods.orders"], at_or_before=w[1].barrier)
            made.append(publish.create_tag(svc.db, svc.ctx, request))

    if when == "after the read":
        read = svc.db.read

        def read_then_publish(fn: Any, *args: Any) -> Any:
            found = read(fn, *args)
            if found and isinstance(found, list) and isinstance(found[0], TaggedSnapshot):
                publish_again()  # right after the expiry read the ended tags
            return found

        monkeypatch.setattr(svc.db, "read", read_then_publish)
    else:
        remove = tag_iceberg.remove_tag

        def publish_then_remove(*args: Any) -> Any:
            publish_again()
            return remove(*args)

        monkeypatch.setattr(tag_iceberg, "remove_tag", publish_then_remove)

    result = expire(client, "ods.orders")
    monkeypatch.undo()

    assert made and made[0].state == "published"
    assert w[1].snapshot_id not in ids(result["snapshots"])
    assert get_json(client, "/versions/tags/daily")["snapshots"] == {"ods.orders": w[1].snapshot_id}
    assert refs(lake.catalog, ["ods.orders"])["ods.orders"]["daily"] == (
        "tag",
        w[1].snapshot_id,
        None,
    )
    assert rows_by_name(lake.catalog, "ods.orders", "daily") == [0, 1]
    assert tag_rows(db_url) == [("daily", "ods.orders", w[1].snapshot_id)]
    # and the next expiry keeps it too
    assert w[1].snapshot_id not in ids(expire(client, "ods.orders")["snapshots"])
    assert rows_by_name(lake.catalog, "ods.orders", "daily") == [0, 1]


# -- only files the service owns are deleted -----------------------------------------------


def test_expiry_deletes_only_files_under_the_table_or_a_log_spill_location(
    client: TestClient,
    lake: Lake,
    tmp_path: Path,
    spill: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A snapshot's summary lists log files anywhere (whoever commits to the table writes
    it): those outside the table's location and ``<spill location>/<table>`` are
    refused, logged and listed; the owned ones are deleted, however they are spelled."""
    table = lake.table("ods.orders")
    location = local(table.location())
    outside = tmp_path / "outside"
    outside.mkdir()

    def file(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"spilled rows")
        return path

    victim = file(outside / "victim.txt")
    climbing = file(outside / "climbing.txt")
    other_table = file(spill / "ods.other" / "0-0-0.arrow")
    under_table = file(Path(location) / "log" / "0-0-1.arrow")
    in_spill = file(spill / "ods.orders" / "0-0-2.arrow")
    owned = {
        under_table.as_uri(): under_table,
        str(in_spill): in_spill,  # a plain path: the same place as file://...
    }
    hostile: dict[str, Path] = {
        str(victim): victim,
        f"{table.location()}/log/../../../../outside/climbing.txt": climbing,
        f"{table.location()}/log/%2e%2e/%2e%2e/%2e%2e/%2e%2e/outside/climbing.txt": climbing,
        other_table.as_uri(): other_table,
        f"file://elsewhere{victim}": victim,
    }
    put_job(client, "src", ["ods.orders"])
    written = []
    for batch in range(2):
        b = barrier(client, "src", batch)["barrier"]
        listed = [*owned, *hostile] if batch == 0 else []
        stamp = {**encode_stamp(b, "src", batch), **encode_log_files(listed)}
        w = lake.commit("ods.orders", stamp, b, [batch], False)
        commit(client, "src", batch, b, "ods.orders", w.snapshot_id)
        lake.clock.advance(SLOT)
        written.append(w)

    dry = expire(client, "ods.orders", dry_run=True)
    with caplog.at_level(logging.WARNING, logger="metaservice.lifecycle.expiry"):
        result = expire(client, "ods.orders")

    assert ids(result["snapshots"]) == [written[0].snapshot_id]
    for answer in (dry, result):
        assert {f["path"] for f in answer["files"] if f["kind"] == "log"} == set(owned)
        refused = answer["refused_files"]
        assert {f["path"] for f in refused} == set(hostile)
        assert {(f["kind"], f["snapshot_id"]) for f in refused} == {("log", written[0].snapshot_id)}
    assert not any(p.exists() for p in owned.values())
    assert all(p.exists() for p in hostile.values())
    assert other_table.read_bytes() == b"spilled rows"
    for path in hostile:
        assert any(
            path in r.getMessage()
            and "ods.orders" in r.getMessage()
            and str(written[0].snapshot_id) in r.getMessage()
            for r in caplog.records
        ), path


def test_the_expire_command_prints_the_files_it_left(capsys: pytest.CaptureFixture[str]) -> None:
    from metaservice.cli_output import Printer
    from metaservice.lifecycle import cli
    from metaservice.lifecycle.schemas import ExpiryResult

    result = ExpiryResult.model_validate(
        {
            "table": "ods.orders",
            "dry_run": False,
            "snapshots": [{"snapshot_id": 7, "barrier": 1, "batch_id": 0}],
            "files": [],
            "refused_files": [{"path": "/etc/passwd", "kind": "log", "snapshot_id": 7}],
            "snapshots_removed": 1,
            "files_removed": 0,
            "bytes_freed": 0,
            "expiry_horizon": 2,
        }
    )
    cli._print(Printer(), result)
    printed = capsys.readouterr().out
    assert "left 1 files outside the table's location and the log spill locations" in printed
    assert "refused log /etc/passwd (snapshot 7)" in printed


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("file:///wh/t/data/a.parquet", True),
        ("/wh/t/data/a.parquet", True),
        ("file:/wh/t/data/a.parquet", True),
        ("/wh/t/./data//a.parquet", True),
        ("/wh/t", False),
        ("/wh/t/", False),
        ("/wh/tt/a.parquet", False),
        ("/wh/t/../u/a.parquet", False),
        ("/wh/t/%2e%2e/u/a.parquet", False),
        ("file://host/wh/t/a.parquet", False),
        ("file://localhost/wh/t/a.parquet", False),
        ("/wh/t/a\x00.parquet", False),
        ("s3://bucket/wh/t/a.parquet", True),
        ("s3a://bucket/wh/t/a.parquet", True),
        ("s3://bucket/wh/t/../../x", False),
        ("s3://bucket/wh/t/../t/a.parquet", False),
        ("s3://bucket//wh/t/a.parquet", False),
        ("s3://bucket/wh/t//a.parquet", False),
        ("s3://bucket/wh/t/./a.parquet", False),
        ("/wh/t/link/../a.parquet", False),
        ("s3://other/wh/t/a.parquet", False),
        ("gs://bucket/wh/t/a.parquet", False),
        ("relative/wh/t/a.parquet", False),
    ],
)
def test_paths_are_compared_once_normalised(path: str, inside: bool) -> None:
    from metaservice.lifecycle.iceberg import owned_by

    owned = owned_by(["file:///wh/t", "s3://bucket/wh/t/"])
    assert owned(path) is inside
