"""Executing expiries (G5) on real Iceberg tables: POST /tables/{table}/expire, retention,
the schedule and ``metaservice expire``.

The tables live in a pyiceberg SQL catalog in the service's own database (SQLite or
PostgreSQL) with a warehouse folder, the default layout the jobs use; every snapshot is
one stamped commit of real Parquet files written by pyarrow (an append, or an overwrite
replacing every file, as the sink commits them). Jobs get their barriers from the
service and report their commits to it. Files are checked on disk.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

pytest.importorskip("pyiceberg")

import pyarrow as pa
import pyarrow.parquet as pq
from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.update import RemoveSnapshotsUpdate
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from metaservice.catalog_loading import open_catalog
from metaservice.cli import app as cli_app
from metaservice.client import InvalidRequest, MetaServiceClient
from metaservice.clock import ManualClock
from metaservice.contract import encode_stamp
from metaservice.db import normalise_url
from metaservice.deps import Services
from metaservice.errors import Conflict
from metaservice.lifecycle.expiry import CatalogUnavailable, expire_table
from metaservice.lifecycle.schemas import ExpiryResult
from metaservice.settings import Settings
from metaservice.versions import service as versions
from spark_barrier.iceberg.catalog import ensure_table
from tests.faults.processes import ServiceProcess
from tests.metaservice.helpers import (
    API,
    SLOT,
    assert_error,
    barrier,
    commit,
    consistent,
    custom_client,
    get_json,
    put_job,
    unchanged,
    wait_for,
)

SCHEMA = pa.schema([pa.field("n", pa.int64())])


# -- the tables and the jobs --------------------------------------------------------------


@dataclass
class Written:
    barrier: int
    snapshot_id: int
    path: str  # the Parquet file the batch wrote
    rows: list[int]  # the table's rows at this snapshot


@dataclass
class Lake:
    """Iceberg tables in the jobs' catalog; ``batch`` runs one job batch end to end."""

    catalog: Catalog
    report: Callable[[str, int, int, str, int | None], Any]  # job, batch, barrier, table, id
    ask: Callable[[str, int], int]  # job, batch -> barrier
    clock: ManualClock
    written: dict[str, list[Written]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def table(self, name: str) -> Table:
        table = ensure_table(self.catalog, name, SCHEMA)
        if table.metadata.name_mapping() is None:
            # Parquet files written by pyarrow carry no field ids: readers go by name.
            mapping = table.schema().name_mapping.model_dump_json()
            with table.transaction() as txn:
                txn.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
        return table

    def batch(
        self, job: str, batch_id: int, table: str, rows: list[int], *, replace: bool = False
    ) -> Written:
        """Ask for the batch's barrier, commit ``rows`` stamped with it (replacing every
        file when ``replace``), report the snapshot; the clock moves one slot on."""
        b = self.ask(job, batch_id)
        written = self.commit(table, encode_stamp(b, job, batch_id), b, rows, replace)
        self.report(job, batch_id, b, table, written.snapshot_id)
        self.clock.advance(SLOT)
        return written

    def commit(
        self, name: str, stamp: dict[str, str], b: int, rows: list[int], replace: bool
    ) -> Written:
        """One snapshot, as the sink commits one: a fast append, or an overwrite that
        removes every current data file and adds the new one. A commit that loses a race
        (with a scheduled expiry, say) is tried again on the refreshed table, as the
        sink's is."""
        for _ in range(4):
            try:
                return self._commit_once(name, stamp, b, rows, replace)
            except CommitFailedException:
                time.sleep(0.05)
        return self._commit_once(name, stamp, b, rows, replace)

    def _commit_once(
        self, name: str, stamp: dict[str, str], b: int, rows: list[int], replace: bool
    ) -> Written:
        with self.lock:
            t = self.table(name)
            path = f"{t.location()}/data/{uuid.uuid4().hex}.parquet"
            Path(local(path)).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"n": rows}, schema=SCHEMA), local(path))
            added = parquet_file_to_data_file(t.io, t.metadata, path)
            current = list(t.scan().plan_files()) if replace else []
            txn = t.transaction()
            update = txn.update_snapshot(snapshot_properties=stamp)
            producer: Any = update.overwrite() if replace else update.fast_append()
            with producer:
                for task in current:
                    producer.delete_data_file(task.file)
                producer.append_data_file(added)
            txn.commit_transaction()
            before = self.written.setdefault(name, [])
            state = rows if replace else (before[-1].rows if before else []) + rows
            written = Written(b, producer.snapshot_id, path, sorted(state))
            before.append(written)
            return written


