"""Who should write a batch's files: Spark's own Parquet writer or pyiceberg's in Python workers.

``spark_barrier.iceberg.files.write_data_files`` on two identical tables side by side,
one with the table property ``spark-barrier.write.native=true`` (Spark's writer, see
``spark_barrier.iceberg.native_write``) and one with ``false`` (pyiceberg's writer in
``mapInArrow`` tasks): unpartitioned and partitioned by ``day(at)``, for batches of 500,
100,000 and 1,000,000 rows (id, a string, a timestamp, a decimal), cached before each
write so only the write is timed (footers read and files described included). The two
alternate, their order flipping every repetition; the first repetition is a warm-up;
medians and the paired ratio (Spark / Python workers, each against the run beside it).

    python -m bench.bench_writer [--out bench/results/writer.json] [--repetitions 6]
                                 [--sizes 500,100000,1000000]

Run it alone: no test suite or other Spark job beside it. local[2], tables in a
temporary folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bench.common import host_facts, loadavg
from spark_barrier.iceberg.catalog import ensure_table, open_catalog
from spark_barrier.iceberg.files import write_data_files
from spark_barrier.iceberg.native_write import NATIVE_WRITER_PROPERTY
from spark_barrier.spark_session import local_spark_builder

SIZES = (500, 100_000, 1_000_000)
SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("note", T.StringType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("amount", T.DecimalType(18, 2)),
    ]
)
LAYOUTS = {"unpartitioned": [], "day(at)": ["day(at)"]}


def batch(spark: SparkSession, rows: int) -> DataFrame:
    """`rows` rows over three days, cached and counted (the write reads them from memory)."""
    df = spark.range(rows).select(
        F.col("id"),
        F.concat(F.lit("note-"), F.col("id")).alias("note"),
        (
            F.lit("2026-11-24 00:00:00").cast("timestamp") + F.expr("make_interval(0,0,0,id % 3)")
        ).alias("at"),
        (F.col("id") / 7).cast("decimal(18,2)").alias("amount"),
    )
    df.cache().count()
    return df


def table_pair(catalog: Any, layout: str) -> dict[str, Table]:
    """Two identical tables; only the first asks for Spark's writer."""
    tables = {}
    for writer in ("spark", "python"):
        name = f"bench.{writer}_{layout.replace('(', '_').replace(')', '')}"
        table = ensure_table(catalog, name, SCHEMA, partition_by=LAYOUTS[layout])
        with table.transaction() as txn:  # either way, whatever the batch's size
            txn.set_properties({NATIVE_WRITER_PROPERTY: "true" if writer == "spark" else "false"})
        tables[writer] = table
    return tables


def timed_write(df: DataFrame, table: Table) -> float:
    started = time.perf_counter()
    write_data_files(df, f"{table.location()}/data/bench-{uuid.uuid4().hex}", table)
    return (time.perf_counter() - started) * 1000


def measure(
    spark: SparkSession, catalog: Any, repetitions: int, sizes: list[int]
) -> list[dict[str, Any]]:
    results = []
    for layout in LAYOUTS:
        tables = table_pair(catalog, layout)
        for rows in sizes:
            df = batch(spark, rows)
            ms: dict[str, list[float]] = {"spark": [], "python": []}
            for rep in range(repetitions + 1):  # the first is a warm-up
                order = ("spark", "python") if rep % 2 else ("python", "spark")
                for writer in order:
                    took = timed_write(df, tables[writer])
                    if rep:
                        ms[writer].append(took)
            df.unpersist()
            paired = [s / p for s, p in zip(ms["spark"], ms["python"], strict=True)]
            row = {
                "layout": layout,
                "rows": rows,
                "spark_median_ms": round(statistics.median(ms["spark"]), 1),
                "python_workers_median_ms": round(statistics.median(ms["python"]), 1),
                "paired_ratio_median": round(statistics.median(paired), 3),
                "spark_ms": [round(x, 1) for x in ms["spark"]],
                "python_workers_ms": [round(x, 1) for x in ms["python"]],
                "loadavg_1m": loadavg()[0] if loadavg() else None,
            }
            print(
                f"{layout:>13} {rows:>9,} rows: Spark {row['spark_median_ms']:7.0f} ms, "
                f"Python workers {row['python_workers_median_ms']:7.0f} ms, "
                f"paired ratio {row['paired_ratio_median']:.2f}",
                flush=True,
            )
            results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/writer.json")
    parser.add_argument("--repetitions", type=int, default=6, help="measured, after a warm-up")
    parser.add_argument("--sizes", default=",".join(str(n) for n in SIZES), help="rows per batch")
    args = parser.parse_args()
    spark = local_spark_builder("bench-writer", quiet=True).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="bench-writer-"))
    started = time.time()
    try:
        catalog = open_catalog(f"sqlite:///{root / 'catalog.db'}", str(root / "warehouse"))
        before = loadavg()
        results = measure(spark, catalog, args.repetitions, [int(n) for n in args.sizes.split(",")])
        report = {
            "benchmark": "bench_writer: Spark's Parquet writer against pyiceberg's in Python workers",
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": round(time.time() - started, 1),
            "machine": {**host_facts(), "spark_master": "local[2] (local_spark_builder)"},
            "loadavg_before": before,
            "loadavg_after": loadavg(),
            "repetitions": args.repetitions,
            "results": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"written to {args.out}")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
