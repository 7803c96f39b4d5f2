"""The Iceberg REST catalog at /iceberg: engines read every table at one consistent version.

A real pipeline on real Iceberg tables (stamped pyiceberg commits of Parquet files, as the
sink makes them): ``src`` appends amounts to ods.orders, ``tot`` keeps dws.total = the sum
of ods.orders' amounts. The invariant "total == sum(amounts)" holds at every consistent
version and, since ``src`` runs ahead, usually not on the latest snapshots. Engines read
through a real HTTP server: pyiceberg's RestCatalog and DuckDB's iceberg extension.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("pyiceberg")
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.serializers import FromInputFile
from typer.testing import CliRunner

from metaservice.app import create_app
from metaservice.auth.schemas import Role
from metaservice.catalog_loading import open_catalog
from metaservice.cli import app as cli_app
from metaservice.clock import ManualClock
from metaservice.settings import Settings
from tests.metaservice.helpers import API, SLOT, barrier, commit, put_job
from tests.metaservice.live_server import LiveServer
from tests.metaservice.test_auth import issue
from tests.metaservice.test_expiry import Lake

ORDERS, TOTAL = "ods.orders", "dws.total"
# The engines' tests run on SQLite only: what an engine reads is the same whichever
# database the service keeps its sessions in, which the other tests cover on both.
ENGINE_ON_SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


class Pipeline:
    """The service on a real socket, its jobs' catalog, and the two jobs."""

    def __init__(self, http: httpx.Client, lake: Lake, url: str) -> None:
        self.http, self.lake, self.url = http, lake, url
        self.batches = {"src": 0, "tot": 0}
        put_job(http, "src", [ORDERS])
        put_job(http, "tot", [TOTAL], inputs=[ORDERS])

    def source(self, amount: int) -> None:
        self.lake.batch("src", self._next("src"), ORDERS, [amount])

    def derive(self) -> int:
        """One batch of ``tot``: the sum of ods.orders at the batch's barrier."""
        batch_id = self._next("tot")
        b = barrier(self.http, "tot", batch_id)["barrier"]
        upto = [w for w in self.lake.written[ORDERS] if w.barrier <= b]
        total = sum(upto[-1].rows) if upto else 0
        written = self.lake.commit(TOTAL, _stamp(b, "tot", batch_id), b, [total], replace=True)
        commit(self.http, "tot", batch_id, b, TOTAL, written.snapshot_id)
        self.lake.clock.advance(SLOT)
        return b

    def _next(self, job: str) -> int:
        self.batches[job] += 1
        return self.batches[job] - 1

    def rest(self, warehouse: str = "consistent", **props: str) -> RestCatalog:
        return RestCatalog("ms", uri=self.url + "/iceberg", warehouse=warehouse, **props)


def _stamp(b: int, job: str, batch_id: int) -> dict[str, str]:
    from metaservice.contract import encode_stamp

    return encode_stamp(b, job, batch_id)


def run(pipeline: Pipeline, rounds: int) -> None:
    """``rounds`` of two source batches and one derived batch: ods runs ahead."""
    for i in range(rounds):
        pipeline.source(10 * i + 1)
        pipeline.derive()
        pipeline.source(10 * i + 2)


def amounts(catalog: Catalog) -> tuple[list[int], int]:
    orders = catalog.load_table(ORDERS).scan().to_arrow()["n"].to_pylist()
    total = catalog.load_table(TOTAL).scan().to_arrow()["n"].to_pylist()
    return sorted(orders), (total[0] if total else 0)


@pytest.fixture
def served(db_url: str, tmp_path: Path, clock: ManualClock) -> Iterator[tuple[Settings, str]]:
    settings = Settings(db_url=db_url, warehouse=str(tmp_path / "warehouse"))
    with LiveServer(create_app(settings, clock)) as server:
        yield settings, server.url


@pytest.fixture
def jobs_catalog(db_url: str, tmp_path: Path) -> Iterator[Catalog]:
    opened = open_catalog(db_url, str(tmp_path / "warehouse"))
    yield opened
    opened.engine.dispose()  # type: ignore[attr-defined]


