"""OpenLineage ingest: ``POST /api/v1/lineage`` over real HTTP, on SQLite and PostgreSQL.

Events are sent by ``openlineage-python``'s own client (HTTP transport, gzip, the
service's bearer token as its API key) to the service on a real socket, and read back
through ``GET /api/v1/lineage`` beside the barrier topology.
"""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import (
    DatasetEvent,
    InputDataset,
    Job,
    JobEvent,
    OutputDataset,
    Run,
    RunEvent,
    RunState,
    StaticDataset,
)
from openlineage.client.facet_v2 import symlinks_dataset
from openlineage.client.transport.http import (
    ApiKeyTokenProvider,
    HttpCompression,
    HttpConfig,
    HttpTransport,
)

from metaservice.app import create_app
from metaservice.auth import service as auth_service
from metaservice.auth.schemas import Role
from metaservice.clock import ManualClock
from metaservice.context import Context
from metaservice.db import Database
from metaservice.settings import Settings
from tests.metaservice.helpers import (
    API,
    T0,
    assert_error,
    db_state,
    put_job,
    run_batch,
    unchanged,
)
from tests.metaservice.live_server import LiveServer

NOW = "2026-01-02T03:04:05.678Z"
PRODUCER = "https://example.org/spark-openlineage"  # any producer URI


def _token(db_url: str, role: Role) -> str:
    db = Database(db_url)
    try:
        ctx = Context(settings=Settings(db_url=db_url), clock=ManualClock(T0))
        return db.write(lambda s: auth_service.create_token(s, ctx, role, "ol")).token
    finally:
        db.dispose()


@pytest.fixture
def server(db_url: str, clock: ManualClock) -> Iterator[LiveServer]:
    """The service on a real socket with auth required."""
    with LiveServer(create_app(Settings(db_url=db_url, auth_required=True), clock)) as s:
        yield s


@pytest.fixture
def writer(db_url: str) -> str:
    return _token(db_url, Role.WRITER)


@pytest.fixture
def http(server: LiveServer, writer: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        # Generous: these tests check what is stored, and on a loaded machine (the suite
        # beside Spark tests) an ingest has taken over 10 s.
        base_url=server.url,
        headers={"Authorization": f"Bearer {writer}"},
        timeout=60,
    ) as c:
        yield c


def ol_client(server: LiveServer, token: str) -> OpenLineageClient:
    """openlineage-python's client as a Spark driver or Airflow would configure it."""
    config = HttpConfig(
        url=server.url,
        auth=ApiKeyTokenProvider({"apiKey": token}),
        compression=HttpCompression.GZIP,
        retry={"total": 0},
    )
    return OpenLineageClient(transport=HttpTransport(config))


def iceberg_by_location(path: str, table: str) -> Any:
    """An Iceberg table as Spark's OpenLineage integration names it: by location, with its
    catalog identifier in the symlinks facet."""
    return {
        "symlinks": symlinks_dataset.SymlinksDatasetFacet(
            identifiers=[
                symlinks_dataset.Identifier(namespace="iceberg://catalog", name=table, type="TABLE")
            ]
        )
    }


def lineage(http: httpx.Client, table: str, **params: Any) -> dict[str, Any]:
    r = http.get(f"{API}/lineage", params={"table": table, **params})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def run_event(job: str = "etl.enrich", run_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "eventType": "START",
        "eventTime": NOW,
        "producer": PRODUCER,
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": run_id or str(uuid.uuid4())},
        "job": {"namespace": "airflow", "name": job},
        "inputs": [{"namespace": "postgres://db", "name": "public.orders"}],
        "outputs": [],
        **extra,
    }


