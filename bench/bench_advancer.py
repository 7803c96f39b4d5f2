"""The per-slot advancer's cost with no job running: one tick (raise the watermark, advance
every idle derived job) on ``bench_service``'s layered topology, in process, on PostgreSQL.

Each tick starts just after a slot starts, as the service's advancer does. The first two
ticks catch up with the slots since the topology was written and are left out of the
figures. Reported per size: the tick's wall time and this thread's CPU time (``bench.common.spread``) and
the batches it recorded (advanced batches are rows of ``batches``, one per job and target).
A tick longer than the slot (``--interval-ms``, 1,000 by default) means the advancer alone
keeps the service's interpreter busy.

    flock /tmp/metaservice-heavy.lock .venv/bin/python -m bench.bench_advancer \\
        --jobs 1000,10000 --out bench/results/advancer.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_service import DEFAULT_PG, build_topology, database, machine_facts
from bench.common import spread
from metaservice.barriers.advancer import ms_until_tick, tick
from metaservice.clock import SystemClock
from metaservice.context import Context
from metaservice.db import Database
from metaservice.settings import Settings

WARM_UP_TICKS = 2


def measure(url: str, ticks: int, interval_ms: int) -> dict[str, Any]:
    db = Database(url)
    ctx = Context(
        settings=Settings(db_url=url, barrier_interval_ms=interval_ms), clock=SystemClock()
    )
    wall, cpu, advanced = [], [], []
    try:
        for _ in range(ticks + WARM_UP_TICKS):
            time.sleep(ms_until_tick(time.time() * 1000, interval_ms) / 1000)
            w0, c0 = time.perf_counter(), time.thread_time()
            done = tick(db, ctx)
            wall.append((time.perf_counter() - w0) * 1000)
            cpu.append((time.thread_time() - c0) * 1000)
            advanced.append(done.advanced)
    finally:
        db.engine.dispose()
    kept = slice(WARM_UP_TICKS, None)
    return {
        "ticks": ticks,
        "tick_wall_ms": spread(wall[kept]),
        "tick_cpu_ms": spread(cpu[kept]),
        "batches_per_tick": advanced[kept],
        "warm_up_batches": advanced[:WARM_UP_TICKS],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="1000,10000", help="topology sizes, comma-separated")
    parser.add_argument("--ticks", type=int, default=10, help="ticks measured per size")
    parser.add_argument("--interval-ms", type=int, default=1000, help="the barrier slot")
    parser.add_argument("--pg-url", default=os.environ.get("METASERVICE_TEST_PG_URL", DEFAULT_PG))
    parser.add_argument("--out", type=Path, default=Path("bench/results/advancer.json"))
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": machine_facts(args.pg_url, ["postgres"]), "runs": []}
    with tempfile.TemporaryDirectory() as workdir:
        for n in (int(x) for x in args.jobs.split(",")):
            print(f"{n} jobs: building the topology ...", flush=True)
            with database("postgres", args.pg_url, Path(workdir), f"advancer{n}") as url:
                build_topology(url, n)
                run = {"jobs": n, **measure(url, args.ticks, args.interval_ms)}
            results["runs"].append(run)
            wall, cpu = run["tick_wall_ms"], run["tick_cpu_ms"]
            print(
                f"{n} jobs: tick {wall['p50']:.0f} ms p50 ({wall['max']:.0f} max), CPU "
                f"{cpu['p50']:.0f} ms p50, {statistics.median(run['batches_per_tick']):.0f} "
                f"batches per tick",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
