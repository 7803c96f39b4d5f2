"""Layering: who may import what, checked in fresh interpreters where modules are missing.

The base install (client, wire schemas, ``metaservice.contract``, the CLI's query
commands) must work without the ``server`` extra; a Spark driver loads no server
code; the service and ``reconcile`` load no pyspark. Each test runs the venv's
python with a ``sys.meta_path`` finder that makes the named modules uninstallable,
as on a machine where the extra is not installed, and looks at ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from metaservice.client import MetaServiceClient
from tests.faults.processes import ServiceProcess

SERVER = (
    "alembic",
    "fastapi",
    "networkx",
    "prometheus_client",
    "psycopg",
    "pydantic_settings",  # the server's Settings; the client side must not need it
    "sqlalchemy",
    "starlette",
    "uvicorn",
)
SPARK = ("py4j", "pyarrow", "pyiceberg", "pyspark")

# Raises ModuleNotFoundError (with .name) for the blocked top-level modules, like a
# missing package; prepended to every snippet below.
BLOCKER = """
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""

# metaservice modules the client side may load: the package roots (docstrings only),
# the client and its errors, the contract, the catalog loading (pyiceberg's, which a
# Spark driver and the service share), the clock, the settings object and the wire
# schemas.
CLIENT_SIDE = {
    "metaservice",
    "metaservice.catalog_loading",
    "metaservice.client",
    "metaservice.client_errors",
    "metaservice.clock",
    "metaservice.contract",
    "metaservice.error_bodies",
    "metaservice.schemas_common",
    "metaservice.settings",
}
LOADED_SERVER_CODE = """
def server_code():
    return sorted(
        name for name, module in sys.modules.items()
        if name.startswith("metaservice.") and name not in CLIENT_SIDE
        and not name.endswith(".schemas") and not hasattr(module, "__path__")
    )
"""


