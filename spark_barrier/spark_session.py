"""SparkSession settings the barrier integration relies on.

The Iceberg layer (`spark_barrier.iceberg`) needs Parquet timestamps written as
INT64 micros: Spark's default, INT96, is a legacy encoding that Iceberg (and
pyiceberg's `add_files`) rejects.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

PARQUET_TIMESTAMP_TYPE_KEY = "spark.sql.parquet.outputTimestampType"
PARQUET_TIMESTAMP_TYPE = "TIMESTAMP_MICROS"


QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")


def local_spark_builder(
    app_name: str,
    builder: SparkSession.Builder | None = None,
    master: str = "local[2]",
    *,
    quiet: bool = False,
) -> SparkSession.Builder:
    """Configure a `SparkSession.builder` for a small local session (tests, examples).

    `local[2]` (or `master`, e.g. a test cluster's `spark://` URL), no UI and no console
    progress bars (they garble the output of streaming drivers), two shuffle
    partitions (the default 200 makes tiny jobs slow),
    UTC session time zone, TIMESTAMP_MICROS Parquet output, Python workers on the
    driver's interpreter and a loopback driver address (so a machine whose hostname does not resolve still works).

    Pass `builder` to add these settings to a builder you already configured; the
    builder is returned so further `.config(...)` calls chain. ``quiet`` starts the
    driver's JVM logging errors only (`log4j2-quiet.properties`), so none of Spark's
    start-up INFO and WARN lines reach the terminal; it sets
    ``spark.driver.extraJavaOptions``.
    """
    # PySpark's SparkContext picks the worker interpreter from PYSPARK_PYTHON (else
    # `python3` on PATH, which may lack pyarrow/pyiceberg); the conf alone is not enough.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    base = builder if builder is not None else SparkSession.builder
    if quiet:
        base = base.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={QUIET_LOG4J.as_uri()}"
        )
    return (
        base.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config(PARQUET_TIMESTAMP_TYPE_KEY, PARQUET_TIMESTAMP_TYPE)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        # Python workers run the driver's interpreter: the barrier source and the
        # sink's helpers need the same packages (pyiceberg, pyarrow) on both sides.
        .config("spark.pyspark.python", sys.executable)
        # Python workers (barrier sources, foreachBatch) must connect back within this;
        # the default 15 s is too short on a loaded 2-core machine.
        .config("spark.python.authenticate.socketTimeout", "120s")
    )