def local(uri: str) -> str:
    return urlparse(uri).path


def on_disk(warehouse: Path) -> dict[str, int]:
    """Every file under the warehouse (as its file:// URI) and its size."""
    return {p.resolve().as_uri(): p.stat().st_size for p in warehouse.rglob("*") if p.is_file()}


def reachable(t: Table) -> set[str]:
    """Every file the table's snapshots reach, as pyiceberg's metadata tables list them,
    plus its metadata JSON files (which an expiry leaves)."""
    files = {s.manifest_list for s in t.snapshots()}
    files |= set(t.inspect.all_manifests()["path"].to_pylist())
    files |= set(t.inspect.all_files()["file_path"].to_pylist())
    return files


def rows_at(t: Table, snapshot_id: int) -> list[int]:
    return sorted(t.scan(snapshot_id=snapshot_id).to_arrow()["n"].to_pylist())


def services(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def expire(client: TestClient, table: str, **body: Any) -> dict[str, Any]:
    r = client.post(f"{API}/tables/{table}/expire", json=body or None)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def ids(snapshots: list[dict[str, Any]]) -> list[int]:
    return [s["snapshot_id"] for s in snapshots]


def expired_rows(db_url: str) -> list[tuple[str, int, int]]:
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT t.name, e.snapshot_id, e.barrier FROM expired_snapshots e"
                        " JOIN tables t ON t.id = e.table_id ORDER BY 1, 3, 2"
                    )
                )
            ]
    finally:
        engine.dispose()


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


@pytest.fixture
def settings(db_url: str, warehouse: Path) -> Settings:
    """The service's settings (conftest's ``client`` uses them): the catalog is the
    default one, in the service's database with this warehouse."""
    return Settings(db_url=db_url, warehouse=str(warehouse))


@pytest.fixture
def catalog(db_url: str, warehouse: Path) -> Iterator[Catalog]:
    """The jobs' catalog, opened as the Spark side opens it."""
    opened = open_catalog(db_url, str(warehouse))
    yield opened
    opened.engine.dispose()  # type: ignore[attr-defined]


def lake_for(client: TestClient, catalog: Catalog, clock: ManualClock) -> Lake:
    return Lake(
        catalog,
        report=lambda *r: commit(client, *r),
        ask=lambda job, batch_id: barrier(client, job, batch_id)["barrier"],
        clock=clock,
    )


@pytest.fixture
def lake(client: TestClient, catalog: Catalog, clock: ManualClock) -> Lake:
    return lake_for(client, catalog, clock)


def history(client: TestClient, lake: Lake, n: int = 4, job: str = "src") -> list[Written]:
    """``job`` writes ods.orders: appends [0], [1]; an overwrite to [20]; appends [3]..."""
    put_job(client, job, ["ods.orders"])
    out = []
    for i in range(n):
        out.append(lake.batch(job, i, "ods.orders", [20] if i == 2 else [i], replace=i == 2))
    return out


# -- exactly the unused snapshots, and only their files -----------------------------------


