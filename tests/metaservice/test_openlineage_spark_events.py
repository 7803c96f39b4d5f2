"""OpenLineage ingest of the events Spark's own listener (openlineage-spark) sends.

The events in ``openlineage_events/`` are the listener's, copied from the OpenLineage
project (its README names each source). They are posted as the listener's HTTP transport
(openlineage-java's ``HttpTransport``) posts them: ``POST /api/v1/lineage`` with
``Content-Type: application/json; charset=UTF-8``, the API key as a bearer token and, with
``compression: gzip``, a gzip body sent in chunks with ``Content-Encoding: gzip``; to the
service on a real socket, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from metaservice.db import normalise_url
from tests.metaservice import test_openlineage_ingest
from tests.metaservice.helpers import API, put_job, unchanged
from tests.metaservice.test_openlineage_ingest import lineage

# test_openlineage_ingest's fixtures: the service on a real socket with auth required, a
# writer token, and an HTTP client that sends it.
server = test_openlineage_ingest.server
writer = test_openlineage_ingest.writer
http = test_openlineage_ingest.http

EVENTS = Path(__file__).parent / "openlineage_events"
HIVE_RUNNING = "spark_hive_insert_running.json"
HIVE_COMPLETE = "spark_hive_insert_complete.json"
ICEBERG_APPEND = "spark_iceberg_append_complete.json"
FILE_CTAS = "spark_file_ctas_start.json"
ALL = [HIVE_RUNNING, HIVE_COMPLETE, ICEBERG_APPEND, FILE_CTAS]

HIVE_RUN = "019299c5-73cf-7069-a70f-74eb8070b577"
HIVE_JOB = "cl_i_test_application.execute_insert_into_hive_table.warehouse_t2"
HIVE_LOCATION = "hdfs://dataproc-producer-test-m"
ICEBERG_JOB = "iceberg_integration_test.append_data.spark_catalog_default_append_table"
ICEBERG_RUN = str(uuid.uuid4())

JOBS = "SELECT namespace, name, last_event_type, last_run_id FROM observed_jobs"
DATASETS = "SELECT namespace, name, symlinks FROM observed_datasets"


def event(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((EVENTS / name).read_text(encoding="utf-8"))
    if name == ICEBERG_APPEND:
        # This file is the part of the listener's event that OpenLineage's Iceberg
        # integration test matches (its mock server ignores the fields a file leaves out),
        # so it lacks the envelope every event carries: added here as the listener
        # writes it (producer URI, spec 2-0-2 RunEvent, a run id).
        doc = {
            "eventTime": "2025-07-02T14:28:21.000Z",
            "producer": "https://github.com/OpenLineage/OpenLineage/tree/1.35.0/integration/spark",
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": ICEBERG_RUN, "facets": {}},
            **doc,
        }
    return doc


def body(name: str) -> bytes:
    """The event as sent: the file's own bytes when it is a whole event."""
    if name == ICEBERG_APPEND:
        return json.dumps(event(name), separators=(",", ":")).encode()
    return (EVENTS / name).read_bytes()


def send(http: httpx.Client, content: bytes, *, compress: bool = False) -> httpx.Response:
    """POST as openlineage-java's HttpTransport does; compressed, the body is a
    GzipCompressingEntity: streamed in chunks, with no Content-Length."""
    headers = {
        "Content-Type": "application/json; charset=UTF-8",
        "Accept": "application/json; charset=UTF-8",
    }
    if not compress:
        return http.post(f"{API}/lineage", content=content, headers=headers)
    packed = gzip.compress(content)
    chunks = [packed[i : i + 1024] for i in range(0, len(packed), 1024)]
    return http.post(
        f"{API}/lineage",
        content=iter(chunks),
        headers={**headers, "Content-Encoding": "gzip"},
    )


def rows(db_url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_engine(normalise_url(db_url))
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql)).all()]
    finally:
        engine.dispose()


def observed_node(node_id: str, kind: str, name: str, namespace: str) -> dict[str, Any]:
    return {
        "id": node_id,
        "kind": kind,
        "name": name,
        "observed": True,
        "source": "openlineage",
        "namespace": namespace,
    }