def run_blocked(
    code: str, blocked: tuple[str, ...], cwd: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this venv where ``blocked`` cannot be imported."""
    prelude = f"BLOCKED = {set(blocked)!r}\nCLIENT_SIDE = {CLIENT_SIDE!r}\n"
    script = prelude + BLOCKER + LOADED_SERVER_CODE + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,  # not the repository: only the installed packages are importable
        capture_output=True,
        text=True,
        timeout=120,
    )


def json_of(done: subprocess.CompletedProcess[str]) -> object:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


CLI = """
from metaservice.cli import app
app(args=sys.argv[1:], prog_name="metaservice")
"""


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_blocked(CLI, SERVER + SPARK, tmp_path, *args)


# -- the contract ---------------------------------------------------------------------


def test_contract_imports_nothing_but_the_standard_library(tmp_path: Path) -> None:
    done = run_blocked(
        """
        import json
        before = set(sys.modules)
        import metaservice.contract
        new = {name.partition(".")[0] for name in set(sys.modules) - before}
        print(json.dumps(sorted(new - set(sys.stdlib_module_names))))
        """,
        SERVER + SPARK + ("pydantic", "httpx"),
        tmp_path,
    )
    assert json_of(done) == ["metaservice"]


def test_catalog_loading_imports_neither_pyspark_nor_the_server(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    # sqlalchemy stays importable: pyiceberg's SQL catalog uses it.
    blocked = (*(m for m in SERVER if m != "sqlalchemy"), "py4j", "pyspark")
    done = run_blocked(
        """
        import json
        import metaservice.catalog_loading
        print(json.dumps({
            "server_code": server_code(),
            "spark": sorted(m for m in sys.modules if m.startswith(("spark_barrier", "pyspark"))),
        }))
        """,
        blocked,
        tmp_path,
    )
    assert json_of(done) == {"server_code": [], "spark": []}


# -- the client -----------------------------------------------------------------------


def test_client_and_wire_schemas_import_without_server_or_spark(tmp_path: Path) -> None:
    done = run_blocked(
        """
        import json
        import metaservice, metaservice.client, metaservice.contract
        import metaservice.schemas_common
        from metaservice import (
            auth, barriers, delay, lifecycle, lineage, reconcile, revisions, topology, versions,
        )
        features = (
            auth, barriers, delay, lifecycle, lineage, reconcile, revisions, topology, versions,
        )
        for feature in features:
            __import__(feature.__name__ + ".schemas")
        print(json.dumps({"server_code": server_code(), "version": metaservice.__version__}))
        """,
        SERVER + SPARK,
        tmp_path,
    )
    found = json_of(done)
    assert isinstance(found, dict)
    assert found["server_code"] == []
    assert found["version"] and found["version"] != "0+unknown"


# -- the CLI --------------------------------------------------------------------------

QUERY_COMMANDS = [
    ["tables"],
    ["topology"],
    ["lineage"],
    ["consistent"],
    ["delay"],
    ["expirable"],
    ["snapshots"],
    ["job", "show"],
    ["job", "delete"],
    ["job", "release-grant"],
    ["batch", "abandon"],
    ["lease", "create"],
    ["lease", "release"],
    ["expire"],
    ["tag"],
    ["tags"],
    ["untag"],
    ["revision", "create"],
    ["revision", "status"],
    ["revision", "swap"],
    ["revision", "cancel"],
    ["log", "status"],
]


@pytest.mark.parametrize("command", QUERY_COMMANDS, ids=" ".join)
def test_cli_query_command_help_without_server_deps(tmp_path: Path, command: list[str]) -> None:
    done = run_cli(tmp_path, *command, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: metaservice " + " ".join(command) in done.stdout


def test_cli_version_without_server_deps(tmp_path: Path) -> None:
    import metaservice

    done = run_cli(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"metaservice {metaservice.__version__}"


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        (["start", "--port", "1"], "server"),
        (["db", "current", "--db", "sqlite:///ms.db"], "server"),
        (["token", "list", "--db", "sqlite:///ms.db"], "server"),
        (["reconcile", "--db", "sqlite:///ms.db"], "server,iceberg"),
        (["log", "start", "--port", "1"], "server,iceberg"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_cli_server_command_without_server_deps_names_the_extra(
    tmp_path: Path, command: list[str], extra: str
) -> None:
    done = run_cli(tmp_path, *command)
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
    message = " ".join(done.stderr.split())  # rich wraps long lines
    assert f"pip install 'metaservice[{extra}]'" in message, done.stderr
    assert "is not installed" in message
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ms.db").exists()  # failed before touching anything


def test_cli_queries_a_running_service_without_server_deps(tmp_path: Path) -> None:
    """A real ``metaservice start`` (full install) and the base install's CLI and client."""
    with ServiceProcess(f"sqlite:///{tmp_path / 'ms.db'}", tmp_path / "service.log") as service:
        registered = run_blocked(
            """
            import json
            from metaservice.client import MetaServiceClient
            with MetaServiceClient(sys.argv[1]) as ms:
                ms.put_job("load", outputs=["ods.orders"])
                job = ms.put_job("enrich", inputs=["ods.orders"], outputs=["dwd.detail"])
            print(json.dumps({"inputs": job.inputs, "server_code": server_code()}))
            """,
            SERVER + SPARK,
            tmp_path,
            service.url,
        )
        assert json_of(registered) == {"inputs": ["ods.orders"], "server_code": []}

        tables = run_cli(tmp_path, "tables", "--url", service.url)
        lineage = run_cli(tmp_path, "lineage", "dwd.detail", "--url", service.url)
        with MetaServiceClient(service.url) as ms:  # the full install sees the same
            assert {t.name for t in ms.all_tables()} == {"ods.orders", "dwd.detail"}

    assert tables.returncode == 0, tables.stderr
    # piped: the header and one line per table on stdout, the title on stderr
    assert "2 tables" in tables.stderr
    assert [line.split()[0] for line in tables.stdout.splitlines()] == [
        "table",
        "dwd.detail",
        "ods.orders",
    ]
    assert lineage.returncode == 0, lineage.stderr
    assert "job enrich" in lineage.stdout and "ods.orders" in lineage.stdout


# -- the Spark side and the service ---------------------------------------------------


def test_spark_barrier_loads_no_server_code(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    # sqlalchemy stays importable: pyiceberg's SQL catalog uses it.
    blocked = tuple(m for m in SERVER if m != "sqlalchemy")
    done = run_blocked(
        """
        import json
        import spark_barrier
        # every module a driver runs (the package root may load them lazily)
        import spark_barrier.iceberg.commit, spark_barrier.job, spark_barrier.listener
        import spark_barrier.offline, spark_barrier.reads, spark_barrier.report
        import spark_barrier.source
        print(json.dumps({"server_code": server_code(), "version": spark_barrier.__version__}))
        """,
        blocked,
        tmp_path,
    )
    import metaservice

    assert json_of(done) == {"server_code": [], "version": metaservice.__version__}


def test_service_and_reconcile_load_no_pyspark(tmp_path: Path) -> None:
    done = run_blocked(
        """
        import json
        import metaservice.app, metaservice.cli, metaservice.reconcile.iceberg
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("spark_barrier"))))
        """,
        ("py4j", "pyspark"),
        tmp_path,
    )
    assert json_of(done) == []


def test_reconcile_reads_stamps_without_pyspark(tmp_path: Path) -> None:
    """``read_stamps`` parses real snapshot summaries with the contract, pyspark absent."""
    pytest.importorskip("pyiceberg")
    done = run_blocked(
        """
        import json
        import pyarrow as pa
        from pyiceberg.catalog.sql import SqlCatalog
        from metaservice.contract import encode_stamp
        from metaservice.reconcile.iceberg import read_stamps

        root = sys.argv[1]
        catalog = SqlCatalog(
            "t", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/wh"
        )
        catalog.create_namespace("ods")
        schema = pa.schema([pa.field("n", pa.int64())])
        table = catalog.create_table("ods.orders", schema=schema)
        rows = pa.table({"n": [1]}, schema=schema)
        table.append(rows, snapshot_properties=encode_stamp(2000, "load", 0, "q"))
        table.append(rows)  # another tool's snapshot: no stamp
        table.append(rows, snapshot_properties=encode_stamp(3000, "load", 1))
        stamps, missing, errors = read_stamps(catalog, ["ods.orders", "ods.nothing"])
        print(json.dumps({
            "stamps": {k: [s.model_dump() for s in v] for k, v in stamps.items()},
            "missing": sorted(missing), "errors": errors,
            "spark": sorted(m for m in sys.modules if m.startswith(("spark_barrier", "pyspark"))),
        }))
        """,
        ("py4j", "pyspark"),
        tmp_path,
        str(tmp_path),
    )
    found = json_of(done)
    assert isinstance(found, dict)
    stamped = [(s["barrier"], s["job"], s["batch_id"]) for s in found["stamps"]["ods.orders"]]
    assert stamped == [(2000, "load", 0), (3000, "load", 1)]
    assert found["stamps"]["ods.nothing"] == [] and found["missing"] == ["ods.nothing"]
    assert found["errors"] == {} and found["spark"] == []


def test_reconcile_command_runs_without_pyspark(tmp_path: Path) -> None:
    # reconcile reads stamps through pyiceberg alone: the service side never loads Spark.
    upgraded = subprocess.run(
        [sys.executable, "-m", "metaservice.cli", "db", "upgrade", "--db", "sqlite:///ms.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upgraded.returncode == 0, upgraded.stderr
    done = run_blocked(CLI, ("py4j", "pyspark"), tmp_path, "reconcile", "--db", "sqlite:///ms.db")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "0 tables" in done.stdout
