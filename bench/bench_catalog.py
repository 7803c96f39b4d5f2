"""The Iceberg REST catalog (/iceberg) against the service's own floor, in one run.

    .venv/bin/python -m bench.bench_catalog [--tables 1000] [--out bench/results/catalog.json]

A topology of N source jobs, each writing one real Iceberg table (a pyiceberg SQL catalog
in the service's SQLite database, one stamped Parquet commit per table, reported to the
service), served by ``uvicorn --factory metaservice.app:create_app`` on loopback. One
client, sequential requests, measured side by side in one run:

- ``GET /healthz`` (the floor),
- ``GET /iceberg/v1/config`` (opens a session: the consistent version of all N tables,
  pinned by one lease of all tables),
- ``GET /api/v1/versions/consistent?tables=<all N>`` (the same version, without a lease:
  what config's goal is measured against),
- loadTable of random tables in one session (pinned metadata, its file already written
  after the first load of each table).

Goals (issue 31): loadTable p99 <= 3x /healthz p99; config p99 <= the consistent-version
read's p99. Then DuckDB: ATTACH through the catalog and join two tables, against the same
join of ``iceberg_scan`` on the tables' metadata files at the same snapshot ids.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import TableProperties

from bench.bench_service import service
from bench.common import host_facts, loadavg, package_version, spread
from metaservice.contract import encode_stamp
from metaservice.migrate import upgrade
from spark_barrier.iceberg.catalog import ensure_table, open_catalog

SCHEMA = pa.schema([pa.field("k", pa.int64()), pa.field("n", pa.int64())])
API = "/api/v1"


def build(http: httpx.Client, db_url: str, warehouse: Path, tables: int) -> list[str]:
    """N source jobs ``src_i`` writing ``bench.t_i``: one stamped commit each, reported."""
    catalog = open_catalog(db_url, str(warehouse))
    names = [f"bench.t_{i:05d}" for i in range(tables)]
    for i, name in enumerate(names):
        job = f"src_{i:05d}"
        assert http.put(f"{API}/jobs/{job}", json={"outputs": [name]}).status_code in (200, 201)
        b = http.post(f"{API}/jobs/{job}/batches/0/barrier").json()["barrier"]
        table = ensure_table(catalog, name, SCHEMA)
        with table.transaction() as txn:
            txn.set_properties(
                {
                    TableProperties.DEFAULT_NAME_MAPPING: table.schema().name_mapping.model_dump_json()
                }
            )
        table = catalog.load_table(name)
        path = f"{table.location()}/data/{uuid.uuid4().hex}.parquet"
        Path(path.removeprefix("file://")).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.table({"k": list(range(10)), "n": [i] * 10}, schema=SCHEMA),
            path.removeprefix("file://"),
        )
        txn = table.transaction()
        with txn.update_snapshot(snapshot_properties=encode_stamp(b, job, 0)).fast_append() as add:
            add.append_data_file(parquet_file_to_data_file(table.io, table.metadata, path))
        txn.commit_transaction()
        snapshot = catalog.load_table(name).metadata.current_snapshot_id
        report = {"job": job, "batch_id": 0, "barrier": b, "table": name, "snapshot_id": snapshot}
        assert http.post(f"{API}/commits", json=report).status_code == 200
        if (i + 1) % 200 == 0:
            print(f"  {i + 1} tables built", flush=True)
    catalog.engine.dispose()  # type: ignore[attr-defined]
    return names


def timed(http: httpx.Client, n: int, request: Any) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        r = request()
        took.append((time.perf_counter() - started) * 1000)
        assert r.status_code in (200, 204), r.text[:500]
    return took


def bench_http(http: httpx.Client, names: list[str], rounds: int) -> dict[str, Any]:
    time.sleep(2)  # one slot closes: every idle source is sealed at a version
    everything = ",".join(names)
    prefix = http.get("/iceberg/v1/config").json()["overrides"]["prefix"]
    for name in names:  # every pinned file written once, as a running session has them
        ns, t = name.split(".")
        http.get(f"/iceberg/v1/{prefix}/namespaces/{ns}/tables/{t}")
    rng = random.Random(7)

    def load() -> httpx.Response:
        ns, t = rng.choice(names).split(".")
        return http.get(f"/iceberg/v1/{prefix}/namespaces/{ns}/tables/{t}")

    figures: dict[str, list[float]] = {
        k: [] for k in ("healthz", "load_table", "config", "consistent")
    }
    for _ in range(rounds):  # interleaved, so that a noisy moment touches all alike
        figures["healthz"] += timed(http, 30, lambda: http.get("/healthz"))
        figures["load_table"] += timed(http, 30, load)
        figures["config"] += timed(http, 3, lambda: http.get("/iceberg/v1/config"))
        figures["consistent"] += timed(
            http, 3, lambda: http.get(f"{API}/versions/consistent", params={"tables": everything})
        )
    out = {k: spread(v) for k, v in figures.items()}
    out["load_table_p99_over_healthz_p99"] = out["load_table"]["p99"] / out["healthz"]["p99"]
    out["config_p99_over_consistent_p99"] = out["config"]["p99"] / out["consistent"]["p99"]
    return out


def bench_duckdb(
    url: str, db_url: str, warehouse: Path, names: list[str], n: int
) -> dict[str, Any]:
    import duckdb
    import duckdb_extensions

    first, second = names[0], names[1]
    catalog = open_catalog(db_url, str(warehouse))
    files = {t: catalog.load_table(t).metadata_location for t in (first, second)}
    snaps = {t: catalog.load_table(t).metadata.current_snapshot_id for t in (first, second)}
    catalog.engine.dispose()  # type: ignore[attr-defined]
    join = "SELECT count(*), sum(a.n + b.n) FROM {a} a JOIN {b} b USING (k)"

    def connect() -> Any:
        con = duckdb.connect()
        for ext in ("httpfs", "avro", "iceberg"):
            duckdb_extensions.import_extension(ext, con)
        return con

    def through_catalog() -> Any:
        con = connect()
        con.execute(
            f"ATTACH 'consistent' AS ms (TYPE iceberg, ENDPOINT '{url}/iceberg', AUTHORIZATION_TYPE 'none')"
        )
        return con.execute(join.format(a=f"ms.{first}", b=f"ms.{second}")).fetchall()

    def by_snapshot_id() -> Any:
        con = connect()
        scan = "iceberg_scan('{f}', snapshot_from_id={s})"
        return con.execute(
            join.format(
                a=scan.format(f=files[first], s=snaps[first]),
                b=scan.format(f=files[second], s=snaps[second]),
            )
        ).fetchall()

    assert through_catalog() == by_snapshot_id()
    figures: dict[str, list[float]] = {"attach_and_join": [], "iceberg_scan_by_snapshot_id": []}
    for _ in range(n):
        for key, run in (
            ("attach_and_join", through_catalog),
            ("iceberg_scan_by_snapshot_id", by_snapshot_id),
        ):
            started = time.perf_counter()
            run()
            figures[key].append((time.perf_counter() - started) * 1000)
    out: dict[str, Any] = {k: spread(v) for k, v in figures.items()}
    out["p50_ratio"] = out["attach_and_join"]["p50"] / out["iceberg_scan_by_snapshot_id"]["p50"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of requests")
    parser.add_argument("--out", type=Path, default=Path("bench/results/catalog.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        work = Path(tmp)
        warehouse = work / "warehouse"
        db_url = f"sqlite:///{work / 'metaservice.db'}"
        upgrade(db_url)
        env = {"METASERVICE_WAREHOUSE": str(warehouse)}
        load_before = loadavg()
        with (
            service(db_url, work, 1, env) as server,
            httpx.Client(base_url=server.url, timeout=120) as http,
        ):
            print(f"building {args.tables} tables ...", flush=True)
            started = time.monotonic()
            names = build(http, db_url, warehouse, args.tables)
            built_s = time.monotonic() - started
            print("measuring the REST catalog against /healthz ...", flush=True)
            result = {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "host": host_facts(),
                "loadavg_before": load_before,
                "tables": args.tables,
                "build_s": round(built_s, 1),
                "database": "sqlite",
                "http_ms": bench_http(http, names, args.rounds),
                "duckdb": package_version("duckdb"),
                "duckdb_ms": bench_duckdb(server.url, db_url, warehouse, names, 10),
                "loadavg_after": loadavg(),
            }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    http_ms, duck = result["http_ms"], result["duckdb_ms"]
    print(
        f"loadTable p99 {http_ms['load_table']['p99']:.2f} ms = "
        f"{http_ms['load_table_p99_over_healthz_p99']:.2f}x /healthz p99 "
        f"({http_ms['healthz']['p99']:.2f} ms); config p99 {http_ms['config']['p99']:.1f} ms = "
        f"{http_ms['config_p99_over_consistent_p99']:.2f}x the consistent-version read's p99 "
        f"({http_ms['consistent']['p99']:.1f} ms); DuckDB attach+join p50 "
        f"{duck['attach_and_join']['p50']:.0f} ms = {duck['p50_ratio']:.2f}x iceberg_scan by "
        f"snapshot id; written to {args.out}"
    )


if __name__ == "__main__":
    main()