def test_openlineage_client_events_show_in_lineage_beside_the_barrier_topology(
    server, http, writer
):
    # The barrier topology: src writes ods.orders, der reads it and writes dw.detail.
    put_job(http, "src", ["ods.orders"])
    put_job(http, "der", ["dw.detail"], inputs=["ods.orders"])
    client = ol_client(server, writer)
    run_id = str(uuid.uuid4())
    # An observed Spark job reads dw.detail (an Iceberg table named by its location) and
    # writes reports.daily, which nothing in the barrier topology knows.
    for state in (RunState.START, RunState.COMPLETE):
        client.emit(
            RunEvent(
                eventType=state,
                eventTime=NOW,
                run=Run(runId=run_id),
                job=Job(namespace="spark", name="daily_report"),
                inputs=[
                    InputDataset(
                        namespace="file",
                        name="/warehouse/dw/detail",
                        facets=iceberg_by_location("/warehouse/dw/detail", "dw.detail"),
                    )
                ],
                outputs=[OutputDataset(namespace="file", name="/exports/daily")],
                producer=PRODUCER,
            )
        )
    graph = lineage(http, "dw.detail", direction="downstream")
    nodes = {n["id"]: n for n in graph["nodes"]}
    # The location dataset is the catalog table dw.detail: one node, no duplicate.
    assert set(nodes) == {
        "table:dw.detail",
        "job:spark/daily_report",
        "dataset:file//exports/daily",
    }
    assert nodes["table:dw.detail"] == {
        "id": "table:dw.detail",
        "kind": "table",
        "name": "dw.detail",
    }
    assert nodes["job:spark/daily_report"] == {
        "id": "job:spark/daily_report",
        "kind": "job",
        "name": "daily_report",
        "observed": True,
        "source": "openlineage",
        "namespace": "spark",
    }
    assert nodes["dataset:file//exports/daily"]["observed"] is True
    assert {(e["source"], e["target"], e.get("observed", False)) for e in graph["edges"]} == {
        ("table:dw.detail", "job:spark/daily_report", True),
        ("job:spark/daily_report", "dataset:file//exports/daily", True),
    }
    # Upstream of dw.detail is still the barrier topology, unmarked.
    up = lineage(http, "dw.detail", direction="upstream")
    assert {n["id"] for n in up["nodes"]} == {
        "table:dw.detail",
        "job:der",
        "table:ods.orders",
        "job:src",
    }
    assert all("observed" not in n for n in up["nodes"] + up["edges"])


