"""Any catalog, by its pyiceberg properties, and tables on object storage.

Real parts only: a SQL catalog in the MetaService's database or in a PostgreSQL
database of its own, tables on an S3-compatible server on loopback (moto, see
tests/s3.py), real Spark jobs registered with a real MetaService over HTTP, and
``metaservice reconcile`` run as a command in a fresh interpreter where pyspark
cannot be imported.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog
from pyiceberg.io import load_file_io
from pyiceberg.types import StringType
from sqlalchemy import create_engine, make_url, text

import spark_barrier
from metaservice.contract import encode_stamp
from metaservice.settings import Settings
from spark_barrier import BarrierConfigError
from spark_barrier.iceberg.catalog import (
    CatalogUnavailable,
    load_catalog,
    normalised_properties,
    sql_catalog_properties,
)
from spark_barrier.iceberg.files import delete_folder
from tests.conftest import START_MS, pg_base_url
from tests.s3 import S3Server, closed_port
from tests.spark_barrier.pipeline import NUMBERS_SCHEMA, DrivenSource, Service, ids_of

PG_CATALOG_DATABASE = "metaservice_catalog_test"


# -- the catalog's properties ------------------------------------------------------------


def test_default_catalog_is_the_metaservice_database_and_warehouse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """register() and reconcile default to the MetaService's settings, read from the
    same variables with the same defaults as Settings (without loading it)."""
    for name in ("METASERVICE_DB_URL", "METASERVICE_WAREHOUSE"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert sql_catalog_properties() == {
        "type": "sql",
        "uri": settings.db_url,
        "warehouse": settings.warehouse,
    }
    monkeypatch.setenv("METASERVICE_DB_URL", "postgresql://ms@db/meta")
    monkeypatch.setenv("METASERVICE_WAREHOUSE", "s3://lake/wh")
    settings = Settings()
    assert sql_catalog_properties() == {
        "type": "sql",
        "uri": settings.db_url,
        "warehouse": settings.warehouse,
    }
    assert settings.catalog_properties == {}


def test_an_s3_warehouse_stays_a_uri_and_a_folder_becomes_an_absolute_file_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s3 = normalised_properties({"type": "sql", "uri": "sqlite:///c.db", "warehouse": "s3://b/wh"})
    assert s3["warehouse"] == "s3://b/wh"
    local = normalised_properties({"uri": "postgresql://u@h/db", "warehouse": "tables"})
    assert local["warehouse"] == (tmp_path / "tables").as_uri()
    assert local["uri"] == "postgresql+psycopg://u@h/db"  # the driver installed
    # A REST catalog's warehouse is a name the server resolves, not a folder.
    rest = normalised_properties({"type": "rest", "uri": "http://cat", "warehouse": "prod"})
    assert rest["warehouse"] == "prod"


@pytest.mark.parametrize(
    ("properties", "reason"),
    [
        ({"type": "nessie-ish", "uri": "http://127.0.0.1:1"}, "not a valid CatalogType"),
        ({"type": "sql", "warehouse": "wh"}, "URI missing"),
        (
            {"type": "rest", "uri": f"http://127.0.0.1:{closed_port()}", "token": "t0ps3cret"},
            "Connection",
        ),
    ],
    ids=["unknown type", "no uri", "rest server down"],
)
def test_a_catalog_that_cannot_be_loaded_says_which_properties_to_check(
    properties: dict[str, str], reason: str
) -> None:
    with pytest.raises(CatalogUnavailable) as failed:
        load_catalog(properties)
    message = str(failed.value)
    assert "cannot load the Iceberg catalog 'metaservice'" in message
    assert reason in message and "Check the catalog properties" in message
    assert "t0ps3cret" not in message  # secrets are never shown


# -- reconcile without pyspark -----------------------------------------------------------

# Makes pyspark and py4j uninstallable in the child, like a machine with only the
# server and iceberg extras, then runs the CLI and reports what it loaded.
RECONCILE_WITHOUT_PYSPARK = textwrap.dedent(
    """
    import json, sys
    from importlib.abc import MetaPathFinder

    class NotInstalled(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("pyspark", "py4j"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    import metaservice.reconcile.iceberg
    from metaservice.cli import app
    try:
        app(args=sys.argv[1:], prog_name="metaservice")
        code = 0
    except SystemExit as stop:
        code = stop.code or 0
    spark = sorted(m for m in sys.modules if m.startswith(("pyspark", "py4j")))
    print(json.dumps({"exit": code, "spark_modules": spark}))
    """
)


def run_reconcile(db_url: str, properties: Mapping[str, str], *args: str) -> tuple[int, str]:
    """``metaservice reconcile --db URL --catalog-property K=V ...`` in a fresh interpreter
    without pyspark; its exit code and output. Fails the test if pyspark was loaded."""
    options = [f"--catalog-property={k}={v}" for k, v in properties.items()]
    command = [sys.executable, "-c", RECONCILE_WITHOUT_PYSPARK, "reconcile", "--db", db_url]
    done = subprocess.run(
        [*command, *options, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    *output, last = done.stdout.strip().splitlines() or [""]
    try:
        found = json.loads(last)
    except ValueError:
        pytest.fail(f"reconcile crashed:\n{done.stdout}\n{done.stderr}")
    assert found["spark_modules"] == [], found
    return found["exit"], "\n".join(output) + done.stderr


def metaservice_catalog(service: Service) -> dict[str, str]:
    """The default catalog's properties: SQL, in the MetaService's own database."""
    return {"type": "sql", "uri": service.db_url, "warehouse": service.warehouse}


def s3_sql_catalog(tmp_path: Path, s3: S3Server) -> dict[str, str]:
    """A SQL catalog in a SQLite file of its own, tables on the S3 server under a
    warehouse of the test's own."""
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": s3.warehouse(f"wh-{uuid.uuid4().hex[:8]}"),
        **s3.properties,
    }


def test_a_batch_folder_on_s3_is_deleted_through_the_tables_endpoint(
    s3_server: S3Server, tmp_path: Path
) -> None:
    properties = s3_sql_catalog(tmp_path, s3_server)
    folder = f"{properties['warehouse']}/ods/orders/data/batch-ingest-7-abc"
    io = load_file_io(properties, properties["warehouse"])
    for name in ("a.parquet", "rewrite-1/b.parquet"):
        with io.new_output(f"{folder}/{name}").create() as out:
            out.write(b"not referenced by any snapshot")
    assert len(s3_server.keys(folder)) == 2

    delete_folder(folder, io)  # pyarrow's default S3 endpoint is not the server's

    assert s3_server.keys(folder) == []
    delete_folder(folder, io)  # gone already: quietly nothing


def test_reconcile_reads_the_stamps_of_tables_on_s3_without_pyspark(
    db_url: str, client: TestClient, s3_server: S3Server, tmp_path: Path
) -> None:
    """The configured catalog by its properties (--catalog-property), tables on S3."""
    response = client.put("/api/v1/jobs/load", json={"outputs": ["ods.orders"]})
    assert response.status_code == 201, response.text
    properties = s3_sql_catalog(tmp_path, s3_server)
    catalog = load_catalog(properties)
    catalog.create_namespace("ods")
    schema = pa.schema([pa.field("n", pa.int64())])
    table = catalog.create_table("ods.orders", schema=schema)
    rows = pa.table({"n": [1, 2]}, schema=schema)
    for batch in range(2):
        table.append(rows, snapshot_properties=encode_stamp(START_MS + 1000 * batch, "load", batch))
    assert s3_server.keys(f"{properties['warehouse']}/ods/orders/data")  # on S3

    code, output = run_reconcile(db_url, properties, "--check")
    assert code == 0, output
    assert "ods.orders (writer load): 2 stamped, 0 already present, 2 would add" in output

    code, output = run_reconcile(db_url, properties)
    assert code == 0, output
    assert "2 added, 0 conflicts" in output
    mapping = client.get("/api/v1/tables/ods.orders/snapshots").json()["items"]
    assert [s["snapshot_id"] for s in mapping] == [s.snapshot_id for s in table.snapshots()]


def test_reconcile_with_an_unreachable_catalog_fails_with_the_reason(db_url: str) -> None:
    properties = {"type": "rest", "uri": f"http://127.0.0.1:{closed_port()}"}
    code, output = run_reconcile(db_url, properties)
    assert code == 1
    assert "cannot load the Iceberg catalog" in " ".join(output.split())


# -- registration refuses a catalog it cannot use, and leaves nothing behind --------------

spark_test = pytest.mark.spark


def _catalog_tables(properties: Mapping[str, str]) -> list[tuple[str, ...]]:
    catalog = load_catalog({k: v for k, v in properties.items() if not k.startswith("s3.")})
    return [t for ns in catalog.list_namespaces() for t in catalog.list_tables(ns)]


@spark_test
def test_register_refuses_a_catalog_that_cannot_be_loaded_and_registers_nothing(
    spark, service: Service, tmp_path: Path
) -> None:
    bad = {"type": "sql", "uri": f"postgresql://nobody@127.0.0.1:{closed_port()}/x"}
    with pytest.raises(BarrierConfigError, match="job 'no_catalog' cannot use its Iceberg catalog"):
        spark_barrier.register(
            spark,
            service.url,
            job="no_catalog",
            outputs={"ods.nothing": NUMBERS_SCHEMA},
            catalog_properties=bad,
            state_dir=tmp_path,
        )
    with pytest.raises(Exception, match="not registered"):
        service.client.get_job("no_catalog")


@spark_test
def test_register_refuses_an_unreachable_object_store_and_creates_nothing(
    spark, service: Service, s3_server: S3Server, tmp_path: Path
) -> None:
    properties = {
        **s3_sql_catalog(tmp_path, s3_server),
        "s3.endpoint": f"http://127.0.0.1:{closed_port()}",
    }
    started = time.monotonic()
    with pytest.raises(BarrierConfigError) as failed:
        spark_barrier.register(
            spark,
            service.url,
            job="no_store",
            outputs={"ods.nowhere": NUMBERS_SCHEMA},
            catalog_properties=properties,
            state_dir=tmp_path,
        )
    assert time.monotonic() - started < 60
    message = str(failed.value)
    assert f"cannot write to the warehouse {properties['warehouse']}" in message
    assert "s3.endpoint" in message and "testing" not in message  # keys hidden
    with pytest.raises(Exception, match="not registered"):
        service.client.get_job("no_store")
    assert _catalog_tables(properties) == []


@spark_test
def test_register_refuses_a_missing_bucket(
    spark, service: Service, s3_server: S3Server, tmp_path: Path
) -> None:
    properties = {**s3_sql_catalog(tmp_path, s3_server), "warehouse": "s3://no-such-bucket/wh"}
    with pytest.raises(BarrierConfigError, match=r"no-such-bucket.*the bucket exists"):
        spark_barrier.register(
            spark,
            service.url,
            job="no_bucket",
            outputs={"ods.nowhere": NUMBERS_SCHEMA},
            catalog_properties=properties,
            state_dir=tmp_path,
        )
    assert _catalog_tables(properties) == []


@spark_test
def test_register_refuses_both_catalog_properties_and_the_shorthand(
    spark, service: Service
) -> None:
    with pytest.raises(BarrierConfigError, match="pass the catalog one way"):
        spark_barrier.register(
            spark,
            service.url,
            job="both",
            outputs={"ods.both": NUMBERS_SCHEMA},
            catalog_properties=metaservice_catalog(service),
            warehouse="elsewhere",
        )


# -- jobs end to end on other catalogs ---------------------------------------------------


def _copy_pipeline(
    spark, service: Service, properties: Mapping[str, str], catalog: Catalog
) -> DrivenSource:
    """A source job (driven by the test) writing ods.numbers and a derived job copying
    it to dwd.copy, both registered with ``properties``; runs until the derived job has
    caught up with every source batch."""
    register = dict(catalog_properties=properties, state_dir=service.state_dir)
    source_job = spark_barrier.register(
        spark, service.url, job="src", outputs={"ods.numbers": NUMBERS_SCHEMA}, **register
    )
    source = DrivenSource(
        spark, dataclasses.replace(service, catalog=catalog), "src", "ods.numbers"
    )
    copy = spark_barrier.register(
        spark,
        service.url,
        job="copy",
        inputs=["ods.numbers"],
        outputs={"dwd.copy": NUMBERS_SCHEMA},
        **register,
    )
    query = copy.start(copy.source("ods.numbers"), copy.sink(), trigger_seconds=0.5)
    try:
        for _ in range(4):
            source.batch(rows=5)
            time.sleep(0.3)
        last = max(b for _, b in source.rows)
        deadline = time.monotonic() + 90
        while service.client.get_job("copy").frontier < last and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
        assert service.client.get_job("copy").frontier >= last, "the copy job did not catch up"
    finally:
        spark_barrier.stop_between_batches(query)
        copy.close()
        source_job.close()
    return source


def _assert_consistent_copy(spark, service: Service, catalog: Catalog, source: DrivenSource):  # type: ignore[no-untyped-def]
    read = spark_barrier.read_consistent(
        spark, service.client, catalog, ["ods.numbers", "dwd.copy"]
    )
    expected = sorted(i for i, _ in source.rows)
    assert ids_of(read["ods.numbers"]) == expected
    assert ids_of(read["dwd.copy"]) == expected
    return read


@spark_test
@pytest.mark.slow
def test_barrier_jobs_write_tables_on_s3_and_read_them_back_consistently(
    spark, service: Service, s3_server: S3Server, tmp_path: Path
) -> None:
    """The default SQL catalog (the MetaService's database) with its warehouse on S3:
    driver and executors reach the object store through the catalog's properties."""
    properties = {
        **metaservice_catalog(service),
        "warehouse": s3_server.warehouse(f"wh-{uuid.uuid4().hex[:8]}"),
        **s3_server.properties,
    }
    catalog = load_catalog(properties)
    source = _copy_pipeline(spark, service, properties, catalog)
    _assert_consistent_copy(spark, service, catalog, source)

    for name in ("ods.numbers", "dwd.copy"):
        table = catalog.load_table(name)
        assert table.location().startswith(properties["warehouse"] + "/")
        data = s3_server.keys(f"{table.location()}/data")
        assert data and all(k.endswith(".parquet") for k in data)
        files = {f.file.file_path for f in table.scan().plan_files()}
        assert files and all(f.startswith("s3://") for f in files)
    assert not (Path.cwd() / "s3:").exists()  # no local-path assumption

    code, output = run_reconcile(service.db_url, properties, "--check")
    assert code == 0, output
    numbers = len(catalog.load_table("ods.numbers").snapshots())
    assert f"ods.numbers (writer src): {numbers} stamped, {numbers} already present, 0" in output


@pytest.fixture
def pg_catalog_url() -> Iterator[str]:
    """A schema of its own in PostgreSQL database ``metaservice_catalog_test`` (created
    when missing), apart from the MetaService's database; dropped afterwards."""
    base = pg_base_url()
    if base is None:
        pytest.skip("set METASERVICE_TEST_PG_URL to run the PostgreSQL tests")
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": PG_CATALOG_DATABASE}
        ).first()
        if exists is None:
            conn.execute(text(f"CREATE DATABASE {PG_CATALOG_DATABASE}"))
    admin.dispose()
    url = make_url(base).set(database=PG_CATALOG_DATABASE)
    catalog_admin = create_engine(url, isolation_level="AUTOCOMMIT")
    schema = "c_" + uuid.uuid4().hex[:12]
    with catalog_admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )
    finally:
        with catalog_admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        catalog_admin.dispose()