def test_expiry_removes_exactly_the_unused_snapshots_and_the_files_only_they_used(
    client: TestClient, lake: Lake, warehouse: Path, db_url: str
) -> None:
    s = history(client, lake)  # rows: [0], [0, 1], [20], [3, 20]
    table = lake.table("ods.orders")
    before = on_disk(warehouse)
    lists = {w.snapshot_id: table.snapshot_by_id(w.snapshot_id).manifest_list for w in s}

    result = expire(client, "ods.orders")

    assert ids(result["snapshots"]) == [w.snapshot_id for w in s[:3]]
    assert result["snapshots_removed"] == 3 and result["already_gone"] == []
    assert result["expiry_horizon"] == s[3].barrier
    table = lake.catalog.load_table("ods.orders")
    assert [snap.snapshot_id for snap in table.snapshots()] == [s[3].snapshot_id]
    assert rows_at(table, s[3].snapshot_id) == [3, 20]

    after = on_disk(warehouse)
    removed = {f["path"] for f in result["files"]}
    assert set(before) - set(after) == removed, "exactly the files it names are gone"
    assert result["files_removed"] == len(removed)
    assert result["bytes_freed"] == sum(before[p] for p in removed)
    assert {f["path"]: f["bytes"] for f in result["files"]} == {p: before[p] for p in removed}
    # the overwrite removed batches 0 and 1's files: nothing uses them any more
    assert {f["path"] for f in result["files"] if f["kind"] == "data"} == {s[0].path, s[1].path}
    assert {lists[w.snapshot_id] for w in s[:3]} <= removed
    # what the remaining snapshot uses is all there, and nothing else is left (no orphan)
    live = reachable(table)
    assert live <= set(after)
    assert {p for p in after if not p.endswith(".metadata.json")} == live
    assert {s[2].path, s[3].path} <= live

    # recorded; no plan lists them again; no version or lease on them is handed out
    assert expired_rows(db_url) == [("ods.orders", w.snapshot_id, w.barrier) for w in s[:3]]
    plan = get_json(client, "/tables/ods.orders/expirable")
    assert (plan["expirable"], ids(plan["kept"])) == ([], [s[3].snapshot_id])
    for w in s[:3]:
        assert_error(consistent(client, "ods.orders", at_or_before=w.barrier), 409, "expired")
        r = client.post(
            f"{API}/leases",
            json={"tables": ["ods.orders"], "at_or_before": w.barrier, "lease_seconds": 60},
        )
        assert_error(r, 409, "expired")
    assert consistent(client, "ods.orders").json()["snapshots"] == {"ods.orders": s[3].snapshot_id}

    again = expire(client, "ods.orders")
    assert (again["snapshots"], again["files"], again["bytes_freed"]) == ([], [], 0)
    assert on_disk(warehouse) == after


def test_files_the_kept_overwrite_only_records_as_deleted_are_freed(
    client: TestClient, lake: Lake, warehouse: Path
) -> None:
    """The current snapshot is the overwrite: its manifests still name batches 0 and 1's
    files, as DELETED entries. Nothing reads them any more, so they go."""
    s = history(client, lake, n=3)
    result = expire(client, "ods.orders")
    assert ids(result["snapshots"]) == [s[0].snapshot_id, s[1].snapshot_id]
    assert {f["path"] for f in result["files"] if f["kind"] == "data"} == {s[0].path, s[1].path}
    table = lake.catalog.load_table("ods.orders")
    assert rows_at(table, s[2].snapshot_id) == [20]
    assert not Path(local(s[0].path)).exists() and Path(local(s[2].path)).exists()


def test_an_expired_snapshots_spilled_log_files_go_with_it_and_the_kept_ones_stay(
    client: TestClient, lake: Lake, warehouse: Path
) -> None:
    """Rows a table's log spilled for a batch are listed in the batch's snapshot summary
    (the writer claims them before its commit): expiring the snapshot deletes them."""
    from metaservice.contract import encode_log_files
    from metaservice.logstore.spill import Spill
    from metaservice.logstore.store import TableLog

    table = lake.table("ods.orders")
    log_ = TableLog("ods.orders", max_bytes=0)  # everything unpersisted spills
    log_.spill = Spill(f"{table.location()}/log")
    put_job(client, "src", ["ods.orders"])
    written, spilled = [], []
    for batch in range(3):
        b = barrier(client, "src", batch)["barrier"]
        log_.append(b, batch, pa.RecordBatch.from_pydict({"n": [batch]}, schema=SCHEMA))
        files = log_.claim_spilled(batch)
        stamp = {**encode_stamp(b, "src", batch), **encode_log_files(files)}
        w = lake.commit("ods.orders", stamp, b, [batch], False)
        commit(client, "src", batch, b, "ods.orders", w.snapshot_id)
        log_.persisted(b, batch, w.snapshot_id)
        lake.clock.advance(SLOT)
        written.append(w)
        spilled.append(files)
    assert all(len(files) == 1 and Path(local(files[0])).exists() for files in spilled)

    plan = expire(client, "ods.orders", dry_run=True)
    assert {f["path"] for f in plan["files"] if f["kind"] == "log"} == {
        spilled[0][0],
        spilled[1][0],
    }
    result = expire(client, "ods.orders")

    assert ids(result["snapshots"]) == [w.snapshot_id for w in written[:2]]
    gone = {f["path"]: f["bytes"] for f in result["files"] if f["kind"] == "log"}
    assert set(gone) == {spilled[0][0], spilled[1][0]} and all(n > 0 for n in gone.values())
    assert not any(Path(local(files[0])).exists() for files in spilled[:2])
    assert Path(local(spilled[2][0])).exists(), "the kept snapshot's log file stays"


