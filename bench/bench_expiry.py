"""Expiry of a long history: how long `POST /tables/{t}/expire` takes to expire N
snapshots, and how many files and bytes it frees.

    .venv/bin/python -m bench.bench_expiry [--sizes 1000,10000] [--out bench/results/expiry.json]

For each size N, a table of N snapshots is built in a pyiceberg SQL catalog (SQLite, in
a temporary folder): snapshot i is an overwrite whose only data file is file i, a small
Parquet file, so every older snapshot holds one data file, one manifest and one
manifest list that nothing else uses. The table's metadata is written in one go
(manifests and manifest lists through pyiceberg's writers) rather than by N commits,
whose metadata.json grows with the history (N commits would cost O(N^2)). The
MetaService (in process, manual clock, SQLite) hands out the N barriers and takes the
N commit reports, as a source job's would be. Then, timed: a dry run, and the expiry
itself (the service's default retention keeps the newest snapshot, so N - 1 go).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fastapi.testclient import TestClient
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import (
    DataFile,
    ManifestEntry,
    ManifestEntryStatus,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.schema import Schema
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotLogEntry, Summary
from pyiceberg.types import LongType, NestedField

from bench.common import host_facts, loadavg, package_version
from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.contract import encode_stamp
from metaservice.migrate import upgrade
from metaservice.settings import Settings
from spark_barrier.iceberg.catalog import open_catalog

T0 = 1_700_000_000_000
SLOT = 1000
TABLE = "bench.events"
JOB = "ingest"
API = "/api/v1"
SCHEMA = Schema(NestedField(1, "n", LongType(), required=False))
REPORTS_PER_REQUEST = 1000


def build(root: Path, n: int) -> dict[str, Any]:
    """A service and a table of ``n`` reported snapshots under ``root``; the timed expiry."""
    db_url = f"sqlite:///{root / 'ms.db'}"
    warehouse = root / "warehouse"
    warehouse.mkdir()
    upgrade(db_url)
    clock = ManualClock(T0)
    settings = Settings(db_url=db_url, warehouse=str(warehouse))
    # A loopback name: the service answers only to names it expects (not "testserver").
    with TestClient(create_app(settings, clock), base_url="http://127.0.0.1") as client:
        ok(client.put(f"{API}/jobs/{JOB}", json={"outputs": [TABLE]}))
        started = time.perf_counter()
        barriers = []
        for i in range(n):
            barriers.append(ok(client.post(f"{API}/jobs/{JOB}/batches/{i}/barrier"))["barrier"])
            clock.advance(SLOT)
        barriers_s = time.perf_counter() - started

        started = time.perf_counter()
        catalog = open_catalog(db_url, str(warehouse))  # the jobs' default catalog
        snapshot_ids = write_history(catalog, barriers)
        table_s = time.perf_counter() - started

        started = time.perf_counter()
        reports = [
            {"job": JOB, "batch_id": i, "barrier": b, "table": TABLE, "snapshot_id": s}
            for i, (b, s) in enumerate(zip(barriers, snapshot_ids, strict=True))
        ]
        for k in range(0, n, REPORTS_PER_REQUEST):
            ok(
                client.post(
                    f"{API}/commits/batch", json={"commits": reports[k : k + REPORTS_PER_REQUEST]}
                )
            )
        reports_s = time.perf_counter() - started
        print(
            f"  {n} snapshots built (barriers {barriers_s:.1f} s, table {table_s:.1f} s, "
            f"reports {reports_s:.1f} s); expiring ...",
            flush=True,
        )

        before = disk_usage(warehouse)
        started = time.perf_counter()
        dry = ok(client.post(f"{API}/tables/{TABLE}/expire", json={"dry_run": True}))
        dry_s = time.perf_counter() - started
        load = loadavg()
        started = time.perf_counter()
        done = ok(client.post(f"{API}/tables/{TABLE}/expire"))
        expire_s = time.perf_counter() - started
        after = disk_usage(warehouse)
        left = catalog.load_table(TABLE)
        assert [s.snapshot_id for s in left.snapshots()] == [snapshot_ids[-1]]
        assert left.scan().to_arrow()["n"].to_pylist() == [n - 1]
        assert done["snapshots_removed"] == n - 1 == len(dry["snapshots"])
    return {
        "snapshots": n,
        "snapshots_removed": done["snapshots_removed"],
        "files_removed": done["files_removed"],
        "bytes_freed": done["bytes_freed"],
        "bytes_on_disk_before": before,
        "bytes_on_disk_after": after,
        "dry_run_s": round(dry_s, 3),
        "expire_s": round(expire_s, 3),
        "expire_ms_per_snapshot": round(expire_s * 1000 / max(1, done["snapshots_removed"]), 3),
        "load_1min_before_expire": load[0],
        "setup_s": {
            "barriers": round(barriers_s, 1),
            "table": round(table_s, 1),
            "reports": round(reports_s, 1),
        },
    }


def write_history(catalog: Catalog, barriers: list[int]) -> list[int]:
    """The table with one overwrite snapshot per barrier, stamped as the sink stamps them;
    returns the snapshot ids, oldest first."""
    catalog.create_namespace_if_not_exists(TABLE.split(".")[0])
    base = catalog.create_table(
        TABLE,
        SCHEMA,
        properties={TableProperties.DEFAULT_NAME_MAPPING: SCHEMA.name_mapping.model_dump_json()},
    )
    metadata, io, location = base.metadata, base.io, base.location()
    snapshots: list[Snapshot] = []
    log: list[SnapshotLogEntry] = []
    parent: int | None = None
    for i, barrier in enumerate(barriers):
        snapshot_id = i + 1
        data_file = write_data_file(base, f"{location}/data/{i:06d}.parquet", i)
        manifest_writer = write_manifest(
            2,
            metadata.spec(),
            metadata.schema(),
            io.new_output(f"{location}/metadata/m-{i:06d}.avro"),
            snapshot_id,
            "deflate",
        )
        with manifest_writer as writer:
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=i + 1,
                    file_sequence_number=i + 1,
                    data_file=data_file,
                )
            )
        manifest = manifest_writer.to_manifest_file()
        manifest_list = f"{location}/metadata/snap-{snapshot_id}-{uuid.uuid4()}.avro"
        with write_manifest_list(
            format_version=2,
            output_file=io.new_output(manifest_list),
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent,
            sequence_number=i + 1,
            avro_compression="deflate",
        ) as writer:
            writer.add_manifests([manifest])
        timestamp = T0 + i * SLOT
        snapshots.append(
            Snapshot(
                snapshot_id=snapshot_id,
                parent_snapshot_id=parent,
                sequence_number=i + 1,
                timestamp_ms=timestamp,
                manifest_list=manifest_list,
                schema_id=0,
                summary=Summary(Operation.OVERWRITE, **encode_stamp(barrier, JOB, i)),
            )
        )
        log.append(SnapshotLogEntry(snapshot_id=snapshot_id, timestamp_ms=timestamp))
        parent = snapshot_id
    history = metadata.model_copy(
        update={
            "snapshots": snapshots,
            "snapshot_log": log,
            "current_snapshot_id": parent,
            "last_sequence_number": len(barriers),
            "refs": {
                "main": SnapshotRef(snapshot_id=parent, snapshot_ref_type=SnapshotRefType.BRANCH)
            },
            "last_updated_ms": T0 + len(barriers) * SLOT,
        }
    )
    metadata_file = f"{location}/metadata/{len(barriers):05d}-{uuid.uuid4()}.metadata.json"
    ToOutputFile.table_metadata(history, io.new_output(metadata_file))
    catalog.drop_table(TABLE)  # the catalog entry only: the files stay
    catalog.register_table(TABLE, metadata_file)
    return [s.snapshot_id for s in snapshots]


def write_data_file(table: Table, path: str, n: int) -> DataFile:
    local = path.removeprefix("file://")
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"n": pa.array([n], pa.int64())}), local)
    data_file = parquet_file_to_data_file(table.io, table.metadata, path)
    data_file.spec_id = table.metadata.default_spec_id
    return data_file


def disk_usage(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def ok(response: Any) -> Any:
    assert response.status_code < 300, response.text
    return response.json()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="1000,10000", help="history lengths to expire (comma-separated)"
    )
    parser.add_argument("--out", default="bench/results/expiry.json")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = []
    started = time.time()
    for n in sizes:
        print(f"expiry of {n} snapshots:", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-expiry-") as root:
            run = build(Path(root), n)
        print(
            f"  {run['snapshots_removed']} snapshots, {run['files_removed']} files, "
            f"{run['bytes_freed'] / 1e6:.1f} MB freed in {run['expire_s']:.2f} s "
            f"(dry run {run['dry_run_s']:.2f} s)",
            flush=True,
        )
        runs.append(run)
    result = {
        "benchmark": "expiry",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "host": host_facts(),
        "versions": {p: package_version(p) for p in ("pyiceberg", "sqlalchemy", "fastapi")},
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