@spark_test
@pytest.mark.slow
@pytest.mark.postgres
def test_barrier_jobs_use_a_sql_catalog_in_a_separate_postgresql_database(
    spark, service: Service, pg_catalog_url: str, tmp_path: Path
) -> None:
    properties = {"type": "sql", "uri": pg_catalog_url, "warehouse": str(tmp_path / "pg-tables")}
    catalog = load_catalog(properties)
    source = _copy_pipeline(spark, service, properties, catalog)
    _assert_consistent_copy(spark, service, catalog, source)

    assert {("ods", "numbers"), ("dwd", "copy")} <= set(_catalog_tables(properties))
    # Not in the MetaService's own database, the default catalog.
    assert not service.catalog.table_exists("ods.numbers")
    assert catalog.load_table("dwd.copy").location().startswith((tmp_path / "pg-tables").as_uri())


# -- reads of files Spark's Hadoop cannot open --------------------------------------------


@spark_test
def test_files_on_s3_are_read_through_the_file_io_with_the_table_schema(
    spark, s3_server: S3Server, tmp_path: Path
) -> None:
    """Spark's Hadoop has no s3:// FileSystem here (no hadoop-aws): read_files reads such
    files on the executors through the table's FileIO, columns matched by name, a
    column added since a file was written null in it."""
    from spark_barrier.iceberg.read import read_files
    from spark_barrier.jvm import hadoop_reads_scheme

    assert hadoop_reads_scheme(spark, "file") and not hadoop_reads_scheme(spark, "s3")
    catalog = load_catalog(s3_sql_catalog(tmp_path, s3_server))
    catalog.create_namespace("ods")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    table = catalog.create_table("ods.people", schema=schema)
    table.append(pa.table({"id": [1, 2], "name": ["a", "b"]}, schema=schema))
    with table.update_schema() as update:
        update.add_column("city", StringType())
    table = catalog.load_table("ods.people")
    widened = table.schema().as_arrow()
    table.append(pa.table({"id": [3], "name": ["c"], "city": ["Oslo"]}, schema=widened))
    paths = [task.file.file_path for task in table.scan().plan_files()]
    assert len(paths) == 2 and all(p.startswith("s3://") for p in paths)

    frame = read_files(spark, table, paths)
    assert frame.columns == ["id", "name", "city"]
    assert sorted(tuple(r) for r in frame.collect()) == [
        (1, "a", None),
        (2, "b", None),
        (3, "c", "Oslo"),
    ]
