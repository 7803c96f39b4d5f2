"""Reconciliation (G4): the MetaService rebuilds its barrier-to-snapshot mapping from the
stamps in real Iceberg snapshot summaries (pyiceberg, no Spark).

The pipeline: source job ``src`` writes ods.orders; derived job ``der`` reads it and
writes dw.detail and dw.stats. Its requests go to the service under test and, for a
"restored from an old backup" service, only the first half of them does, while a
reference service (its own SQLite file) gets them all and the tables get every
snapshot. After reconciliation the service under test must equal the reference.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

import pyarrow as pa
from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from metaservice.app import create_app
from metaservice.catalog_loading import open_catalog
from metaservice.cli import app as cli_app
from metaservice.clock import ManualClock
from metaservice.context import Context
from metaservice.db import Database, normalise_url
from metaservice.migrate import upgrade
from metaservice.reconcile import service
from metaservice.reconcile.iceberg import reconcile_catalog
from metaservice.reconcile.schemas import ReconcileReport, Stamp
from metaservice.settings import Settings
from spark_barrier.iceberg.catalog import ensure_table
from spark_barrier.iceberg.stamps import SUMMARY_BARRIER, SUMMARY_BATCH, SUMMARY_JOB
from tests.metaservice.helpers import (
    API,
    SLOT,
    T0,
    barrier,
    commit,
    consistent,
    custom_client,
    get_json,
    put_job,
    unchanged,
)
from tests.metaservice.test_expiry import services

TABLES = ("dw.detail", "dw.stats", "ods.orders")
SCHEMA = pa.schema([pa.field("batch", pa.int64())])
BOTH = {"dw.detail": True, "dw.stats": True}


# -- the tables and the pipeline ----------------------------------------------------------


class Lake:
    """Iceberg tables in a pyiceberg SqlCatalog; every append is stamped like the sink's."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.tables = {name: ensure_table(catalog, name, SCHEMA) for name in TABLES}
        self.stamped: list[int] = []  # every stamped barrier

    def append(self, table: str, job: str, batch_id: int, barrier_: int) -> int:
        t = self.tables[table]
        t.append(
            pa.table({"batch": [batch_id]}, schema=SCHEMA),
            snapshot_properties={
                SUMMARY_BARRIER: str(barrier_),
                SUMMARY_JOB: job,
                SUMMARY_BATCH: str(batch_id),
            },
        )
        self.stamped.append(barrier_)
        snapshot = t.current_snapshot()
        assert snapshot is not None
        return snapshot.snapshot_id


class Pipeline:
    """Drives the jobs: barriers and reports go to every service in ``live``."""

    def __init__(self, lake: Lake, clock: ManualClock, *live: TestClient) -> None:
        self.lake = lake
        self.clock = clock
        self.live = list(live)

    def barrier(self, job: str, batch_id: int) -> int:
        answers = {barrier(c, job, batch_id)["barrier"] for c in self.live}
        assert len(answers) == 1, answers
        return answers.pop()

    def commit(self, job: str, batch_id: int, barrier_: int, outputs: dict[str, bool]) -> None:
        for table, has_rows in outputs.items():
            snapshot = self.lake.append(table, job, batch_id, barrier_) if has_rows else None
            for c in self.live:
                commit(c, job, batch_id, barrier_, table, snapshot)

    def batch(self, job: str, batch_id: int, outputs: dict[str, bool]) -> int:
        b = self.barrier(job, batch_id)
        self.commit(job, batch_id, b, outputs)
        return b

    def first_half(self) -> tuple[int, int]:
        """Up to the cut: ends with a batch of each job given a barrier but not committed."""
        for c in self.live:
            put_job(c, "src", ["ods.orders"])
            put_job(c, "der", ["dw.detail", "dw.stats"], inputs=["ods.orders"])
        orders = {"ods.orders": True}
        self.batch("src", 0, orders)
        self.clock.advance(SLOT)
        self.batch("src", 1, orders)
        self.clock.advance(SLOT)
        self.batch("der", 0, BOTH)
        self.batch("src", 2, orders)
        self.batch("src", 3, orders)  # same slot: shares batch 2's barrier
        self.clock.advance(SLOT)
        self.batch("der", 1, BOTH)
        self.batch("src", 4, orders)
        self.clock.advance(SLOT)
        return self.barrier("der", 2), self.barrier("src", 5)

    def second_half(self, open_der: int, open_src: int) -> None:
        orders = {"ods.orders": True}
        self.commit("der", 2, open_der, {"dw.detail": True, "dw.stats": False})
        self.commit("src", 5, open_src, orders)
        self.clock.advance(SLOT)
        self.batch("src", 6, orders)
        self.clock.advance(SLOT)
        self.batch("der", 3, {"dw.detail": True, "dw.stats": False})  # nothing for dw.stats
        self.clock.advance(SLOT)
        self.batch("der", 4, BOTH)
        self.batch("src", 7, orders)


