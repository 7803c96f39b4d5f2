"""``metaservice log start`` and ``metaservice log status`` against real services: the
MetaService in this process (real HTTP), log services embedded in this process, and a
standalone ``metaservice log start`` in a subprocess stopped with Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner, Result

from metaservice.app import create_app
from metaservice.cli import app as cli_app
from metaservice.client import MetaServiceClient
from metaservice.clock import ManualClock
from metaservice.logstore import LogClient, LogWriter
from metaservice.logstore.cli import parse_bytes, shown_bytes
from metaservice.logstore.server import LogService
from metaservice.settings import Settings
from tests.faults.processes import free_port
from tests.metaservice.live_server import LiveServer
from tests.metaservice.log_cli import ctrl_c, log_start

ORDERS, CLICKS, PLAIN = "dw.orders", "dw.clicks", "dw.plain"


@pytest.fixture
def server(db_url: str, clock: ManualClock) -> Iterator[LiveServer]:
    with LiveServer(create_app(Settings(db_url=db_url), clock)) as live:
        yield live


def cli(server: LiveServer, *args: str, code: int = 0) -> Result:
    done = CliRunner().invoke(cli_app, [*args, "--url", server.url])
    assert done.exit_code == code, done.output
    return done


def test_log_status_shows_each_table_log_from_the_metaservice_and_its_log_service(
    server: LiveServer,
) -> None:
    with LogService() as embedded, MetaServiceClient(server.url) as ms:
        ms.put_job("load", outputs=[ORDERS, CLICKS, PLAIN])
        ms.put_table_log(ORDERS, mode="embedded", address=embedded.url)
        ms.put_table_log(CLICKS, mode="external", address=f"http://127.0.0.1:{free_port()}")
        writer = LogWriter(embedded.url)
        writer.reset(ORDERS, after_batch_id=-1)
        writer.append(ORDERS, barrier=1000, batch_id=0, rows=pa.table({"id": list(range(64))}))
        with LogClient(embedded.url) as reader:
            reader.read(ORDERS, after_batch=-1, reader="dashboard")
        shown = cli(server, "log", "status")
        as_json = json.loads(cli(server, "log", "status", "--output", "json").stdout)
        one = cli(server, "log", "status", "--table", ORDERS)
    lines = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]}
    assert set(lines) == {ORDERS, CLICKS}  # dw.plain has no log
    assert "embedded" in lines[ORDERS] and embedded.url in lines[ORDERS]
    assert "batch 0..0 (seq 1..1)" in lines[ORDERS] and "512 B" in lines[ORDERS]
    assert lines[ORDERS].rstrip().endswith("dashboard")
    assert "external" in lines[CLICKS] and "no log service answered" in lines[CLICKS]
    by_table = {entry["table"]: entry for entry in as_json}
    assert by_table[ORDERS]["status"]["entries"] == 1
    assert by_table[ORDERS]["status"]["readers"] == ["dashboard"]
    assert by_table[CLICKS]["status"] is None
    assert "no log service answered" in by_table[CLICKS]["error"]
    assert [line.split()[0] for line in one.stdout.splitlines()[1:]] == [ORDERS]


def test_log_status_of_a_table_without_a_log_says_how_to_enable_it(server: LiveServer) -> None:
    with MetaServiceClient(server.url) as ms:
        ms.put_job("load", outputs=[PLAIN])
    done = cli(server, "log", "status", "--table", PLAIN, code=1)
    message = " ".join(done.output.split())
    assert 'register(..., log="embedded")' in message and "metaservice log start" in message
    unknown = cli(server, "log", "status", "--table", "dw.nothing", code=1)
    assert "dw.nothing" in unknown.output


def test_log_start_serves_until_ctrl_c(tmp_path: Path) -> None:
    with log_start("--max-bytes", "64M") as (started, url):
        LogWriter(url).append(ORDERS, barrier=1000, batch_id=0, rows=pa.table({"id": [1]}))
        err = ctrl_c(started)
    assert started.returncode == 0, err
    assert f"log service on {url}" in err and "64 MiB per table" in err and "Ctrl-C" in err
    assert "log service stopped" in err and "Traceback" not in err


def test_sizes_are_read_and_shown_in_binary_units() -> None:
    assert [parse_bytes(t) for t in ("1024", "256M", "1G", "1.5k", "64MiB")] == [
        1024,
        256 * 2**20,
        2**30,
        1536,
        64 * 2**20,
    ]
    assert [shown_bytes(n) for n in (512, 1536, 256 * 2**20)] == ["512 B", "1.5 KiB", "256 MiB"]