@pytest.fixture
def pipeline(
    served: tuple[Settings, str], jobs_catalog: Catalog, clock: ManualClock
) -> Iterator[Pipeline]:
    _, url = served
    with httpx.Client(base_url=url, timeout=30) as http:
        lake = Lake(
            jobs_catalog,
            report=lambda *r: commit(http, *r),
            ask=lambda job, batch_id: barrier(http, job, batch_id)["barrier"],
            clock=clock,
        )
        yield Pipeline(http, lake, url)


def version(pipeline: Pipeline, **params: Any) -> dict[str, Any]:
    r = pipeline.http.get(
        f"{API}/versions/consistent", params={"tables": f"{ORDERS},{TOTAL}", **params}
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# -- reading at one version -------------------------------------------------------------------


def test_pyiceberg_reads_every_table_at_the_consistent_version(pipeline: Pipeline) -> None:
    run(pipeline, 3)
    latest_orders = sorted(pipeline.lake.written[ORDERS][-1].rows)
    assert sum(latest_orders) != pipeline.lake.written[TOTAL][-1].rows[0]  # latest disagree
    expected = version(pipeline)

    rest = pipeline.rest()
    orders, total = amounts(rest)
    assert sum(orders) == total
    assert rest.load_table(ORDERS).metadata.current_snapshot_id == expected["snapshots"][ORDERS]
    assert rest.load_table(TOTAL).metadata.current_snapshot_id == expected["snapshots"][TOTAL]
    assert rest.list_namespaces() == [("dws",), ("ods",)]
    assert rest.list_tables("ods") == [("ods", "orders")]
    assert rest.table_exists(TOTAL) and not rest.table_exists("ods.nothing")
    assert rest.namespace_exists("dws") and not rest.namespace_exists("nope")

    # The session's version stays put while the jobs go on; a new session moves on.
    run(pipeline, 2)
    assert amounts(rest) == (orders, total)
    newer = pipeline.rest()
    orders2, total2 = amounts(newer)
    assert sum(orders2) == total2 and total2 > total


def test_pinned_metadata_names_nothing_after_the_version(pipeline: Pipeline) -> None:
    run(pipeline, 3)
    expected = version(pipeline)
    rest = pipeline.rest()
    run(pipeline, 1)  # later snapshots exist in the table now
    table = rest.load_table(ORDERS)
    md = table.metadata
    pinned_id = expected["snapshots"][ORDERS]
    pinned = md.snapshot_by_id(pinned_id)
    assert pinned is not None and md.current_snapshot_id == pinned_id
    assert md.refs["main"].snapshot_id == pinned_id and set(md.refs) == {"main"}
    committed = [w.snapshot_id for w in pipeline.lake.written[ORDERS]]
    later = committed[committed.index(pinned_id) + 1 :]
    assert later and not {s.snapshot_id for s in md.snapshots} & set(later)
    assert [e.snapshot_id for e in md.snapshot_log][-1] == pinned_id
    # The jobs' clock runs at T0 while pyiceberg stamps commits with the real time: a
    # writer ahead of the readers. Nothing in the pinned metadata is after the barrier.
    assert md.last_updated_ms <= min(pinned.timestamp_ms, expected["barrier"])
    assert all(e.timestamp_ms <= md.last_updated_ms for e in md.snapshot_log)
    assert all(s.timestamp_ms <= md.last_updated_ms for s in md.snapshots)

    # The same metadata is a file in the table's metadata folder, under a name no engine
    # takes for the latest; deleted, it is written again at the next load.
    location = table.metadata_location
    assert location.startswith(md.location + "/metadata/00000-00000000-")
    folder = sorted(p.name for p in Path(location.removeprefix("file://")).parent.iterdir())
    assert folder[0] == Path(location).name  # the lowest version: never taken for the latest
    on_disk = FromInputFile.table_metadata(table.io.new_input(location))
    assert on_disk.current_snapshot_id == pinned_id and on_disk.snapshots == md.snapshots
    Path(location.removeprefix("file://")).unlink()
    again = rest.load_table(ORDERS)
    assert again.metadata_location == location and Path(location.removeprefix("file://")).exists()


def test_at_and_tag_warehouses_read_their_versions(pipeline: Pipeline) -> None:
    run(pipeline, 2)
    early = version(pipeline)
    r = pipeline.http.post(
        f"{API}/versions/tags", json={"name": "early", "tables": [ORDERS, TOTAL]}
    )
    assert r.status_code in (200, 201), r.text
    run(pipeline, 3)
    for warehouse in (f"at:{early['barrier']}", "tag:early"):
        rest = pipeline.rest(warehouse)
        assert rest.load_table(ORDERS).metadata.current_snapshot_id == early["snapshots"][ORDERS]
        orders, total = amounts(rest)
        assert sum(orders) == total, warehouse
    at_iso = pipeline.rest("at:2023-11-14T22:13:22Z")  # T0 + 2 s, as ISO-8601
    barrier_ms = version(pipeline, at_or_before=1_700_000_002_000)["barrier"]
    assert (
        at_iso.load_table(ORDERS).metadata.current_snapshot_id
        == version(pipeline, at_or_before=barrier_ms)["snapshots"][ORDERS]
    )


def test_a_table_empty_at_the_version_reads_as_empty(pipeline: Pipeline) -> None:
    put_job(pipeline.http, "other", ["ods.later"])
    pipeline.lake.table("ods.later")  # made in the catalog, not yet committed to
    run(pipeline, 2)
    rest = pipeline.rest()  # ods.later is empty at this version
    pipeline.lake.batch("other", 0, "ods.later", [7])
    later = rest.load_table("ods.later")
    assert later.metadata.current_snapshot_id is None
    assert later.scan().to_arrow().num_rows == 0
    orders, total = amounts(rest)
    assert sum(orders) == total
    run(pipeline, 3)  # the version passes the batch of ods.later
    assert pipeline.rest().load_table("ods.later").scan().to_arrow()["n"].to_pylist() == [7]


def test_a_session_keeps_its_version_through_an_expiry(pipeline: Pipeline) -> None:
    run(pipeline, 3)
    rest = pipeline.rest()
    before = amounts(rest)
    run(pipeline, 3)
    r = pipeline.http.post(f"{API}/tables/{ORDERS}/expire")
    assert r.status_code == 200, r.text
    assert r.json()["snapshots"], r.json()  # older snapshots went, the session's stayed
    assert amounts(rest) == before


# -- DuckDB ------------------------------------------------------------------------------------


def duckdb_attached(url: str, warehouse: str, token: str | None = None) -> Any:
    duckdb = pytest.importorskip("duckdb")
    extensions = pytest.importorskip("duckdb_extensions")
    con = duckdb.connect()
    for name in ("httpfs", "avro", "iceberg"):
        extensions.import_extension(name, con)
    if token is None:
        auth = "AUTHORIZATION_TYPE 'none'"
    else:
        con.execute(f"CREATE SECRET ms_token (TYPE iceberg, TOKEN '{token}')")
        auth = "SECRET ms_token"
    con.execute(f"ATTACH '{warehouse}' AS ms (TYPE iceberg, ENDPOINT '{url}/iceberg', {auth})")
    return con


@ENGINE_ON_SQLITE
def test_duckdb_joins_the_tables_at_the_consistent_version(pipeline: Pipeline) -> None:
    run(pipeline, 3)
    con = duckdb_attached(pipeline.url, "consistent")
    ((orders_sum, total),) = con.execute(
        "SELECT (SELECT sum(n) FROM ms.ods.orders), (SELECT max(n) FROM ms.dws.total)"
    ).fetchall()
    assert orders_sum == total
    run(pipeline, 2)
    assert con.execute("SELECT sum(n) FROM ms.ods.orders").fetchall() == [(orders_sum,)]


@ENGINE_ON_SQLITE
def test_the_duckdb_lines_metaservice_catalog_prints_attach_and_read(pipeline: Pipeline) -> None:
    run(pipeline, 2)
    printed = CliRunner().invoke(
        cli_app,
        ["catalog", "--engine", "duckdb", "--url", pipeline.url, "--warehouse", "consistent"],
    )
    assert printed.exit_code == 0, printed.output
    (attach,) = [line.strip() for line in printed.output.splitlines() if "ATTACH" in line]
    con = duckdb_attached(pipeline.url, "consistent")
    con.execute("DETACH ms")
    con.execute(attach)
    ((orders_sum, total),) = con.execute(
        "SELECT (SELECT sum(n) FROM ms.ods.orders), (SELECT max(n) FROM ms.dws.total)"
    ).fetchall()
    assert orders_sum == total


@ENGINE_ON_SQLITE
def test_duckdb_reads_with_a_reader_token_when_auth_is_on(
    db_url: str, tmp_path: Path, clock: ManualClock, jobs_catalog: Catalog
) -> None:
    settings = Settings(db_url=db_url, warehouse=str(tmp_path / "warehouse"), auth_required=True)
    admin, reader = issue(db_url, Role.ADMIN), issue(db_url, Role.READER)
    with (
        LiveServer(create_app(settings, clock)) as server,
        httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
        ) as http,
    ):
        lake = Lake(
            jobs_catalog,
            report=lambda *r: commit(http, *r),
            ask=lambda job, batch_id: barrier(http, job, batch_id)["barrier"],
            clock=clock,
        )
        run(Pipeline(http, lake, server.url), 2)
        con = duckdb_attached(server.url, "consistent", token=reader)
        ((orders_sum, total),) = con.execute(
            "SELECT (SELECT sum(n) FROM ms.ods.orders), (SELECT max(n) FROM ms.dws.total)"
        ).fetchall()
        assert orders_sum == total
        with pytest.raises(Exception, match=r"401|[Uu]nauthori"):
            duckdb_attached(server.url, "consistent")