def test_a_dry_run_lists_what_a_run_removes_and_changes_nothing(
    client: TestClient, lake: Lake, warehouse: Path, db_url: str
) -> None:
    s = history(client, lake)
    files = on_disk(warehouse)
    with unchanged(db_url):  # the catalog's rows too: it lives in the same database
        dry = expire(client, "ods.orders", dry_run=True)
    assert on_disk(warehouse) == files
    assert dry["dry_run"] and ids(dry["snapshots"]) == [w.snapshot_id for w in s[:3]]
    assert get_json(client, "/tables/ods.orders/expirable")["expiry_horizon"] is None
    # the horizon was not raised: a version on a listed snapshot is still handed out
    assert consistent(client, "ods.orders", at_or_before=s[0].barrier).status_code == 200

    real = expire(client, "ods.orders")
    assert not real["dry_run"]
    for key in ("snapshots", "files", "snapshots_removed", "files_removed", "bytes_freed"):
        assert real[key] == dry[key], key


def test_the_cli_expires_through_a_running_service(tmp_path: Path) -> None:
    """``metaservice expire`` against a real ``metaservice start`` (HTTP), the jobs
    committing to the catalog and reporting through the client."""
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
            s = [lake.batch("src", i, "ods.orders", [i]) for i in range(3)]
        runner = CliRunner()
        dry = runner.invoke(cli_app, ["expire", "ods.orders", "--dry-run", "--url", service.url])
        assert dry.exit_code == 0, dry.output
        assert "ods.orders: would remove 2 snapshots" in dry.output
        assert f"snapshot {s[0].snapshot_id}" in dry.output
        done = runner.invoke(
            cli_app, ["expire", "ods.orders", "ods.nope", "--json", "--url", service.url]
        )
        assert done.exit_code == 1, done.output  # ods.nope is unknown; ods.orders expires
        assert "table 'ods.nope'" in done.output
        printed = json.loads(done.stdout[done.stdout.index("[") :])
        assert [r["snapshots_removed"] for r in printed] == [2]
        assert [x.snapshot_id for x in catalog.load_table("ods.orders").snapshots()] == [
            s[2].snapshot_id
        ]
        catalog.engine.dispose()  # type: ignore[attr-defined]
        with MetaServiceClient(service.url) as ms:  # retention through the client
            assert ms.set_retention("ods.orders", keep_for_seconds=60).keep_for_seconds == 60
            assert ms.retention("ods.orders").keep_last_is_default
            with pytest.raises(InvalidRequest, match="keep_last, keep_for_seconds or both"):
                ms.set_retention("ods.orders")
            assert ms.reset_retention("ods.orders").keep_for_seconds_is_default


# -- what is in use stays -----------------------------------------------------------------


def test_a_stopped_readers_start_position_and_the_files_it_uses_stay(
    client: TestClient, lake: Lake, warehouse: Path
) -> None:
    put_job(client, "src", ["ods.orders"])
    s0 = lake.batch("src", 0, "ods.orders", [0])
    s1 = lake.batch("src", 1, "ods.orders", [1])
    put_job(client, "der", ["dw.detail"], inputs=["ods.orders"])
    d0 = lake.batch("der", 0, "dw.detail", [100])
    assert d0.barrier == s1.barrier
    r = client.post(f"{API}/jobs/der/events", json={"event": "terminated"})
    assert r.status_code == 200, r.text
    s2 = lake.batch("src", 2, "ods.orders", [20], replace=True)
    s3 = lake.batch("src", 3, "ods.orders", [3])

    result = expire(client, "ods.orders")

    assert ids(result["snapshots"]) == [s0.snapshot_id]
    table = lake.catalog.load_table("ods.orders")
    kept = [x.snapshot_id for x in table.snapshots()]
    assert kept == [s1.snapshot_id, s2.snapshot_id, s3.snapshot_id]
    # s1 (der's start) still reaches batch 0's file: it is not deleted
    assert rows_at(table, s1.snapshot_id) == [0, 1]
    assert Path(local(s0.path)).exists()
    assert {f["kind"] for f in result["files"]} == {"manifest_list"}
    assert set(on_disk(warehouse)) >= reachable(table)
    # der restarts from its start position: its next batch reads (s1, ...]
    ranges = barrier(client, "der", 1)["inputs"]
    assert [x["from_snapshot"] for x in ranges] == [s1.snapshot_id]


