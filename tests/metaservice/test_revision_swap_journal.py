"""The swap through a catalog outside the MetaService's database (a real pyiceberg SQL
catalog in its own SQLite file), with a fault at each of its catalog calls in turn.

Every case starts from the same ready revision: prepared once per kind of database by a
test process, and put back from copies for its next cases (:func:`prepare`).

The catalog stays real: a subclass of pyiceberg's ``SqlCatalog`` raises once at the N-th
call the swap makes (before the call, or after it, as a reply lost on the way back).
After the fault the test tries what an operator or a schedule would (expiry, cancel),
then retries the swap, and checks that the catalog and the MetaService agree, that
nothing a snapshot or tag still uses was deleted, and that a reader of a consistent
version never read the old tables' data under the new version.

The pipeline is test_revisions': revising dw.detail affects dw.detail and dws.summary.
"""

from __future__ import annotations

import copy
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy.engine import make_url

from metaservice.catalog_loading import open_catalog, sql_catalog_properties
from metaservice.clock import ManualClock
from metaservice.lifecycle.expiry import CatalogUnavailable
from metaservice.lifecycle.iceberg import CATALOG_NAME
from metaservice.revisions import swap as swap_module
from metaservice.settings import Settings
from tests.metaservice.helpers import API, consistent, custom_client, get_json
from tests.metaservice.test_expiry import Lake, Written, lake_for, local, reachable, services
from tests.metaservice.test_revision_swap import catch_up, ready_revision_with_history
from tests.metaservice.test_revisions import catalog_tables
from tests.migrated import Rows, pg_put_rows, pg_rows

AFFECTED = ["dw.detail", "dws.summary"]
ALL = ["ods.orders", "ods.items", *AFFECTED]


class Injected(OSError):
    """The fault the test injects: the catalog is unreachable."""


@dataclass
class Faults:
    """Which call fails: the ``at``-th (1-based; None: none), raising before the call,
    or after it (``after``: the call took effect, its reply was lost)."""

    at: int | None = None
    after: bool = False
    calls: list[str] = field(default_factory=list)

    def call(self, what: str, real: Callable[[], Any]) -> Any:
        self.calls.append(what)
        failing = len(self.calls) == self.at
        if failing and not self.after:
            raise Injected(f"catalog unreachable at call {self.at} ({what})")
        done = real()
        if failing:
            raise Injected(f"reply lost at call {self.at} ({what})")
        return done


def faulty_loader(properties: dict[str, str], faults: Faults) -> Callable[[Settings], Catalog]:
    class Faulty(SqlCatalog):
        def load_table(self, identifier: Any) -> Any:
            return faults.call(
                f"load {identifier}", lambda: super(Faulty, self).load_table(identifier)
            )

        def rename_table(self, source: Any, target: Any) -> Any:
            return faults.call(
                f"rename {source} -> {target}",
                lambda: super(Faulty, self).rename_table(source, target),
            )

        def drop_table(self, identifier: Any) -> None:
            faults.call(f"drop {identifier}", lambda: super(Faulty, self).drop_table(identifier))

    def load(_: Settings) -> Catalog:
        return Faulty(CATALOG_NAME, **{**properties, "init_catalog_tables": "false"})

    return load


