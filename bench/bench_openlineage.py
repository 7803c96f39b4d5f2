"""OpenLineage ingest: events per second into ``POST /api/v1/lineage``, against the
``GET /healthz`` rate measured in the same run at the same concurrency (the floor).

    .venv/bin/python -m bench.bench_openlineage [--threads 1,4] [--seconds 2] [--reps 3]
                                                [--pg URL] [--out bench/results/openlineage.json]

The service runs as ``uvicorn --factory metaservice.app:create_app`` (what ``metaservice
start`` runs; one worker, default settings) on a free loopback port, on a fresh SQLite
file and, with ``--pg URL``, also on a fresh PostgreSQL schema (dropped afterwards).
For each concurrency K, each repetition runs three phases of ``--seconds`` each, K
client threads started together, every one with its own client:

- ``healthz``: ``GET /healthz`` with a keep-alive ``httpx.Client`` (HTTP, uvicorn and
  FastAPI, no database: the floor any request pays);
- ``ol_client``: openlineage-python's ``OpenLineageClient`` with the http transport,
  gzip, as a Spark driver or Airflow configures it (``RunEvent`` objects built and
  serialised by the client);
- ``httpx_gzip``: the same events as JSON, gzipped (level 3, as the client does) and
  posted with a keep-alive ``httpx.Client``.

Every event is a new run (START or COMPLETE) of one of 50 jobs reading two and writing
one of 100 datasets, shared by all threads (as jobs share tables): outputs carry a
schema facet and a symlinks facet naming a catalog table, as Spark's Iceberg
integration sends them. At the end the number of stored events must equal the number
of events the service answered 201 for.

Beside the rates: latency p50/p90 of the requests, the CPU seconds the service process
and this (client) process used per phase, and how many TCP connections the
openlineage client opened.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import urllib3.connection
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import schema_dataset, symlinks_dataset
from openlineage.client.transport.http import HttpCompression, HttpConfig, HttpTransport
from sqlalchemy import func, select

from bench.bench_service import Server, calibration_ms, cpu_share, database, service
from bench.common import host_facts, loadavg, package_version, percentile, process_cpu_s
from metaservice.db import make_engine
from metaservice.models import OpenLineageEvent

PRODUCER = "https://github.com/OpenLineage/OpenLineage/tree/1.54.0/integration/spark"
SCHEMA_URL = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
JOBS = 50
DATASETS = 100
FIELDS = [("id", "long"), ("customer_id", "long"), ("amount", "decimal(12,2)")] + [
    (f"attr_{i}", "string") for i in range(7)
]
PHASES = ("healthz", "ol_client", "httpx_gzip")


# -- events ---------------------------------------------------------------------------------


def event_parts(thread: int, n: int) -> dict[str, Any]:
    """What the n-th event of a thread says: a job, its datasets, a new run."""
    j = (thread * 7919 + n) % JOBS
    return {
        "state": "START" if n % 2 == 0 else "COMPLETE",
        "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "run": str(uuid.uuid4()),
        "job": f"etl.job{j:02d}",
        "inputs": [(j * 3) % DATASETS, (j * 3 + 1) % DATASETS],
        "output": (j * 3 + 2) % DATASETS,
    }


def location(k: int) -> str:
    return f"/warehouse/dw/table{k:03d}"


def as_dict(p: dict[str, Any]) -> dict[str, Any]:
    """The event as JSON, the same fields the openlineage client sends for ``as_object``."""
    out = p["output"]
    return {
        "eventType": p["state"],
        "eventTime": p["time"],
        "producer": PRODUCER,
        "schemaURL": SCHEMA_URL,
        "run": {"runId": p["run"], "facets": {}},
        "job": {"namespace": "spark", "name": p["job"], "facets": {}},
        "inputs": [{"namespace": "file", "name": location(k), "facets": {}} for k in p["inputs"]],
        "outputs": [
            {
                "namespace": "file",
                "name": location(out),
                "facets": {
                    "schema": {
                        "_producer": PRODUCER,
                        "_schemaURL": "https://openlineage.io/spec/facets/1-1-1/SchemaDatasetFacet.json#/$defs/SchemaDatasetFacet",
                        "fields": [{"name": n, "type": t} for n, t in FIELDS],
                    },
                    "symlinks": {
                        "_producer": PRODUCER,
                        "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/SymlinksDatasetFacet.json#/$defs/SymlinksDatasetFacet",
                        "identifiers": [
                            {
                                "namespace": "iceberg://catalog",
                                "name": f"dw.table{out:03d}",
                                "type": "TABLE",
                            }
                        ],
                    },
                },
            }
        ],
    }


def as_object(p: dict[str, Any]) -> RunEvent:
    out = p["output"]
    return RunEvent(
        eventType=RunState.START if p["state"] == "START" else RunState.COMPLETE,
        eventTime=p["time"],
        run=Run(runId=p["run"]),
        job=Job(namespace="spark", name=p["job"]),
        inputs=[InputDataset(namespace="file", name=location(k)) for k in p["inputs"]],
        outputs=[
            OutputDataset(
                namespace="file",
                name=location(out),
                facets={
                    "schema": schema_dataset.SchemaDatasetFacet(
                        fields=[
                            schema_dataset.SchemaDatasetFacetFields(name=n, type=t)
                            for n, t in FIELDS
                        ]
                    ),
                    "symlinks": symlinks_dataset.SymlinksDatasetFacet(
                        identifiers=[
                            symlinks_dataset.Identifier(
                                namespace="iceberg://catalog",
                                name=f"dw.table{out:03d}",
                                type="TABLE",
                            )
                        ]
                    ),
                },
            )
        ],
        producer=PRODUCER,
    )


# -- counting connections the openlineage client opens (requests -> urllib3) ------------------

_connects = 0
_connects_lock = threading.Lock()
_urllib3_connect = urllib3.connection.HTTPConnection.connect


def _counting_connect(self: Any) -> None:
    global _connects
    with _connects_lock:
        _connects += 1
    _urllib3_connect(self)


urllib3.connection.HTTPConnection.connect = _counting_connect  # type: ignore[method-assign]


# -- a phase --------------------------------------------------------------------------------


class Sender:
    """One thread's client for a phase; ``send(n)`` makes one request and returns its HTTP
    status."""

    def __init__(self, phase: str, url: str, thread: int) -> None:
        self.phase, self.thread = phase, thread
        self.http = httpx.Client(base_url=url, timeout=60)
        self.ol: OpenLineageClient | None = None
        if phase == "ol_client":
            config = HttpConfig(url=url, compression=HttpCompression.GZIP, timeout=60)
            self.ol = OpenLineageClient(transport=HttpTransport(config))
            transport = self.ol.transport
            assert isinstance(transport, HttpTransport)
            transport.session.get(url + "/healthz").close()  # connect before the clock starts
        else:
            self.http.get("/healthz")

    def send(self, n: int) -> int:
        if self.phase == "healthz":
            return self.http.get("/healthz").status_code
        parts = event_parts(self.thread, n)
        if self.ol is not None:
            try:
                self.ol.emit(as_object(parts))
            except Exception as exc:  # the transport raises on any status >= 400
                response = getattr(exc, "response", None)
                return response.status_code if response is not None else -1
            return 201
        body = gzip.compress(json.dumps(as_dict(parts)).encode(), compresslevel=3)
        r = self.http.post(
            "/api/v1/lineage",
            content=body,
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        return r.status_code

    def close(self) -> None:
        self.http.close()
        if self.ol is not None:
            self.ol.close()


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def run_phase(server: Server, phase: str, threads: int, seconds: float) -> dict[str, Any]:
    global _connects
    senders = [Sender(phase, server.url, i) for i in range(threads)]
    start = threading.Barrier(threads + 1)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    statuses: list[dict[int, int]] = [{} for _ in range(threads)]
    errors: list[BaseException] = []
    deadline = 0.0

    def work(i: int) -> None:
        start.wait()
        lat, st, sender = latencies[i], statuses[i], senders[i]
        n = 0
        try:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                code = sender.send(n)
                lat.append(time.perf_counter() - t0)
                st[code] = st.get(code, 0) + 1
                n += 1
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    with _connects_lock:
        _connects = 0
    server_cpu0, client_cpu0, busy0 = (
        process_cpu_s(server.proc.pid),
        time.process_time(),
        machine_busy(),
    )
    t0 = time.perf_counter()
    deadline = t0 + seconds
    start.wait()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    server_cpu = process_cpu_s(server.proc.pid) - server_cpu0
    client_cpu = time.process_time() - client_cpu0
    busy1 = machine_busy()
    for s in senders:
        s.close()
    if errors:
        raise errors[0]
    flat = [x * 1000 for lat in latencies for x in lat]
    codes: dict[int, int] = {}
    for st in statuses:
        for code, count in st.items():
            codes[code] = codes.get(code, 0) + count
    ok = sum(c for code, c in codes.items() if 200 <= code < 300)
    return {
        "requests": len(flat),
        "ok": ok,
        "statuses": {str(k): v for k, v in sorted(codes.items())},
        "seconds": round(wall, 3),
        "per_s": round(ok / wall, 1),
        "latency_ms": {
            "p50": round(statistics.median(flat), 2),
            "p90": round(percentile(flat, 90), 2),
            "p99": round(percentile(flat, 99), 2),
        },
        "server_cpu_s": round(server_cpu, 2),
        "client_cpu_s": round(client_cpu, 2),
        "server_cpu_ms_per_request": round(server_cpu * 1000 / max(1, len(flat)), 2),
        "client_cpu_ms_per_request": round(client_cpu * 1000 / max(1, len(flat)), 2),
        "machine_busy": round((busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), 2),
        "tcp_connects": _connects if phase == "ol_client" else None,
        "load_1min": loadavg()[0],
    }


def stored_events(url: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(select(func.count()).select_from(OpenLineageEvent)).scalar_one()
            )
    finally:
        engine.dispose()


def statements_per_event(url: str, repeat: int = 20) -> dict[str, Any]:
    """SQL statements and in-process time of one event, by the service functions the
    endpoint calls (no HTTP, no FastAPI): ``parse`` (gunzip, JSON, validation, canonical
    form and its hash) and ``record``, for an event of a known job and datasets (the
    steady state) and of a new job with new datasets; medians."""
    from sqlalchemy import event

    from metaservice.context import Context
    from metaservice.db import Database
    from metaservice.openlineage import service as ol
    from metaservice.settings import Settings

    db = Database(url)
    ctx = Context(settings=Settings(db_url=url))
    count = [0]
    event.listen(db.engine, "before_cursor_execute", lambda *_: count.__setitem__(0, count[0] + 1))
    out: dict[str, Any] = {}
    try:
        for case in ("known job and datasets", "new job and datasets"):
            parse_ms, record_ms, statements = [], [], []
            for n in range(repeat):
                doc = as_dict(event_parts(0, n))
                if case.startswith("new"):
                    doc["job"]["name"] = f"new.job{uuid.uuid4().hex[:8]}"
                    for d in doc["inputs"] + doc["outputs"]:
                        d["name"] += f"/{uuid.uuid4().hex[:8]}"
                raw = gzip.compress(json.dumps(doc).encode(), compresslevel=3)
                t0 = time.perf_counter()
                parsed = ol.parse_event(ol.decode_body(raw, "gzip", 8 * 1024 * 1024))
                t1 = time.perf_counter()
                before = count[0]
                assert parsed is not None
                result = db.write(partial(ol.record, ctx=ctx, parsed=parsed))
                t2 = time.perf_counter()
                assert result.status == "recorded", result
                parse_ms.append((t1 - t0) * 1000)
                record_ms.append((t2 - t1) * 1000)
                statements.append(count[0] - before)
            out[case] = {
                "statements": statistics.median(statements),
                "parse_ms": round(statistics.median(parse_ms), 2),
                "record_ms": round(statistics.median(record_ms), 2),
            }
    finally:
        db.dispose()
    return out


def bench_db(
    kind: str, pg: str, workdir: Path, threads: list[int], seconds: float, reps: int
) -> dict[str, Any]:
    with database(kind, pg, workdir, "openlineage") as url, service(url, workdir, 1) as server:
        for phase in PHASES:  # warm-up: imports, caches, the first rows
            run_phase(server, phase, 2, 0.5)
        warm = stored_events(url)
        runs: dict[str, Any] = {}
        recorded = 0
        for k in threads:
            rows: dict[str, list[dict[str, Any]]] = {p: [] for p in PHASES}
            for rep in range(reps):
                for phase in PHASES:
                    row = run_phase(server, phase, k, seconds)
                    rows[phase].append(row)
                    if phase != "healthz":
                        recorded += row["statuses"].get("201", 0)
                print(
                    f"  {kind} K={k} rep {rep + 1}/{reps}: "
                    + ", ".join(f"{p} {rows[p][-1]['per_s']}/s" for p in PHASES),
                    flush=True,
                )
            summary = {
                p: {
                    "per_s_p50": round(statistics.median(r["per_s"] for r in rows[p]), 1),
                    "per_s_p90": percentile([r["per_s"] for r in rows[p]], 90),
                    "latency_ms_p50": round(
                        statistics.median(r["latency_ms"]["p50"] for r in rows[p]), 2
                    ),
                    "latency_ms_p90": round(
                        statistics.median(r["latency_ms"]["p90"] for r in rows[p]), 2
                    ),
                    "server_cpu_ms_per_request": round(
                        statistics.median(r["server_cpu_ms_per_request"] for r in rows[p]), 2
                    ),
                    "client_cpu_ms_per_request": round(
                        statistics.median(r["client_cpu_ms_per_request"] for r in rows[p]), 2
                    ),
                }
                for p in PHASES
            }
            floor = summary["healthz"]["per_s_p50"]
            ratios = {
                p: round(summary[p]["per_s_p50"] / floor, 3) for p in PHASES if p != "healthz"
            }
            runs[str(k)] = {"reps": rows, "summary": summary, "ratio_to_healthz": ratios}
        stored = stored_events(url) - warm
        if stored != recorded:
            print(f"  ! {kind}: {stored} events stored, {recorded} answered 201", flush=True)
        statements = statements_per_event(url)
        print(f"  {kind} per event, in process: {statements}", flush=True)
    return {
        "by_threads": runs,
        "events_answered_201": recorded,
        "events_stored": stored,
        "per_event_in_process": statements,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", default="1,4", help="concurrencies K (comma-separated)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each phase")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pg", metavar="URL", help="also on PostgreSQL at URL (a new schema)")
    parser.add_argument("--out", default="bench/results/openlineage.json")
    args = parser.parse_args(argv)
    threads = [int(k) for k in args.threads.split(",")]
    started = time.time()
    load_before = loadavg()
    facts = {
        **host_facts(),
        "calibration_ms": round(calibration_ms(), 1),
        "cpu_share": round(cpu_share(), 2),
    }
    print(f"load average {load_before}, cpu share {facts['cpu_share']}", flush=True)
    dbs = ["sqlite"] + (["postgres"] if args.pg else [])
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-openlineage-") as root:
        for kind in dbs:
            results[kind] = bench_db(
                kind, args.pg or "", Path(root), threads, args.seconds, args.reps
            )
    load_after = loadavg()
    result: dict[str, Any] = {
        "benchmark": "openlineage",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "host": facts,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "versions": {
            p: package_version(p)
            for p in (
                "openlineage-python",
                "requests",
                "httpx",
                "fastapi",
                "uvicorn",
                "sqlalchemy",
                "psycopg",
            )
        },
        "settings": {
            "threads": threads,
            "seconds": args.seconds,
            "reps": args.reps,
            "jobs": JOBS,
            "datasets": DATASETS,
        },
        "event_bytes": {
            "json": len(json.dumps(as_dict(event_parts(0, 0))).encode()),
            "gzip": len(gzip.compress(json.dumps(as_dict(event_parts(0, 0))).encode(), 3)),
        },
        "databases": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for kind, res in results.items():
        for k, run in res["by_threads"].items():
            s = run["summary"]
            print(
                f"  {kind} K={k}: healthz {s['healthz']['per_s_p50']}/s, "
                f"ol_client {s['ol_client']['per_s_p50']} events/s "
                f"({run['ratio_to_healthz']['ol_client']}), httpx_gzip "
                f"{s['httpx_gzip']['per_s_p50']} events/s ({run['ratio_to_healthz']['httpx_gzip']})"
            )
    print(f"load average {load_before} -> {load_after}; written to {args.out}")


if __name__ == "__main__":
    main()