def test_a_lease_taken_while_the_expiry_runs_is_never_broken(
    client: TestClient, lake: Lake, settings: Settings, warehouse: Path
) -> None:
    """The expiry is paused just before its Iceberg commit, with its reservation
    committed: a lease on a reserved snapshot is refused, one on a kept snapshot is
    granted and survives, and a writer's commit meanwhile is kept."""
    s = history(client, lake)
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
    for w in s[:3]:
        with pytest.raises(Conflict) as refused:
            svc.db.write(
                lambda session, b=w.barrier: versions.lease_version(
                    session, svc.ctx, ["ods.orders"], b, 600
                )
            )
        assert refused.value.code == "expired"
    lease = consistent(client, "ods.orders", lease_seconds=600).json()
    assert lease["snapshots"] == {"ods.orders": s[3].snapshot_id}
    s4 = lake.batch("src", 4, "ods.orders", [4])  # a writer commits meanwhile
    release.set()
    runner.join(30)

    result = out[0]
    assert isinstance(result, ExpiryResult), result
    assert [x.snapshot_id for x in result.snapshots] == [w.snapshot_id for w in s[:3]]
    table = lake.catalog.load_table("ods.orders")
    assert [x.snapshot_id for x in table.snapshots()] == [s[3].snapshot_id, s4.snapshot_id]
    assert rows_at(table, s[3].snapshot_id) == s[3].rows
    assert rows_at(table, s4.snapshot_id) == [3, 4, 20]
    assert reachable(table) <= set(on_disk(warehouse))


def test_an_expiry_waits_for_a_lease_in_flight_and_keeps_its_snapshot(
    client: TestClient, lake: Lake
) -> None:
    s = history(client, lake)
    svc = services(client)
    inside, release = threading.Event(), threading.Event()
    leased: list[Any] = []

    def lease(session: Any) -> Any:
        version = versions.lease_version(session, svc.ctx, ["ods.orders"], s[0].barrier, 600)
        inside.set()
        assert release.wait(30)
        return version

    leaser = threading.Thread(target=lambda: leased.append(svc.db.write(lease)))
    leaser.start()
    assert inside.wait(30)
    out: list[Any] = []
    runner = threading.Thread(
        target=lambda: out.append(expire_table(svc.db, svc.ctx, "ods.orders"))
    )
    runner.start()
    runner.join(0.5)
    assert runner.is_alive(), "the reservation must wait for the lease's transaction"
    release.set()
    leaser.join(30)
    runner.join(30)
    assert leased[0].snapshots == {"ods.orders": s[0].snapshot_id}
    assert out[0].snapshots == []  # s0 is leased: nothing older, nothing after it goes
    table = lake.catalog.load_table("ods.orders")
    assert rows_at(table, s[0].snapshot_id) == [0]


@pytest.mark.parametrize("seed", [1, 2])
def test_leases_and_expiries_racing_never_lose_a_leased_snapshot(
    client: TestClient, lake: Lake, warehouse: Path, db_url: str, clock: ManualClock, seed: int
) -> None:
    """Rounds of new snapshots, then leases of a few seconds at random barriers and
    expiries from four threads at once. After each round every live lease's snapshot
    reads as it did; at the end everything reported is either in the table or recorded
    as expired, and no orphan is left."""
    rng = random.Random(seed)
    svc = services(client)
    put_job(client, "src", ["ods.orders"])
    written: list[Written] = []
    granted: list[Any] = []
    removed = 0
    for _ in range(4):
        for _ in range(3):  # the clock moves a slot per batch: older leases end
            written.append(lake.batch("src", len(written), "ods.orders", [len(written)]))
        calls: list[Callable[[], Any]] = []
        for _ in range(8):
            if rng.random() < 0.35:
                calls.append(lambda: expire_table(svc.db, svc.ctx, "ods.orders"))
            else:
                at, seconds = rng.choice(written[-5:]).barrier, rng.randint(2, 6)
                calls.append(
                    lambda at=at, n=seconds: svc.db.write(
                        lambda session: versions.lease_version(
                            session, svc.ctx, ["ods.orders"], at, n
                        )
                    )
                )
        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(call) for call in calls]:
                try:
                    result = future.result(120)
                except Conflict as exc:
                    assert exc.code == "expired", exc.message
                    continue
                if isinstance(result, ExpiryResult):
                    removed += result.snapshots_removed
                else:
                    granted.append(result)
        _check_live_leases(lake, written, granted, clock.now_ms())
    removed += expire_table(svc.db, svc.ctx, "ods.orders").snapshots_removed
    assert granted and removed, (granted, removed)
    _check_live_leases(lake, written, granted, clock.now_ms())
    table = lake.catalog.load_table("ods.orders")
    present = {x.snapshot_id for x in table.snapshots()}
    recorded = {snapshot for _, snapshot, _ in expired_rows(db_url)}
    assert recorded | present == {w.snapshot_id for w in written} and not recorded & present
    assert len(recorded) == removed
    assert {p for p in on_disk(warehouse) if not p.endswith(".metadata.json")} == reachable(table)