# -- ClickHouse (chdb) -------------------------------------------------------------------------

# ClickHouse reads local files only under its user_files_path, "." for chdb: the query
# runs in a process of its own started in "/", so the test's warehouse is inside it.
CHDB_QUERY = """
import sys
from chdb import session
s = session.Session()
s.query("SET allow_experimental_database_iceberg = 1")
s.query(
    f"CREATE DATABASE ms ENGINE = DataLakeCatalog('{sys.argv[1]}') SETTINGS "
    f"catalog_type = 'rest', warehouse = '{sys.argv[2]}', vended_credentials = 0"
)
print(s.query(sys.argv[3], "CSV"), end="")
"""


def chdb_rows(url: str, warehouse: str, sql: str) -> list[str]:
    pytest.importorskip("chdb")
    done = subprocess.run(
        [sys.executable, "-c", CHDB_QUERY, url + "/iceberg/v1", warehouse, sql],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


@ENGINE_ON_SQLITE
def test_clickhouse_reads_the_tables_at_the_consistent_version(pipeline: Pipeline) -> None:
    run(pipeline, 3)
    early = version(pipeline)
    r = pipeline.http.post(f"{API}/versions/tags", json={"name": "ch", "tables": [ORDERS, TOTAL]})
    assert r.status_code in (200, 201), r.text
    run(pipeline, 2)
    sql = "SELECT (SELECT sum(n) FROM ms.`ods.orders`), (SELECT max(n) FROM ms.`dws.total`)"
    for warehouse in ("consistent", f"at:{early['barrier']}", "tag:ch"):
        (row,) = chdb_rows(pipeline.url, warehouse, sql)
        orders_sum, total = row.split(",")
        assert orders_sum == total, (warehouse, row)
    (early_row,) = chdb_rows(pipeline.url, "tag:ch", sql)
    (at_tag,) = [
        w for w in pipeline.lake.written[TOTAL] if w.snapshot_id == early["snapshots"][TOTAL]
    ]
    assert int(early_row.split(",")[1]) == at_tag.rows[0]  # the tag's, not the latest


# -- errors, auth and writes ----------------------------------------------------------------


def spec_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == status, body
    assert body["error"]["type"] == kind, body
    return str(body["error"]["message"])


def test_config_lists_what_is_served_and_errors_have_the_specs_form(pipeline: Pipeline) -> None:
    run(pipeline, 2)
    http = pipeline.http
    config = http.get("/iceberg/v1/config").json()
    assert set(config) == {"defaults", "overrides", "endpoints"}
    prefix = config["overrides"]["prefix"]
    assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}" in config["endpoints"]
    assert not [e for e in config["endpoints"] if not e.startswith(("GET ", "HEAD "))]
    base = f"/iceberg/v1/{prefix}"

    message = spec_error(
        http.get("/iceberg/v1/config", params={"warehouse": "latest"}), 400, "BadRequestException"
    )
    assert "consistent" in message and "tag:" in message
    spec_error(
        http.get("/iceberg/v1/config", params={"warehouse": "tag:none"}), 400, "BadRequestException"
    )
    spec_error(http.get(f"{base}/namespaces/nope/tables"), 404, "NoSuchNamespaceException")
    spec_error(http.get(f"{base}/namespaces/ods/tables/nope"), 404, "NoSuchTableException")
    spec_error(http.get("/iceberg/v1/not-a-session/namespaces"), 400, "BadRequestException")
    assert http.head(f"{base}/namespaces/ods/tables/orders").status_code == 204
    assert http.head(f"{base}/namespaces/ods/tables/nope").status_code == 404
    for method, path in (
        ("POST", f"{base}/namespaces"),
        ("POST", f"{base}/namespaces/ods/tables"),
        ("POST", f"{base}/namespaces/ods/tables/orders"),
        ("DELETE", f"{base}/namespaces/ods/tables/orders"),
        ("POST", f"{base}/tables/rename"),
        ("GET", f"{base}/namespaces/ods/views"),
    ):
        r = http.request(method, path, json={})
        assert "read-only" in spec_error(r, 406, "UnsupportedOperationException"), (method, path)

    rest = pipeline.rest()
    with pytest.raises(NoSuchTableError):
        rest.load_table("ods.nope")
    with pytest.raises(NoSuchNamespaceError):
        rest.list_tables("nope")