# -- what the service says ----------------------------------------------------------------


def views(c: TestClient) -> dict[str, Any]:
    """The mapping, frontiers, consistent versions and snapshot lineage, as served."""
    out: dict[str, Any] = {}
    for t in TABLES:
        items = get_json(c, f"/tables/{t}/snapshots", limit=1000)["items"]
        out[f"snapshots {t}"] = [{k: v for k, v in s.items() if k != "reported_ms"} for s in items]
        for s in items:
            if s["snapshot_id"] is not None:
                out[f"lineage {t} {s['snapshot_id']}"] = get_json(
                    c, f"/lineage/snapshots/{t}/{s['snapshot_id']}"
                )
    out["tables"] = [
        {k: t[k] for k in ("name", "writer", "frontier", "latest_snapshot", "latest_barrier")}
        for t in get_json(c, "/tables")["items"]
    ]
    out["jobs"] = [
        {k: j[k] for k in ("name", "frontier", "last_barrier", "last_batch_id", "pending_target")}
        for j in get_json(c, "/jobs")["items"]
    ]
    for tables in ("dw.detail,dw.stats,ods.orders", "dw.detail,ods.orders", "dw.stats"):
        for at in (None, *range(T0, T0 + 9 * SLOT, SLOT)):
            r = consistent(c, tables, **({} if at is None else {"at_or_before": at}))
            out[f"consistent {tables} {at}"] = (r.status_code, r.json())
    return out


def core_state(db_url: str) -> dict[str, Any]:
    """The rows behind the views, by name (row ids and times left out)."""
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            return {
                # A source's frontier as readers see it: its sealed frontier or the
                # clock's watermark, whichever is higher (open batches and offline
                # floors are in the row too); the sealed column alone is a lower bound.
                "jobs": conn.execute(
                    text(
                        "SELECT name, kind, CASE WHEN kind = 'source' AND frontier < w.s"
                        " THEN w.s ELSE frontier END, open_batches, pending_target,"
                        " last_barrier, last_batch_id"
                        " FROM jobs, (SELECT watermark AS s FROM clock WHERE id = 1) w"
                        " ORDER BY name"
                    )
                ).all(),
                "batches": conn.execute(
                    text(
                        "SELECT j.name, b.batch_id, b.barrier, b.start_barrier,"
                        " CASE WHEN b.committed THEN 1 ELSE 0 END"
                        " FROM batches b JOIN jobs j ON j.id = b.job_id ORDER BY 1, 2"
                    )
                ).all(),
                "commits": conn.execute(
                    text(
                        "SELECT j.name, c.batch_id, t.name, c.barrier, c.snapshot_id"
                        " FROM commits c JOIN jobs j ON j.id = c.job_id"
                        " JOIN tables t ON t.id = c.table_id ORDER BY 1, 2, 3"
                    )
                ).all(),
                "last_issued": conn.execute(text("SELECT last_issued FROM clock")).scalar_one(),
            }
    finally:
        engine.dispose()


def run_reconcile(
    db_url: str, clock: ManualClock, catalog: Catalog, *, check: bool = False
) -> ReconcileReport:
    db = Database(db_url)
    try:
        ctx = Context(settings=Settings(db_url=db_url), clock=clock)
        return reconcile_catalog(db, ctx, catalog, check=check)
    finally:
        db.dispose()


def by_table(report: ReconcileReport) -> dict[str, Any]:
    return {t.table: t for t in report.tables}


def added(report: ReconcileReport) -> dict[str, list[tuple[str, int, int | None]]]:
    return {
        t.table: [(r.job, r.batch_id, r.snapshot_id) for r in t.added + t.closed_empty]
        for t in report.tables
    }


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    """Tables in a SQLite catalog of their own, whichever database the service uses."""
    return Lake(open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path / "wh")))


@pytest.fixture
def reference_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'reference.db'}"
    upgrade(url)
    return url


@pytest.fixture
def reference(reference_url: str, clock: ManualClock) -> Iterator[TestClient]:
    """A service that gets every report."""
    with TestClient(create_app(Settings(db_url=reference_url), clock)) as c:
        yield c