def _check_live_leases(lake: Lake, written: list[Written], granted: list[Any], now: int) -> None:
    table = lake.catalog.load_table("ods.orders")
    present = {x.snapshot_id for x in table.snapshots()}
    by_id = {w.snapshot_id: w for w in written}
    for version in granted:
        if version.lease_expires_ms > now:
            leased = version.snapshots["ods.orders"]
            assert leased in present, version
            assert rows_at(table, leased) == by_id[leased].rows


# -- retention ----------------------------------------------------------------------------


def test_retention_keeps_the_newest_n_per_table_and_falls_back_to_the_default(
    db_url: str, clock: ManualClock, catalog: Catalog, warehouse: Path
) -> None:
    settings = {"warehouse": str(warehouse), "retention_keep_last": 2}
    with custom_client(db_url, clock, **settings) as c:
        lake = lake_for(c, catalog, clock)
        put_job(c, "src", ["ods.a"])
        a = [lake.batch("src", i, "ods.a", [i]) for i in range(6)]
        assert get_json(c, "/tables/ods.a/retention") == {
            "table": "ods.a",
            "keep_last": 2,
            "keep_for_seconds": 0,
            "keep_last_is_default": True,
            "keep_for_seconds_is_default": True,
        }
        r = c.put(f"{API}/tables/ods.a/retention", json={"keep_last": 4})
        assert r.status_code == 200, r.text
        assert r.json()["keep_last"] == 4 and not r.json()["keep_last_is_default"]
        result = expire(c, "ods.a")
        assert ids(result["snapshots"]) == [w.snapshot_id for w in a[:2]]
        kept = get_json(c, "/tables/ods.a/expirable")["kept"]
        assert [k["reasons"][-1] for k in kept] == ["retention: one of the newest 4"] * 4
        # back to the default: the newest 2
        r = c.delete(f"{API}/tables/ods.a/retention")
        assert r.status_code == 200 and r.json()["keep_last"] == 2, r.text
        assert ids(expire(c, "ods.a")["snapshots"]) == [w.snapshot_id for w in a[2:4]]
        table = catalog.load_table("ods.a")
        assert [x.snapshot_id for x in table.snapshots()] == [w.snapshot_id for w in a[4:]]
        assert rows_at(table, a[4].snapshot_id) == [0, 1, 2, 3, 4]


def test_retention_keeps_snapshots_younger_than_t(
    client: TestClient, lake: Lake, clock: ManualClock
) -> None:
    put_job(client, "src", ["ods.orders"])
    s = [lake.batch("src", i, "ods.orders", [i]) for i in range(5)]  # reported T0 .. T0+4s
    r = client.put(f"{API}/tables/ods.orders/retention", json={"keep_for_seconds": 2})
    assert r.status_code == 200, r.text
    assert r.json()["keep_last"] == 1 and r.json()["keep_last_is_default"]
    # now T0+5s: reported at T0+3s and later are younger than 2 s
    assert ids(expire(client, "ods.orders")["snapshots"]) == [w.snapshot_id for w in s[:3]]
    clock.advance(10 * SLOT)
    assert ids(expire(client, "ods.orders")["snapshots"]) == [s[3].snapshot_id]
    table = lake.catalog.load_table("ods.orders")
    assert [x.snapshot_id for x in table.snapshots()] == [s[4].snapshot_id]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"keep_last": 0}, "keep_last"),
        ({"keep_last": -3}, "keep_last"),
        ({"keep_for_seconds": -1}, "keep_for_seconds"),
        ({"keep_last": "many"}, "keep_last"),
        ({"keep_last": 2**63}, "keep_last"),
        ({"keep_last": 3, "keep_forever": True}, "keep_forever"),
        ({}, "body"),
        ({"keep_last": None, "keep_for_seconds": None}, "body"),
    ],
)
def test_bad_retention_is_422_and_changes_nothing(
    client: TestClient, db_url: str, body: dict[str, Any], field: str
) -> None:
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        r = client.put(f"{API}/tables/ods.orders/retention", json=body)
    code = "invalid" if field == "body" else "invalid_request"
    found = assert_error(r, 422, code, field=field)
    if field == "body":
        assert "keep_last" in found["message"] and "DELETE" in found["message"]