def test_with_auth_on_a_token_is_required(db_url: str, tmp_path: Path, clock: ManualClock) -> None:
    settings = Settings(db_url=db_url, warehouse=str(tmp_path / "wh"), auth_required=True)
    with LiveServer(create_app(settings, clock)) as server:
        token = issue(db_url, Role.READER)
        # pyiceberg without a token sends "Bearer None": no token, not a server error.
        r = httpx.get(server.url + "/iceberg/v1/config", headers={"Authorization": "Bearer None"})
        assert "token" in spec_error(r, 401, "NotAuthorizedException")
        r = httpx.get(server.url + "/iceberg/v1/config", headers={"Authorization": "Bearer mst_x"})
        spec_error(r, 401, "NotAuthorizedException")
        with pytest.raises(Exception, match="token"):
            RestCatalog("ms", uri=server.url + "/iceberg")
        rest = RestCatalog("ms", uri=server.url + "/iceberg", token=token)
        assert rest.list_namespaces() == []


def test_table_config_hands_out_no_credentials(db_url: str) -> None:
    with pytest.raises(ValueError, match="no credentials"):
        Settings(db_url=db_url, catalog_table_config={"s3.secret-access-key": "x"})
    settings = Settings(db_url=db_url, catalog_table_config={"s3.endpoint": "http://s3:9000"})
    assert json.loads(json.dumps(settings.catalog_table_config)) == {
        "s3.endpoint": "http://s3:9000"
    }


def test_nested_namespaces_are_listed_level_by_level() -> None:
    from metaservice.iceberg_rest import service
    from metaservice.iceberg_rest.repository import SessionTable

    names = ["a.b.t1", "a.b.t2", "a.c.t3", "a.t4", "d.t5"]
    view = service.SessionView(
        warehouse="consistent",
        barrier=1,
        tables=[SessionTable(n, i, n, None, None) for i, n in enumerate(names)],
        renew=False,
    )
    assert service.namespaces(view, ()) == [("a",), ("d",)]
    assert service.namespaces(view, ("a",)) == [("a", "b"), ("a", "c")]
    assert service.namespaces(view, ("a", "b")) == []
    assert service.tables_in(view, ("a", "b")) == ["t1", "t2"]
    assert service.tables_in(view, ("a",)) == ["t4"]
    assert service.table_of(view, ("a", "c"), "t3").name == "a.c.t3"
    with pytest.raises(service.CatalogError, match="namespace 'x'"):
        service.namespaces(view, ("x",))
    with pytest.raises(service.CatalogError, match="not in this catalog session"):
        service.table_of(view, ("a",), "t9")
