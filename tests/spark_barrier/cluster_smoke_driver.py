"""A driver that proves a job ran on a standalone cluster's executors, run as its own
process by tests/spark_barrier/test_cluster.py (see tests/cluster.py for the setup):

    python -m tests.spark_barrier.cluster_smoke_driver --master spark://127.0.0.1:PORT --out DIR

Runs one task per partition (4) that reports the process it ran in, then writes a Parquet
table into DIR (a folder the executors reach) and reads it back. Prints one JSON line:
``{"driver_pid", "app_id", "tasks": [{"partition", "pid", "ppid_chain", "cwd"}], "rows_read"}``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from spark_barrier import local_spark_builder

PARTITIONS = 4
ROWS = 1000


def ancestor_pids(pid: int) -> list[int]:
    """The pids of `pid`'s parents up to init, from /proc (Linux); [] elsewhere."""
    chain = []
    while pid > 1:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        pid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        chain.append(pid)
    return chain


def describe_task(partition: int, rows: Iterable[int]) -> Iterator[dict[str, Any]]:
    # Runs in a Python worker on an executor: everything here describes that process.
    yield {
        "partition": partition,
        "rows": sum(1 for _ in rows),
        "pid": os.getpid(),
        "ppid_chain": ancestor_pids(os.getpid()),
        "cwd": os.getcwd(),
    }


def main(master: str, out: Path) -> dict[str, Any]:
    spark = local_spark_builder("cluster-smoke", master=master).getOrCreate()
    try:
        spark.sparkContext.setLogLevel("ERROR")
        numbers = spark.sparkContext.parallelize(range(ROWS), PARTITIONS)
        tasks = numbers.mapPartitionsWithIndex(describe_task).collect()
        table = str(out / "numbers.parquet")
        spark.range(ROWS).repartition(PARTITIONS).write.mode("overwrite").parquet(table)
        return {
            "driver_pid": os.getpid(),
            "app_id": spark.sparkContext.applicationId,
            "tasks": tasks,
            "rows_read": spark.read.parquet(table).count(),
        }
    finally:
        spark.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True, help="spark://HOST:PORT of the cluster")
    parser.add_argument("--out", required=True, type=Path, help="a folder executors reach")
    args = parser.parse_args()
    print(json.dumps(main(args.master, args.out.resolve())))