def test_retention_and_expiry_of_an_unknown_table_are_404_and_change_nothing(
    client: TestClient, db_url: str
) -> None:
    put_job(client, "src", ["ods.orders"])
    with unchanged(db_url):
        assert_error(client.get(f"{API}/tables/ods.nope/retention"), 404, "not_found")
        r = client.put(f"{API}/tables/ods.nope/retention", json={"keep_last": 3})
        assert_error(r, 404, "not_found", field="table")
        assert_error(client.delete(f"{API}/tables/ods.nope/retention"), 404, "not_found")
        assert_error(client.post(f"{API}/tables/ods.nope/expire"), 404, "not_found")
        r = client.post(f"{API}/tables/ods.orders/expire", json={"dry_run": "perhaps"})
        assert_error(r, 422, "invalid_request", field="dry_run")
        r = client.post(f"{API}/tables/ods.orders/expire", json={"dry": True})
        assert_error(r, 422, "invalid_request", field="dry")


@pytest.mark.parametrize("jobs_made_the_catalog", [True, False])
def test_a_table_missing_from_the_catalog_is_409_and_changes_nothing(
    client: TestClient, db_url: str, request: pytest.FixtureRequest, jobs_made_the_catalog: bool
) -> None:
    """The catalog lacks the table; or, before any job wrote one, lacks its own tables."""
    if jobs_made_the_catalog:
        request.getfixturevalue("catalog")
    put_job(client, "src", ["ods.ghost"])
    for i in range(3):  # reported, but never committed to the catalog
        commit(client, "src", i, barrier(client, "src", i)["barrier"], "ods.ghost", 900 + i)
    with unchanged(db_url):
        r = client.post(f"{API}/tables/ods.ghost/expire")
        body = assert_error(r, 409, "not_in_catalog", field="table")
    assert "METASERVICE_WAREHOUSE" in body["message"]


def test_an_unreachable_catalog_is_503_and_changes_nothing(
    client: TestClient, lake: Lake, db_url: str
) -> None:
    history(client, lake)
    svc = services(client)

    def unreachable(_: Settings) -> Catalog:
        return SqlCatalog("x", uri="postgresql+psycopg://nobody@127.0.0.1:9/none", warehouse="/x")

    with unchanged(db_url), pytest.raises(CatalogUnavailable) as failed:
        expire_table(svc.db, svc.ctx, "ods.orders", load_catalog=unreachable)
    assert failed.value.status == 503 and "catalog" in failed.value.message


# -- the schedule -------------------------------------------------------------------------


def test_the_schedule_expires_every_table_and_survives_one_tables_failure(
    db_url: str,
    clock: ManualClock,
    catalog: Catalog,
    warehouse: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="metaservice.lifecycle")
    settings = {"warehouse": str(warehouse), "expire_every_seconds": 0.2}
    with custom_client(db_url, clock, **settings) as c:
        lake = lake_for(c, catalog, clock)
        put_job(c, "src", ["ods.a", "ods.b", "ods.ghost"])
        written = []
        for i in range(3):
            b = barrier(c, "src", i)["barrier"]
            written.append(lake.commit("ods.a", encode_stamp(b, "src", i), b, [i], False))
            written.append(lake.commit("ods.b", encode_stamp(b, "src", i), b, [i], False))
            commit(c, "src", i, b, "ods.a", written[-2].snapshot_id)
            commit(c, "src", i, b, "ods.b", written[-1].snapshot_id)
            commit(c, "src", i, b, "ods.ghost", 900 + i)  # not in the catalog: fails
            clock.advance(SLOT)

        def expired() -> list[str]:
            return sorted(name for name, *_ in expired_rows(db_url))

        def rounds() -> int:
            return sum(r.getMessage().startswith("expiry round") for r in caplog.records)

        assert wait_for(lambda: expired() == ["ods.a", "ods.a", "ods.b", "ods.b"])
        done = rounds()
        assert wait_for(lambda: rounds() >= done + 2), "rounds go on after a failure"
    assert {name for name, *_ in expired_rows(db_url)} == {"ods.a", "ods.b"}
    for name in ("ods.a", "ods.b"):
        assert len(catalog.load_table(name).snapshots()) == 1
    messages = [r.getMessage() for r in caplog.records]
    # the rounds ran while the batches came in: they took the snapshots one or two at a time
    assert [name for name, *_ in expired_rows(db_url)].count("ods.a") == 2
    assert any(m.startswith("expired ") and " of ods.a " in m for m in messages), messages
    assert any(m.startswith("scheduled expiry of ods.ghost failed") for m in messages), messages


