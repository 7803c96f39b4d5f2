"""The query commands against a real service over HTTP (uvicorn in a thread, SQLite and
PostgreSQL): JSON output equal to the API's answer, plain untruncated tables when piped,
times shown ISO-8601 + relative and read as epoch ms, ISO-8601 or "10m ago", "no data yet"
for a table that never committed, and the job, lease and batch commands."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner, Result

from metaservice import __version__
from metaservice import cli_output as fmt
from metaservice.app import create_app
from metaservice.cli import app as cli_app
from metaservice.client import MetaServiceClient
from metaservice.clock import ManualClock
from metaservice.settings import Settings
from tests.metaservice.helpers import API, SLOT, T0, put_job, run_batch, source_and_derived
from tests.metaservice.live_server import LiveServer

LONG = "dwd.order_detail_" + "x" * 100  # wider than any terminal


@pytest.fixture
def server(db_url: str, clock: ManualClock) -> Iterator[LiveServer]:
    with LiveServer(create_app(Settings(db_url=db_url), clock)) as live:
        yield live


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


@pytest.fixture
def topology(http: httpx.Client, clock: ManualClock) -> dict[str, int]:
    """src -> ods.orders -> der -> dw.detail (committed), and ``late`` -> LONG, registered
    and never committed."""
    barriers = source_and_derived(http, clock)  # type: ignore[arg-type]
    put_job(http, "late", [LONG], inputs=["dw.detail"])  # type: ignore[arg-type]
    return barriers


def cli(server: LiveServer, *args: str, code: int = 0) -> Result:
    done = CliRunner().invoke(cli_app, [*args, "--url", server.url])
    assert done.exit_code == code, done.output
    return done


def api(http: httpx.Client, path: str, **params: Any) -> Any:
    answer = http.get(API + path, params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


# -- piped output ---------------------------------------------------------------------------


def test_piped_tables_are_plain_untruncated_and_grep_finds_a_table(
    server: LiveServer, topology: dict[str, int]
) -> None:
    done = cli(server, "tables")
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "table",
        "writer",
        "readers",
        "frontier",
        "latest",
        "snapshot",
        "delay",
    ]
    assert "3 tables" not in done.stdout and "3 tables" in done.stderr  # title apart
    assert not any(ch in done.stdout for ch in "┃│━…")  # no box, no ellipsis
    (late,) = [line for line in lines if LONG in line]  # `| grep` finds it, whole
    assert late.split()[:2] == [LONG, "late"]
    assert "no data yet" in late and "min behind" not in late
    (detail,) = [line for line in lines if line.startswith("dw.detail ")]
    assert fmt.iso(topology["der0"]) in detail and " ago)" in detail and "201" in detail


def test_a_never_committed_table_has_no_data_yet(
    server: LiveServer, topology: dict[str, int]
) -> None:
    done = cli(server, "delay", LONG)
    assert f"{LONG}: no data yet" in done.stdout
    assert "behind" not in done.stdout.splitlines()[0]
    (late,) = [line for line in done.stdout.splitlines() if line.startswith("late ")]
    assert late.split()[-3:] == ["no", "data", "yet"]
    shown = cli(server, "job", "show", "late").stdout
    assert "frontier        no data yet" in shown


def test_lineage_shows_both_directions_by_default_like_the_api(
    server: LiveServer, http: httpx.Client, topology: dict[str, int]
) -> None:
    done = cli(server, "lineage", "dw.detail")
    assert "dw.detail comes from" in done.stdout and "dw.detail feeds" in done.stdout
    assert "job late" in done.stdout and "job src" in done.stdout
    with MetaServiceClient(server.url) as ms:
        assert ms.lineage("dw.detail").direction == "both"
    assert api(http, "/lineage", table="dw.detail")["direction"] == "both"


# -- JSON -----------------------------------------------------------------------------------


def test_every_query_command_prints_the_apis_answer_as_json(
    server: LiveServer, http: httpx.Client, topology: dict[str, int]
) -> None:
    def as_json(*args: str) -> Any:
        done = cli(server, *args, "-o", "json")
        return json.loads(done.stdout)

    assert as_json("tables") == api(http, "/tables")["items"]
    assert as_json("topology") == api(http, "/jobs")["items"]
    assert as_json("job", "show", "der") == api(http, "/jobs/der")
    assert as_json("snapshots", "ods.orders") == api(http, "/tables/ods.orders/snapshots")
    assert as_json("lineage", "dw.detail", "--direction", "upstream") == api(
        http, "/lineage", table="dw.detail", direction="upstream"
    )
    assert as_json("lineage", "dw.detail", "--snapshot", "201") == api(
        http, "/lineage/snapshots/dw.detail/201"
    )
    assert as_json("consistent", "ods.orders", "dw.detail") == api(
        http, "/versions/consistent", tables="ods.orders,dw.detail"
    )
    delay = as_json("delay", "dw.detail")
    assert delay["frontier"] == topology["der0"] and delay["table"] == "dw.detail"
    assert as_json("expirable", "ods.orders") == api(http, "/tables/ods.orders/expirable")
    assert as_json("tags") == []
    assert as_json("revision", "status") == []
    # --output takes any case; --json stays an alias on the commands that had it
    assert json.loads(cli(server, "tags", "--output", "JSON").stdout) == []
    assert json.loads(cli(server, "tags", "--json").stdout) == []


# -- times ----------------------------------------------------------------------------------


def test_barriers_are_read_as_epoch_ms_iso_8601_or_relative(
    server: LiveServer, topology: dict[str, int]
) -> None:
    src0 = topology["src0"]

    def version_at(text: str) -> int:
        done = cli(server, "consistent", "ods.orders", "--at-or-before", text, "-o", "json")
        return int(json.loads(done.stdout)["barrier"])

    assert version_at(str(src0)) == src0
    assert version_at(fmt.iso(src0)) == src0  # 2023-11-14T22:13:20.000Z
    assert version_at("2023-11-14T22:13:20") == src0  # no zone: UTC
    assert version_at("2023-11-14T23:13:20.500+01:00") == src0
    # the service's clock is the test's, in 2023: "1s ago" is after every barrier
    latest = version_at("now")
    assert version_at("1s ago") == latest >= topology["src1"]

    done = cli(server, "snapshots", "ods.orders", "--from", fmt.iso(src0 + SLOT), "-o", "json")
    assert [s["snapshot_id"] for s in json.loads(done.stdout)["items"]] == [102]
    done = cli(server, "snapshots", "ods.orders", "--to", str(src0))
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["snapshot", "101"]

    bad = cli(server, "consistent", "ods.orders", "--at-or-before", "yesterday", code=2)
    assert "'yesterday' is not a time" in bad.output


def test_parse_barrier_and_the_shown_times() -> None:
    now = T0 + 600_000
    assert fmt.parse_barrier("10m ago", now=lambda: now) == T0
    assert fmt.parse_barrier("600s ago", now=lambda: now) == T0
    assert fmt.parse_barrier("1700000000000") == T0
    assert fmt.parse_barrier("2023-11-14T22:13:20Z") == T0
    for wrong in ("soon", "10 parsecs ago", "-5", "1969-12-31T00:00:00Z"):
        with pytest.raises(typer.BadParameter):
            fmt.parse_barrier(wrong)
    assert fmt.when(T0, now=T0 + 5_000) == "2023-11-14T22:13:20.000Z (5 s ago)"
    assert fmt.when(T0 + 90_000, now=T0) == "2023-11-14T22:14:50.000Z (in 90 s)"
    assert fmt.frontier(0) == "no data yet" and fmt.frontier(None) == "-"
    assert fmt.frontier(None, written=True) == "no data yet"
    assert fmt.behind(None, written=True) == "no data yet"
    assert fmt.behind(None, written=False) == "-" and fmt.behind(90_000, written=True) == "90 s"
    assert [fmt.duration_ms(ms) for ms in (250, 5_200, 180_000, 9_000_000, 2 * 86_400_000)] == [
        "250 ms",
        "5.2 s",
        "3 min",
        "2.5 h",
        "2 d",
    ]
    assert fmt.plain_table(["a", "bb"], [["x" * 30, "1"]]).splitlines() == [
        "a" + " " * 31 + "bb",
        "x" * 30 + "  1",
    ]


# -- the job, batch and lease commands ------------------------------------------------------


def test_job_show_and_delete(
    server: LiveServer, http: httpx.Client, topology: dict[str, int]
) -> None:
    shown = cli(server, "job", "show", "der").stdout
    assert "kind            derived" in shown and "inputs          ods.orders" in shown
    assert f"last barrier    {fmt.iso(topology['der0'])}" in shown
    refused = cli(server, "job", "delete", "der", code=1)  # `late` reads dw.detail
    assert "409" in refused.output
    assert "job late deleted" in cli(server, "job", "delete", "late").stdout
    assert http.get(f"{API}/jobs/late").status_code == 404
    missing = cli(server, "job", "show", "late", code=1)
    assert "404" in missing.output


def test_abandon_a_batch_and_release_an_offline_grant(
    server: LiveServer, http: httpx.Client, clock: ManualClock
) -> None:
    put_job(http, "src", ["ods.orders"])  # type: ignore[arg-type]
    run_batch(http, "src", 0, {"ods.orders": 1})  # type: ignore[arg-type]
    clock.advance(SLOT)
    open_barrier = http.post(f"{API}/jobs/src/batches/1/barrier").json()["barrier"]
    done = cli(server, "batch", "abandon", "src", "1", "-o", "json")
    assert json.loads(done.stdout)["barrier"] == open_barrier
    assert api(http, "/jobs/src")["status"] is not None
    assert http.post(f"{API}/jobs/src/batches/1/abandon").status_code in (200, 409)

    grant = http.put(f"{API}/jobs/src/offline-grant", json={"floor": clock.now_ms()})
    assert grant.status_code == 200, grant.text
    assert api(http, "/jobs/src")["offline_floor"] is not None
    assert "released" in cli(server, "job", "release-grant", "src").stdout
    assert api(http, "/jobs/src")["offline_floor"] is None


def test_lease_create_and_release(
    server: LiveServer, http: httpx.Client, clock: ManualClock, topology: dict[str, int]
) -> None:
    done = cli(server, "lease", "create", "ods.orders", "dw.detail", "--for", "10m", "-o", "json")
    lease = json.loads(done.stdout)
    assert lease["snapshots"] == {"ods.orders": 102, "dw.detail": 201}
    assert lease["lease_expires_ms"] - lease["barrier"] >= 600_000 - 2 * SLOT
    plan = api(http, "/tables/ods.orders/expirable")
    assert any("lease" in " ".join(k["reasons"]) for k in plan["kept"]), plan
    shown = cli(server, "lease", "create", "ods.orders", "--for", "1h").stdout
    # the service's clock is the test's, in 2023: the lease ends an hour after it
    assert f"until {fmt.iso(clock.now_ms() + 3_600_000)}" in shown
    released = cli(server, "lease", "release", lease["lease_id"]).stdout
    assert f"lease {lease['lease_id']} released" in released
    again = cli(server, "lease", "release", lease["lease_id"], code=1)
    assert "404" in again.output


def test_version_flag() -> None:
    done = CliRunner().invoke(cli_app, ["--version"])
    assert done.exit_code == 0 and done.stdout.strip() == f"metaservice {__version__}"
