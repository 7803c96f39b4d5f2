"""How long a revision takes to catch up, beside the pipeline's own processing speed.

    .venv/bin/python -m bench.bench_revision [--backlog 30] [--out bench/results/revision.json]

Runs `examples.revise_order_detail` on local Spark with an embedded MetaService: the
demo pipeline runs, `dwd.order_detail` (and `dws.item_revenue` downstream) is revised
from the barrier BACKLOG seconds back, the revision's two jobs catch up on the mirrors
while the original pipeline goes on, and the swap follows. Measured in the same run:

- ``catch_up_s``: from starting the revision's queries to the revision being ready
  (every mirror within ``revision_ready_lag_ms`` of its original);
- the original derived jobs' processing time for the same history: the sum of
  ``committed - created`` of their batches with barriers in the backlog, from the
  MetaService's batch records, and the revision jobs' own for their catch-up batches.

Ratios: ``catch_up_s / backlog_s`` (seconds per second of history; below 1 means the
revision catches up faster than the history was made) and ``catch_up_s / original
processing s`` (how the catch-up compares with what the pipeline itself spent on that
history). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

import spark_barrier
from bench.common import host_facts, loadavg, package_version
from examples import revise_order_detail as rev
from examples.embedded import EmbeddedMetaService
from metaservice.settings import Settings

DERIVED = ("build_order_detail", "aggregate_revenue")


def batch_seconds(db_url: str, job: str, low: int, high: int, until_ms: int) -> dict[str, float]:
    """Batches of ``job`` with barriers in (low, high] created by ``until_ms``: how
    many, and their summed time."""
    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT b.created_ms, b.committed_ms FROM batches b JOIN jobs j "
                "ON j.id = b.job_id WHERE j.name = :job AND b.committed AND NOT b.advanced "
                "AND NOT b.abandoned AND b.barrier > :low AND b.barrier <= :high "
                "AND b.created_ms <= :until"
            ),
            {"job": job, "low": low, "high": high, "until": until_ms},
        ).all()
    engine.dispose()
    return {"batches": len(rows), "seconds": sum(c - s for s, c in rows) / 1000}


def measure(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    db_url = f"sqlite:///{root / 'metaservice.db'}"
    tables = str(root / "tables")
    with EmbeddedMetaService(Settings(db_url=db_url, warehouse=tables, port=0)) as url:
        spark = spark_barrier.local_spark_builder("bench-revision").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        run = rev.Run(
            spark,
            url,
            catalog_properties={"type": "sql", "uri": db_url, "warehouse": tables},
            state_dir=root / "state",
            orders_per_second=args.orders_per_second,
        )
        load_before = loadavg()
        outcome = rev.revise(
            run, warm_up_s=args.warm_up, backlog_s=args.backlog, after_s=args.after
        )
        spark.stop()
    print(outcome.describe(), flush=True)
    low, high = outcome.from_barrier, outcome.from_barrier + outcome.backlog_ms
    # The originals' batches over the backlog; the revision jobs' until they were ready
    # (a catch-up batch may end past the backlog: the originals went on meanwhile).
    original = {job: batch_seconds(db_url, job, low, high, 2**62) for job in DERIVED}
    revised = {
        job: batch_seconds(
            db_url, f"{job}__rev{outcome.revision_id}", low, 2**62, outcome.ready_at_ms
        )
        for job in DERIVED
    }
    original_s = sum(j["seconds"] for j in original.values())
    backlog_s = outcome.backlog_ms / 1000
    return {
        "ok": outcome.ok,
        "from_barrier": outcome.from_barrier,
        "backlog_s": backlog_s,
        "catch_up_s": round(outcome.catch_up_s, 2),
        "swap_s": round(outcome.swap_s, 2),
        "original_batches": original,
        "revision_batches": revised,
        "catch_up_per_second_of_history": round(outcome.catch_up_s / backlog_s, 3),
        "catch_up_to_original_processing": round(outcome.catch_up_s / max(original_s, 1e-3), 3),
        "reader_samples": dict(outcome.kinds),
        "reader_errors_racing_the_swap": len(outcome.read_errors),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warm-up", type=float, default=15, help="seconds before the barrier")
    parser.add_argument("--backlog", type=float, default=30, help="seconds of history to revise")
    parser.add_argument("--after", type=float, default=5, help="seconds to run after the swap")
    parser.add_argument("--orders-per-second", type=int, default=20)
    parser.add_argument("--out", default="bench/results/revision.json")
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-revision-") as root:
        run = measure(Path(root), args)
    result = {
        "benchmark": "revision",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "host": host_facts(),
        "versions": {p: package_version(p) for p in ("pyspark", "pyiceberg")},
        "settings": {
            "spark_master": "local[2]",
            "orders_per_second": args.orders_per_second,
            "warm_up_s": args.warm_up,
            "backlog_asked_s": args.backlog,
        },
        "run": run,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"caught up {run['backlog_s']:.1f}s of history in {run['catch_up_s']:.1f}s "
        f"({run['catch_up_per_second_of_history']:.2f} s per s of history; "
        f"{run['catch_up_to_original_processing']:.2f} x the original jobs' processing time)"
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