def restored(client: TestClient, reference: TestClient, clock: ManualClock, lake: Lake) -> Pipeline:
    """``client`` got the first half of the reports, ``reference`` and the tables all."""
    pipeline = Pipeline(lake, clock, client, reference)
    cut = pipeline.first_half()
    pipeline.live = [reference]
    pipeline.second_half(*cut)
    clock.advance(SLOT)
    return pipeline


# -- scenarios ----------------------------------------------------------------------------


def test_a_service_that_got_every_report_gains_nothing(
    db_url: str, client: TestClient, clock: ManualClock, lake: Lake
) -> None:
    pipeline = Pipeline(lake, clock, client)
    pipeline.second_half(*pipeline.first_half())
    with unchanged(db_url):
        report = run_reconcile(db_url, clock, lake.catalog)
    assert report.ok and report.added == 0 and report.conflicts == 0
    assert report.already_present == len(lake.stamped) == 16
    for t in report.tables:
        assert t.writer and t.stamped == t.already_present and not t.skipped, t
    assert report.last_issued_after == report.last_issued_before


def test_a_restored_service_catches_up_with_the_tables(
    db_url: str,
    client: TestClient,
    reference: TestClient,
    reference_url: str,
    clock: ManualClock,
    lake: Lake,
) -> None:
    restored(client, reference, clock, lake)
    expected, expected_rows = views(reference), core_state(reference_url)
    behind = get_json(client, "/tables/dw.detail/snapshots")["items"]
    assert len(behind) == 2  # der's batches 0 and 1 only

    with unchanged(db_url):  # --check: the same report, nothing changed
        dry = run_reconcile(db_url, clock, lake.catalog, check=True)
    assert dry.check and dry.ok

    report = run_reconcile(db_url, clock, lake.catalog)
    assert not report.check and report.ok
    assert added(report) == added(dry)
    assert {t: [(j, b) for j, b, _ in rows] for t, rows in added(report).items()} == {
        "dw.detail": [("der", 2), ("der", 3), ("der", 4)],
        # batches 2 and 3 left no snapshot here: closed as empty once batch 4 is seen
        "dw.stats": [("der", 4), ("der", 2), ("der", 3)],
        "ods.orders": [("src", 5), ("src", 6), ("src", 7)],
    }
    tables = by_table(report)
    assert [r.snapshot_id for r in tables["dw.stats"].closed_empty] == [None, None]
    assert (tables["ods.orders"].already_present, tables["dw.detail"].already_present) == (5, 2)
    assert report.last_issued_before == T0 + 4 * SLOT
    assert report.last_issued_after == max(lake.stamped) == T0 + 7 * SLOT

    assert core_state(db_url) == expected_rows
    assert views(client) == expected

    with unchanged(db_url):  # once caught up, a second run finds everything
        again = run_reconcile(db_url, clock, lake.catalog)
    assert again.added == 0 and again.already_present == len(lake.stamped)

    # Barriers never go backwards, even on a clock that is behind the stamps.
    clock.set(T0 + 4 * SLOT)
    assert barrier(client, "src", 8)["barrier"] > max(lake.stamped)
    put_job(client, "late", ["ods.late"])
    assert barrier(client, "late", 0)["barrier"] >= max(lake.stamped)