def test_start_with_expire_every_runs_the_schedule(tmp_path: Path) -> None:
    """``metaservice start --expire-every 1s``: the real process expires on its own."""
    db_url = f"sqlite:///{tmp_path / 'ms.db'}"
    with ServiceProcess(
        db_url, tmp_path / "service.log", workdir=tmp_path, extra_args=["--expire-every", "1s"]
    ) as service:
        catalog = open_catalog(db_url, str(tmp_path / "warehouse"))
        with MetaServiceClient(service.url) as ms:
            ms.put_job("src", outputs=["ods.orders"])
            lake = Lake(
                catalog,
                report=ms.report_commit,
                ask=lambda job, b: ms.batch_barrier(job, b).barrier,
                clock=ManualClock(0),
            )
            for i in range(3):
                lake.batch("src", i, "ods.orders", [i])
            assert wait_for(lambda: not ms.expirable("ods.orders").expirable), service.log()
        assert len(catalog.load_table("ods.orders").snapshots()) == 1
        catalog.engine.dispose()  # type: ignore[attr-defined]
        assert "expiring unused snapshots every 1 s" in service.log()


def test_bad_expire_every_is_refused_before_starting(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli_app, ["start", "--db", f"sqlite:///{tmp_path / 'ms.db'}", "--expire-every", "soon"]
    )
    assert r.exit_code == 2, r.output
    assert "'soon' is not a duration" in r.output
    assert not (tmp_path / "ms.db").exists()


# -- layering -----------------------------------------------------------------------------


def test_the_service_expires_without_loading_pyspark(tmp_path: Path) -> None:
    """A fresh interpreter where pyspark cannot be imported runs a real expiry."""
    script = textwrap.dedent(
        """
        import json, sys
        from importlib.abc import MetaPathFinder

        class NotInstalled(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in ("pyspark", "py4j"):
                    raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

        sys.meta_path.insert(0, NotInstalled())
        import pyarrow as pa
        from fastapi.testclient import TestClient
        import metaservice.app, metaservice.cli
        from metaservice.contract import encode_stamp
        from pyiceberg.catalog.sql import SqlCatalog
        from metaservice.lifecycle import cli, expiry, iceberg, schedule
        from metaservice.migrate import upgrade
        from metaservice.settings import Settings

        root = sys.argv[1]
        settings = Settings(db_url=f"sqlite:///{root}/ms.db", warehouse=f"{root}/wh")
        upgrade(settings.db_url)
        catalog = SqlCatalog("metaservice", uri=settings.db_url, warehouse=f"file://{root}/wh")
        catalog.create_namespace("ods")
        schema = pa.schema([pa.field("n", pa.int64())])
        table = catalog.create_table("ods.orders", schema=schema)
        with TestClient(metaservice.app.create_app(settings)) as c:
            c.put("/api/v1/jobs/src", json={"outputs": ["ods.orders"]})
            for i in range(3):
                b = c.post(f"/api/v1/jobs/src/batches/{i}/barrier").json()["barrier"]
                table.append(pa.table({"n": [i]}, schema=schema),
                             snapshot_properties=encode_stamp(b, "src", i))
                snapshot = table.current_snapshot().snapshot_id
                c.post("/api/v1/commits", json={"job": "src", "batch_id": i, "barrier": b,
                                                 "table": "ods.orders", "snapshot_id": snapshot})
            result = c.post("/api/v1/tables/ods.orders/expire").json()
        print(json.dumps({
            "removed": result.get("snapshots_removed", result),
            "spark": sorted(m for m in sys.modules if m.startswith(("pyspark", "py4j"))),
        }))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"removed": 2, "spark": []}


def test_the_expire_command_needs_no_server_install(tmp_path: Path) -> None:
    blocked = ("fastapi", "sqlalchemy", "alembic", "uvicorn", "pyiceberg", "pyarrow", "pyspark")
    script = textwrap.dedent(
        f"""
        import sys
        from importlib.abc import MetaPathFinder

        class NotInstalled(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in {blocked!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)

        sys.meta_path.insert(0, NotInstalled())
        from metaservice.cli import app
        app(args=["expire", "--help"], prog_name="metaservice")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: metaservice expire" in done.stdout and "--dry-run" in done.stdout