@dataclass(frozen=True)
class Ready:
    rid: int
    old: dict[str, list[int]]  # each affected table's rows before the swap
    new: dict[str, list[int]]  # its mirror's rows: what the table reads after it
    tagged: dict[str, int]  # the tag "before" (published on the old tables)
    barrier: int  # the revision's
    read_before: dict[str, list[int] | None]  # the consistent version's rows before the swap


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` made, kept for the next test on the same kind of database
    (preparing took two thirds of each case): copies of the catalog, the warehouse and
    the MetaService's database, with the clock and the lake's record of what it wrote."""

    files: Path  # catalog.db and wh/ (the warehouse), as the folder held them
    database: Path | Rows  # the MetaService's SQLite file, or its PostgreSQL rows
    now_ms: int
    written: dict[str, list[Written]]
    catalog: dict[str, str]  # the catalog's tables and their metadata files
    ready: Ready


_prepared: dict[str, Prepared] = {}  # by kind of database, in this test process


@dataclass
class Outside:
    """The service with its catalog in a SQLite file of its own, and that catalog."""

    client: TestClient
    lake: Lake
    catalog: Catalog
    properties: dict[str, str]
    folder: Path  # the catalog's file and warehouse
    db_url: str
    prepared: Prepared | None  # an earlier test's, which this test starts from


def _kind(db_url: str) -> str:
    return "sqlite" if db_url.startswith("sqlite") else "postgres"


@pytest.fixture
def outside(
    db_url: str, clock: ManualClock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Outside]:
    # The catalog's metadata names its files by absolute path, so every test on one
    # kind of database uses the same folder: emptied, or put back as prepared.
    folder = tmp_path_factory.getbasetemp() / f"swap-journal-{_kind(db_url)}"
    shutil.rmtree(folder, ignore_errors=True)
    prepared = _prepared.get(_kind(db_url))
    if prepared is None:
        folder.mkdir()
    else:
        shutil.copytree(prepared.files, folder)
        _put_database(db_url, prepared.database)
        clock.set(prepared.now_ms)
    properties = sql_catalog_properties(f"sqlite:///{folder / 'catalog.db'}", str(folder / "wh"))
    elsewhere = open_catalog(properties["uri"], properties["warehouse"])
    try:
        settings = Settings(db_url=db_url, catalog_properties=properties)
        assert swap_module.catalog_in_database(settings) is None
        with custom_client(
            db_url, clock, catalog_properties=properties, revision_ready_lag_ms=0
        ) as client:
            lake = lake_for(client, elsewhere, clock)
            if prepared is not None:
                lake.written = copy.deepcopy(prepared.written)
            yield Outside(client, lake, elsewhere, properties, folder, db_url, prepared)
    finally:
        elsewhere.engine.dispose()  # type: ignore[attr-defined]


def _sqlite_file(db_url: str) -> Path:
    return Path(make_url(db_url).database or "")


def _copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database, whatever its journal holds."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def _put_database(db_url: str, database: Path | Rows) -> None:
    if isinstance(database, Path):
        _copy_sqlite(database, _sqlite_file(db_url))
    else:
        pg_put_rows(db_url, database)


def prepare(o: Outside) -> Ready:
    """The revision ready, every mirror caught up with its original, and a tag on the
    originals' consistent version: as an earlier test of this process prepared it, else
    made here and kept for the next."""
    if o.prepared is not None:
        # put back whole: the catalog's tables and the version read as when prepared
        assert catalog_view(o) == o.prepared.catalog
        assert read_version(o) == o.prepared.ready.read_before
        return o.prepared.ready
    ready = _prepare(o)
    files = o.folder.with_name(f"{o.folder.name}-prepared")
    shutil.rmtree(files, ignore_errors=True)
    shutil.copytree(o.folder, files, ignore=shutil.ignore_patterns("catalog.db*"))
    _copy_sqlite(o.folder / "catalog.db", files / "catalog.db")
    database: Path | Rows
    if _kind(o.db_url) == "sqlite":
        database = files.with_name(f"{files.name}-metaservice.db")
        _copy_sqlite(_sqlite_file(o.db_url), database)
    else:
        database = pg_rows(o.db_url)
    written = copy.deepcopy(o.lake.written)
    now = o.lake.clock.now_ms()
    _prepared[_kind(o.db_url)] = Prepared(files, database, now, written, catalog_view(o), ready)
    return ready


def _prepare(o: Outside) -> Ready:
    _, version, rid, batch_id = ready_revision_with_history(o.client, o.lake)
    catch_up(o.client, o.lake, rid, batch_id)
    tag = o.client.post(f"{API}/versions/tags", json={"name": "before", "tables": AFFECTED})
    assert tag.status_code == 201, tag.text
    tagged = tag.json()["snapshots"]
    old = {t: current_rows(o.catalog, t) for t in AFFECTED}
    new = {t: current_rows(o.catalog, f"{t}__rev{rid}") for t in AFFECTED}
    assert all(old[t] != new[t] for t in AFFECTED)
    return Ready(rid, old, new, tagged, version["barrier"], read_version(o))


def current_rows(catalog: Catalog, name: str) -> list[int]:
    return sorted(catalog.load_table(name).scan().to_arrow()["n"].to_pylist())


def swap_with(o: Outside, rid: int, faults: Faults) -> Any:
    svc = services(o.client)
    return swap_module.swap_revision(
        svc.db, svc.ctx, rid, 10, load_catalog=faulty_loader(o.properties, faults)
    )


def swap(o: Outside, rid: int) -> Any:
    return o.client.post(f"{API}/revisions/{rid}/swap", json={"wait_seconds": 10})


def names(rid: int) -> list[str]:
    return [n for t in AFFECTED for n in (t, f"{t}__pre_rev{rid}", f"{t}__rev{rid}")]


def read_version(o: Outside) -> dict[str, list[int] | None]:
    """Each affected table read through the catalog at the MetaService's consistent
    version, as a reader of the version reads it (None: the read fails)."""
    version = consistent(o.client, ",".join(AFFECTED)).json()
    rows: dict[str, list[int] | None] = {}
    for table in AFFECTED:
        try:
            t = o.catalog.load_table(table)
            rows[table] = sorted(
                t.scan(snapshot_id=version["snapshots"][table]).to_arrow()["n"].to_pylist()
            )
        except Exception:
            rows[table] = None
    return rows


def missing_files(o: Outside) -> list[str]:
    """Files some snapshot (or tag) of a catalog table still reaches that are gone."""
    gone = []
    for name in catalog_tables(o.catalog):
        for path in reachable(o.catalog.load_table(name)):
            if not Path(local(path)).exists():
                gone.append(f"{name}: {path}")
    return gone


def catalog_view(o: Outside) -> dict[str, str]:
    return {n: o.catalog.load_table(n).metadata_location for n in catalog_tables(o.catalog)}


def assert_agree(o: Outside, r: Ready) -> None:
    """The catalog has the tables the MetaService names, each with every snapshot the
    MetaService lists for it, the swapped-in tables being the mirrors."""
    tables = {t["name"] for t in get_json(o.client, "/tables?limit=100")["items"]}
    assert set(catalog_tables(o.catalog)) == tables, (catalog_tables(o.catalog), tables)
    for name in sorted(tables):
        t = o.catalog.load_table(name)
        listed = get_json(o.client, f"/tables/{name}/snapshots")["items"]
        assert {s["snapshot_id"] for s in listed} <= {s.snapshot_id for s in t.snapshots()}, name
    for table in AFFECTED:
        props = o.catalog.load_table(table).metadata.properties
        assert props.get("metaservice.revision") == str(r.rid), table
        assert o.catalog.load_table(f"{table}__pre_rev{r.rid}").metadata.properties.get(
            "metaservice.revision"
        ) != str(r.rid)


def swap_calls(o: Outside) -> list[str]:
    """The catalog calls of a swap with no fault (a run of its own)."""
    r = prepare(o)
    faults = Faults()
    assert swap_with(o, r.rid, faults).state == "swapped"
    return faults.calls


# The calls a swap of this revision makes: 6 lookups before the records are swapped, then
# four renames (two originals away, two mirrors in), each a step of 5 calls: the target
# and the source looked up, the rename (pyiceberg's loads the table renamed, a 4th call),
# and the target looked up again.
SWAP_CALLS = 6 + 4 * 5
RENAMES = [6 + 5 * i + 3 for i in range(4)]  # the renames' positions: 9, 14, 19, 24


def test_the_swap_makes_the_calls_the_fault_cases_count(outside: Outside) -> None:
    calls = swap_calls(outside)
    assert len(calls) == SWAP_CALLS, "\n".join(calls)
    assert [i + 1 for i, c in enumerate(calls) if c.startswith("rename")] == RENAMES, calls
    assert [c for c in calls if c.startswith("rename")] == [
        "rename dw.detail -> dw.detail__pre_rev1",
        "rename dws.summary -> dws.summary__pre_rev1",
        "rename dw.detail__rev1 -> dw.detail",
        "rename dws.summary__rev1 -> dws.summary",
    ]


CASES = [(n, False) for n in range(1, SWAP_CALLS + 1)] + [(n, True) for n in RENAMES]


@pytest.mark.parametrize(
    ("at", "after"), CASES, ids=[f"{'lost' if a else 'call'}{n}" for n, a in CASES]
)
def test_a_fault_at_any_catalog_call_of_the_swap_is_finished_by_a_retry(
    outside: Outside, at: int, after: bool
) -> None:
    o = outside
    r = prepare(o)
    before_tag = {t: o.catalog.load_table(t).metadata.refs["before"].snapshot_id for t in AFFECTED}
    assert before_tag == r.tagged

    with pytest.raises(CatalogUnavailable) as failed:
        swap_with(o, r.rid, Faults(at=at, after=after))

    state = get_json(o.client, f"/revisions/{r.rid}")["state"]
    seen = read_version(o)
    if state == "swapped":
        assert at > 6
        # a reader of the version reads the new tables' rows, or fails: never the old ones
        assert all(rows is None or rows == r.new[t] for t, rows in seen.items()), seen
        for name in names(r.rid):
            refused = o.client.post(f"{API}/tables/{name}/expire", json=None)
            assert refused.status_code == 409, (name, refused.text)
            assert refused.json()["code"] == "swap_unfinished", refused.text
            assert f"revision {r.rid}" in refused.json()["message"]
        again = o.client.post(
            f"{API}/revisions", json={"table": "dw.detail", "from_barrier": r.barrier}
        )
        assert again.status_code == 409, again.text
        assert again.json()["code"] == "swap_unfinished", again.text
        cancel = o.client.delete(f"{API}/revisions/{r.rid}")
        assert cancel.status_code == 409, cancel.text
        assert cancel.json()["code"] == "revision_swapped"
        assert "unfinished" in cancel.json()["message"]
    else:  # a lookup before the records were swapped failed: nothing was swapped
        assert (state, at <= 6) == ("swapping", True)
        assert seen == r.read_before
    assert missing_files(o) == []
    assert f"POST /api/v1/revisions/{r.rid}/swap again" in failed.value.message

    done = swap(o, r.rid)
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "swapped"
    assert_agree(o, r)
    assert read_version(o) == r.new
    catalog_after = catalog_view(o)

    # a second swap changes nothing and answers the same
    repeated = swap(o, r.rid)
    assert (repeated.status_code, repeated.json()) == (200, done.json())
    assert catalog_view(o) == catalog_after

    # expiry of every table is allowed again, and deletes nothing still used
    for name in sorted({t["name"] for t in get_json(o.client, "/tables?limit=100")["items"]}):
        expired = o.client.post(f"{API}/tables/{name}/expire", json=None)
        assert expired.status_code == 200, (name, expired.text)
    assert missing_files(o) == []
    assert read_version(o) == r.new
    for table in AFFECTED:  # the tag stays on the old table, readable
        old = o.catalog.load_table(f"{table}__pre_rev{r.rid}")
        assert old.metadata.refs["before"].snapshot_id == r.tagged[table]
        rows = sorted(old.scan(snapshot_id=r.tagged[table]).to_arrow()["n"].to_pylist())
        assert (
            rows
            == o.lake.written[table][
                [w.snapshot_id for w in o.lake.written[table]].index(r.tagged[table])
            ].rows
        )
    expired_view = catalog_view(o)
    cancel = o.client.delete(f"{API}/revisions/{r.rid}")
    assert cancel.status_code == 409 and cancel.json()["code"] == "revision_swapped", cancel.text
    assert catalog_view(o) == expired_view


def test_a_second_swap_after_success_changes_nothing(outside: Outside) -> None:
    o = outside
    r = prepare(o)
    first = swap(o, r.rid)
    assert first.status_code == 200, first.text
    after = catalog_view(o)

    faults = Faults()
    assert swap_with(o, r.rid, faults).state == "swapped"

    assert faults.calls == []  # nothing left to do: the catalog is not even asked
    assert catalog_view(o) == after
    assert swap(o, r.rid).json() == first.json()
    assert_agree(o, r)


def test_a_catalog_changed_by_hand_mid_swap_is_409_swap_blocked_until_fixed(
    outside: Outside,
) -> None:
    o = outside
    r = prepare(o)
    # the originals are renamed away (calls 9 and 13), then the catalog fails
    with pytest.raises(CatalogUnavailable):
        swap_with(o, r.rid, Faults(at=17))
    # someone puts a table where the mirror is to go
    o.catalog.rename_table(f"dw.detail__pre_rev{r.rid}", "dw.detail")

    blocked = swap(o, r.rid)

    assert blocked.status_code == 409, blocked.text
    assert blocked.json()["code"] == "swap_blocked"
    assert "dw.detail" in blocked.json()["message"]
    # moved back, the retry finishes the same renames
    o.catalog.rename_table("dw.detail", f"dw.detail__pre_rev{r.rid}")
    assert swap(o, r.rid).status_code == 200
    assert_agree(o, r)
    assert read_version(o) == r.new


def test_a_swap_is_refused_before_the_records_change_when_the_catalog_lacks_a_table(
    outside: Outside,
) -> None:
    o = outside
    r = prepare(o)
    o.catalog.rename_table("dws.summary__rev1", "dws.elsewhere")

    refused = swap(o, r.rid)

    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "not_in_catalog"
    assert get_json(o.client, f"/revisions/{r.rid}")["state"] == "swapping"
    assert read_version(o) == r.read_before  # nothing swapped
    # the revision can still be cancelled, as nothing was swapped
    o.catalog.rename_table("dws.elsewhere", "dws.summary__rev1")
    cancelled = o.client.delete(f"{API}/revisions/{r.rid}")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    assert set(catalog_tables(o.catalog)) == {"ods.feed", "ods.items", *ALL}