def test_gzip_events_from_the_client_are_stored_whole_with_unknown_facets(
    server, http, writer, db_url
):
    event = run_event(
        run={"runId": str(uuid.uuid4()), "facets": {"acme_cost": {"dollars": 3, "_producer": "x"}}},
        custom_top_level={"kept": True},
    )
    r = http.post(
        f"{API}/lineage",
        content=gzip.compress(json.dumps(event).encode()),
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "recorded" and r.json()["kind"] == "run"
    (row,) = db_state(db_url)["openlineage_events"]
    stored = json.loads(next(v for v in row if isinstance(v, str) and v.startswith("{")))
    assert stored == event


def test_the_same_event_twice_is_one_record(http, db_url):
    event = run_event()
    first = http.post(f"{API}/lineage", json=event)
    assert first.status_code == 201, first.text
    with unchanged(db_url):
        again = http.post(f"{API}/lineage", json=event)
        assert again.status_code == 200, again.text
        assert again.json() == {**first.json(), "status": "duplicate"}
    # The same run's next event is another record.
    assert http.post(f"{API}/lineage", json={**event, "eventType": "COMPLETE"}).status_code == 201
    assert len(db_state(db_url)["openlineage_events"]) == 2


def test_dataset_and_job_events_are_accepted(server, http, writer, db_url):
    client = ol_client(server, writer)
    client.emit(
        DatasetEvent(
            eventTime=NOW,
            producer=PRODUCER,
            dataset=StaticDataset(
                namespace="s3://lake",
                name="/wh/ods/items",
                facets=iceberg_by_location("/wh/ods/items", "ods.items"),
            ),
        )
    )
    client.emit(
        JobEvent(
            eventTime=NOW,
            producer=PRODUCER,
            job=Job(namespace="dbt", name="items_rollup"),
            inputs=[InputDataset(namespace="s3://lake", name="/wh/ods/items")],
            outputs=[OutputDataset(namespace="warehouse", name="ods.items")],
        )
    )
    kinds = sorted(row[2] for row in db_state(db_url)["openlineage_events"])
    assert kinds == ["dataset", "job"]
    # ods.items is known to the service only through OpenLineage: the location dataset
    # (by its symlink) and the dataset named ods.items are the one table.
    graph = lineage(http, "ods.items")
    assert {(e["source"], e["target"]) for e in graph["edges"]} == {
        ("table:ods.items", "job:dbt/items_rollup"),
        ("job:dbt/items_rollup", "table:ods.items"),
    }
    assert graph["nodes"] == [
        {
            "id": "job:dbt/items_rollup",
            "kind": "job",
            "name": "items_rollup",
            "observed": True,
            "source": "openlineage",
            "namespace": "dbt",
        },
        {
            "id": "table:ods.items",
            "kind": "table",
            "name": "ods.items",
            "observed": True,
            "source": "openlineage",
            "namespace": "s3://lake",
        },
    ]


def test_observed_writers_never_meet_the_single_writer_rule(server, http, writer, clock):
    put_job(http, "src", ["ods.orders"])
    run_batch(http, "src", 0, {"ods.orders": 101})
    # Two observed jobs write the barrier job's table: both recorded, nothing refused.
    for job in ("backfill_a", "backfill_b"):
        event = run_event(
            job=job,
            inputs=[],
            outputs=[{"namespace": "warehouse", "name": "ods.orders"}],
        )
        r = http.post(f"{API}/lineage", json=event)
        assert r.status_code == 201, r.text
    graph = lineage(http, "ods.orders", direction="upstream")
    writers = {e["source"] for e in graph["edges"] if e["target"] == "table:ods.orders"}
    assert writers == {"job:src", "job:airflow/backfill_a", "job:airflow/backfill_b"}
    # The barrier topology is as it was: src is still the table's one writer.
    table = http.get(f"{API}/tables/ods.orders").json()
    assert table["writer"] == "src"
    assert [j["name"] for j in http.get(f"{API}/jobs").json()["items"]] == ["src"]
    # And a barrier job may still be registered over observed lineage.
    put_job(http, "der", ["dw.detail"], inputs=["ods.orders"])


def test_unknown_event_types_are_acknowledged_and_ignored(http, db_url):
    event = run_event(
        schemaURL="https://openlineage.io/spec/3-0-0/OpenLineage.json#/$defs/FooEvent"
    )
    with unchanged(db_url):
        r = http.post(f"{API}/lineage", json=event)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "ignored"


BAD_EVENTS = [
    ({"run": {"runId": "not-a-uuid"}}, "$.run.runId"),
    ({"eventTime": "yesterday"}, "$.eventTime"),
    ({"eventType": "EXPLODED"}, "$.eventType"),
    ({"job": {"namespace": "airflow"}}, "$.job.name"),
    ({"producer": 7}, "$.producer"),
    ({"inputs": [{"namespace": "a", "name": "b"}, {"name": "c"}]}, "$.inputs[1].namespace"),
    ({"job": {"namespace": "a", "name": "nul\u0000byte"}}, "$.job.name"),
    ({"job": {"namespace": "a", "name": "x" * 1001}}, "$.job.name"),
    (
        {
            "outputs": [
                {"namespace": "a", "name": "b", "facets": {"symlinks": {"identifiers": [{}]}}}
            ]
        },
        "$.outputs[0].facets.symlinks.identifiers[0].namespace",
    ),
]

BAD_BODIES = [
    (b"{not json", {}, 400, "malformed_json"),
    (b"[1, 2]", {}, 400, "invalid_event"),
    (b'{"eventTime": "2026-01-01T00:00:00Z"}', {}, 400, "invalid_event"),
    (b'{"eventTime": NaN, "run": {}}', {}, 400, "malformed_json"),
    (b"\xff\xfe", {}, 400, "malformed_json"),
    (b"plain, not gzip", {"Content-Encoding": "gzip"}, 400, "malformed_gzip"),
    (gzip.compress(b"{}")[:-6], {"Content-Encoding": "gzip"}, 400, "malformed_gzip"),
    (b"{}", {"Content-Encoding": "br"}, 400, "unsupported_encoding"),
    # a small gzip that inflates past the body limit (a zip bomb)
    (gzip.compress(b" " * (8 * 1024 * 1024 + 10)), {"Content-Encoding": "gzip"}, 413, "too_large"),
]


def test_a_bad_event_is_400_with_its_json_path_and_changes_nothing(http, db_url):
    with unchanged(db_url):
        for change, path in BAD_EVENTS:
            r = http.post(f"{API}/lineage", json={**run_event(), **change})
            body = assert_error(r, 400, "invalid_event")
            assert body["path"] == path, body
            assert body["message"].startswith(path), body


def test_malformed_bodies_are_refused_and_change_nothing(http, db_url):
    with unchanged(db_url):
        for content, headers, status, code in BAD_BODIES:
            r = http.post(
                f"{API}/lineage",
                content=content,
                headers={"Content-Type": "application/json", **headers},
            )
            assert_error(r, status, code)


def test_ingest_needs_a_writer_token(server, db_url):
    reader = _token(db_url, Role.READER)
    with unchanged(db_url):
        r = httpx.post(f"{server.url}{API}/lineage", json=run_event())
        assert_error(r, 401, "unauthenticated")
        r = httpx.post(
            f"{server.url}{API}/lineage",
            json=run_event(),
            headers={"Authorization": f"Bearer {reader}"},
        )
        assert_error(r, 403, "forbidden")