def test_on_a_clock_behind_the_stamps_no_consumed_barrier_is_issued_again(
    db_url: str, client: TestClient, reference: TestClient, clock: ManualClock, lake: Lake
) -> None:
    pipeline = restored(client, reference, clock, lake)
    # der reads ods.orders as complete up to src's last barrier
    last = pipeline.batch("der", 5, BOTH)
    assert last == max(lake.stamped) == T0 + 7 * SLOT
    # The restored service's clock is behind the one that let der commit: in src's last slot.
    # (A clock behind the stamps themselves gets barrier_from_future conflicts instead.)
    clock.set(last + SLOT // 2)

    report = run_reconcile(db_url, clock, lake.catalog)
    assert report.ok and report.added == 11
    assert get_json(client, "/jobs/der")["frontier"] == last
    # batch 8 of src would share batch 7's slot, which der already took as complete
    assert barrier(client, "src", 8)["barrier"] > last


def _sqlite_copy(src: Path, dst: Path) -> None:
    with closing(sqlite3.connect(src)) as a, closing(sqlite3.connect(dst)) as b:
        a.backup(b)


def test_restore_of_an_sqlite_backup_then_reconcile(
    sqlite_url: str, tmp_path: Path, clock: ManualClock, lake: Lake
) -> None:
    """A real backup: the database file copied at the cut and copied back at the end."""
    upgrade(sqlite_url)
    db_file, backup = tmp_path / "metaservice.db", tmp_path / "backup.db"
    with custom_client(sqlite_url, clock) as c:
        pipeline = Pipeline(lake, clock, c)
        cut = pipeline.first_half()
        _sqlite_copy(db_file, backup)
        pipeline.second_half(*cut)
        clock.advance(SLOT)
        expected, expected_rows = views(c), core_state(sqlite_url)
    _sqlite_copy(backup, db_file)
    assert core_state(sqlite_url) != expected_rows

    report = run_reconcile(sqlite_url, clock, lake.catalog)
    assert report.ok and report.added == 9
    assert core_state(sqlite_url) == expected_rows
    with custom_client(sqlite_url, clock) as c:
        assert views(c) == expected


def test_conflicting_stamps_are_reported_and_change_nothing(
    db_url: str, client: TestClient, clock: ManualClock, lake: Lake
) -> None:
    pipeline = Pipeline(lake, clock, client)
    pipeline.second_half(*pipeline.first_half())
    clock.advance(SLOT)
    open_batch = pipeline.barrier("src", 8)  # given a barrier, not committed
    d1 = get_json(client, "/tables/dw.detail/snapshots")["items"][1]
    assert d1["batch_id"] == 1
    other = lake.append("dw.detail", "der", 1, d1["barrier"])  # batch 1 again, other snapshot
    lake.append("ods.orders", "src", 8, open_batch - SLOT)  # not batch 8's barrier
    lake.append("ods.orders", "src", 9, T0 + 1000 * SLOT)  # from the future
    lake.append("dw.stats", "ghost", 0, T0)  # not the writer: skipped, not a conflict

    with unchanged(db_url):
        report = run_reconcile(db_url, clock, lake.catalog)
    assert not report.ok and report.added == 0
    tables = by_table(report)
    detail = tables["dw.detail"].conflicts
    assert [(i.code, i.snapshot_id) for i in detail] == [("conflicting_report", other)]
    assert str(d1["snapshot_id"]) in detail[0].message
    assert [(i.code, i.batch_id) for i in tables["ods.orders"].conflicts] == [
        ("barrier_mismatch", 8),
        ("barrier_from_future", 9),
    ]
    assert [(i.code, i.job) for i in tables["dw.stats"].skipped] == [("not_writer", "ghost")]
    assert tables["dw.stats"].conflicts == []
    assert report.conflicts == 3

    with unchanged(db_url):
        dry = run_reconcile(db_url, clock, lake.catalog, check=True)
    assert dry.model_dump(exclude={"check"}) == report.model_dump(exclude={"check"})


def test_service_on_plain_stamps(db_url: str, client: TestClient, clock: ManualClock) -> None:
    """The service alone: no Iceberg, stamps as plain data."""
    put_job(client, "src", ["ods.a"])
    b0 = barrier(client, "src", 0)["barrier"]
    commit(client, "src", 0, b0, "ods.a", 11)
    stamps = {
        "ods.a": [
            Stamp(snapshot_id=11, barrier=b0, job="src", batch_id=0),  # present
            Stamp(snapshot_id=11, barrier=b0, job="src", batch_id=1),  # snapshot of batch 0
            Stamp(snapshot_id=12, barrier=b0, job="src", batch_id=2),  # added
            Stamp(snapshot_id=13, barrier=b0, job="src", batch_id=2),  # batch 2 again
        ],
        "ods.unknown": [Stamp(snapshot_id=1, barrier=b0, job="src", batch_id=0)],
    }
    db = Database(db_url)
    try:
        ctx = Context(settings=Settings(db_url=db_url), clock=clock)
        assert db.read(service.tables_to_reconcile) == ["ods.a"]
        with unchanged(db_url):
            dry = db.write(lambda s: service.reconcile(s, ctx, stamps, check=True))
        report = db.write(lambda s: service.reconcile(s, ctx, stamps))
    finally:
        db.dispose()
    assert dry.model_dump(exclude={"check"}) == report.model_dump(exclude={"check"})
    a, unknown = report.tables
    assert (a.already_present, [r.snapshot_id for r in a.added]) == (1, [12])
    assert [(i.code, i.snapshot_id) for i in a.conflicts] == [
        ("snapshot_recorded_elsewhere", 11),
        ("conflicting_report", 13),
    ]
    assert unknown.note and "not registered" in unknown.note
    mapping = get_json(client, "/tables/ods.a/snapshots")["items"]
    assert [(s["batch_id"], s["snapshot_id"]) for s in mapping] == [(0, 11), (2, 12)]
    job = get_json(client, "/jobs/src")
    assert (job["last_batch_id"], job["last_barrier"]) == (2, b0)


def test_a_job_registered_again_finds_its_former_batches_present(
    client: TestClient, clock: ManualClock
) -> None:
    """The table keeps a deleted job's commits; the job registered again under the name
    finds them recorded (not a snapshot recorded elsewhere), and its new batch added."""
    put_job(client, "src", ["ods.a"])
    b0 = barrier(client, "src", 0)["barrier"]
    commit(client, "src", 0, b0, "ods.a", 11)
    assert client.delete(f"{API}/jobs/src").status_code == 204
    put_job(client, "src", ["ods.a"])
    clock.advance(1000)
    b1 = barrier(client, "src", 1)["barrier"]
    stamps = {
        "ods.a": [
            Stamp(snapshot_id=11, barrier=b0, job="src", batch_id=0),  # the former job's
            Stamp(snapshot_id=12, barrier=b1, job="src", batch_id=1),  # added
        ]
    }
    svc = services(client)
    report = svc.db.write(lambda s: service.reconcile(s, svc.ctx, stamps))
    (a,) = report.tables
    assert (a.already_present, [r.snapshot_id for r in a.added], a.conflicts) == (1, [12], [])
    mapping = get_json(client, "/tables/ods.a/snapshots")["items"]
    assert [s["snapshot_id"] for s in mapping] == [11, 12]


# -- the command line ---------------------------------------------------------------------


def test_cli_reconciles_from_the_catalog_in_the_service_database(
    db_url: str,
    client: TestClient,
    reference: TestClient,
    clock: ManualClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By default the catalog is a pyiceberg SqlCatalog in the MetaService's own database."""
    monkeypatch.delenv("METASERVICE_CATALOG_URI", raising=False)
    warehouse = str(tmp_path / "warehouse")
    lake = Lake(open_catalog(normalise_url(db_url), warehouse))
    restored(client, reference, clock, lake)
    runner = CliRunner()
    args = ["reconcile", "--db", db_url, "--warehouse", warehouse]

    with unchanged(db_url):
        dry = runner.invoke(cli_app, [*args, "--check"])
    assert dry.exit_code == 0, dry.output
    assert "dry run" in dry.output and "would add batch 7 of src" in dry.output
    for table in TABLES:
        assert f"{table} (writer " in dry.output

    done = runner.invoke(cli_app, args)
    assert done.exit_code == 0, done.output
    assert "ods.orders (writer src): 8 stamped, 5 already present, 3 added" in done.output
    assert "empty commit of batch 2 of der" in done.output
    assert "9 added, 0 conflicts" in done.output
    mapping = get_json(client, "/tables/ods.orders/snapshots")["items"]
    assert [s["batch_id"] for s in mapping] == list(range(8))

    lake.append("dw.detail", "der", 0, T0 + 5 * SLOT)  # batch 0 was at another barrier
    with unchanged(db_url):
        bad = runner.invoke(cli_app, args)
    assert bad.exit_code == 1, bad.output
    assert "conflict conflicting_report" in bad.output
    assert "1 conflicts" in bad.output


def test_start_with_reconcile_catches_up_before_serving(
    db_url: str,
    client: TestClient,
    reference: TestClient,
    clock: ManualClock,
    lake: Lake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn

    restored(client, reference, clock, lake)
    served: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda target, **_: served.append(target))
    # start exports its settings for the workers: let monkeypatch restore them
    monkeypatch.setenv("METASERVICE_DB_URL", db_url)
    monkeypatch.setenv("METASERVICE_BARRIER_INTERVAL_MS", "1000")
    catalog_db = tmp_path / "catalog.db"
    monkeypatch.setenv("METASERVICE_CATALOG_URI", f"sqlite:///{catalog_db}")
    result = CliRunner().invoke(cli_app, ["start", "--db", db_url, "--reconcile"])
    assert result.exit_code == 0, result.output
    assert "9 added, 0 conflicts" in result.output
    assert served == ["metaservice.app:create_app"]
    mapping = get_json(client, "/tables/dw.detail/snapshots")["items"]
    assert [s["batch_id"] for s in mapping] == [0, 1, 2, 3, 4]