def test_the_listeners_events_are_stored_whole_and_once(http, db_url):
    for name in ALL:
        r = send(http, body(name))
        assert r.status_code == 201, (name, r.text)
        assert r.json()["status"] == "recorded" and r.json()["kind"] == "run", r.json()
    stored = rows(db_url, "SELECT event_type, run_id, payload FROM openlineage_events ORDER BY id")
    assert [(t, run, json.loads(p)) for t, run, p in stored] == [
        (event(n)["eventType"], event(n)["run"]["runId"], event(n)) for n in ALL
    ]
    # The facets the service does not read are kept as they came.
    running, complete, iceberg, ctas = (json.loads(p) for _, _, p in stored)
    assert running["run"]["facets"]["spark_jobDetails"]["jobId"] == 1
    assert running["run"]["facets"]["processing_engine"]["version"] == "3.5.1"
    assert complete["job"]["facets"]["gcp_lineage"]["origin"]["sourceType"] == "DATAPROC"
    output = complete["outputs"][0]
    assert output["facets"]["columnLineage"]["fields"]["a"]["inputFields"][0]["field"] == "a"
    assert output["outputFacets"] == {}
    assert iceberg["outputs"][0]["facets"]["catalog"]["framework"] == "iceberg"
    assert iceberg["outputs"][0]["facets"]["version"] == {}
    assert ctas["run"]["facets"]["spark_version"]["spark-version"] == "3.1.2"
    plan = ctas["run"]["facets"]["spark.logicalPlan"]["plan"]
    assert plan[0]["class"].endswith("CreateDataSourceTableAsSelectCommand")
    assert ctas["outputs"][0]["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "CREATE"
    # The listener's retry, gzip-compressed this time: the same events, nothing new.
    with unchanged(db_url):
        for name in ALL:
            r = send(http, body(name), compress=True)
            assert r.status_code == 200, (name, r.text)
            assert r.json()["status"] == "duplicate", r.json()


def test_tables_named_by_location_are_the_catalog_tables_their_symlinks_name(http, db_url):
    # The barrier topology writes default.t2; default.t1 is known only from the events.
    put_job(http, "t2_writer", ["default.t2"])
    # The run's COMPLETE (gzip) arrives before its RUNNING: the job keeps the newer state.
    for name, compress in ((HIVE_COMPLETE, True), (HIVE_RUNNING, False)):
        r = send(http, body(name), compress=compress)
        assert r.status_code == 201, (name, r.text)
    graph = lineage(http, "default.t2", direction="upstream")
    job = f"job:default/{HIVE_JOB}"
    nodes = {n["id"]: n for n in graph["nodes"]}
    # hdfs://.../warehouse/t2 is the catalog table default.t2: one node, the barrier
    # topology's, unmarked; no dataset node for either location.
    assert nodes == {
        "table:default.t2": {"id": "table:default.t2", "kind": "table", "name": "default.t2"},
        "job:t2_writer": {"id": "job:t2_writer", "kind": "job", "name": "t2_writer"},
        job: observed_node(job, "job", HIVE_JOB, "default"),
        "table:default.t1": observed_node("table:default.t1", "table", "default.t1", HIVE_LOCATION),
    }
    assert {(e["source"], e["target"], e.get("observed", False)) for e in graph["edges"]} == {
        ("job:t2_writer", "table:default.t2", False),
        (job, "table:default.t2", True),
        ("table:default.t1", job, True),
    }
    assert rows(db_url, JOBS) == [("default", HIVE_JOB, "COMPLETE", HIVE_RUN)]
    assert sorted(rows(db_url, DATASETS)) == [
        (HIVE_LOCATION, "/user/hive/warehouse/t1", '["default.t1"]'),
        (HIVE_LOCATION, "/user/hive/warehouse/t2", '["default.t2"]'),
    ]
    # The table's writer is still the barrier job alone.
    assert http.get(f"{API}/tables/default.t2").json()["writer"] == "t2_writer"


def test_an_iceberg_table_written_by_spark_is_its_catalog_table(http, db_url):
    put_job(http, "append_stream", ["default.append_table"])
    r = send(http, body(ICEBERG_APPEND), compress=True)
    assert r.status_code == 201, r.text
    graph = lineage(http, "default.append_table", direction="upstream")
    job = f"job:iceberg-namespace/{ICEBERG_JOB}"
    table = "table:default.append_table"
    assert {n["id"] for n in graph["nodes"]} == {table, "job:append_stream", job}
    assert next(n for n in graph["nodes"] if n["id"] == job) == observed_node(
        job, "job", ICEBERG_JOB, "iceberg-namespace"
    )
    assert {(e["source"], e["target"], e.get("observed", False)) for e in graph["edges"]} == {
        ("job:append_stream", table, False),
        (job, table, True),
    }
    assert rows(db_url, DATASETS) == [
        ("file", "/tmp/iceberg/default/append_table", '["default.append_table"]')
    ]


def test_a_plain_file_dataset_stays_a_dataset(http, db_url):
    r = send(http, body(FILE_CTAS))
    assert r.status_code == 201, r.text
    assert rows(db_url, JOBS) == [
        (
            "default",
            "sample_spark.execute_create_data_source_table_as_select_command",
            "START",
            "204d9c56-6648-4d46-b6bd-f4623255d324",
        )
    ]
    # No symlinks facet: a location only, no table identifier.
    assert rows(db_url, DATASETS) == [("file", "/home/jovyan/notebooks/spark-warehouse/temp", "[]")]
    assert rows(db_url, "SELECT event_time_ms FROM openlineage_events") == [(1_659_334_549_671,)]
