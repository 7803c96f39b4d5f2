"""A source job's Spark driver that writes its table with a log store, run as its own
process by the log store tests.

    python -m tests.spark_barrier.log_driver URL DB_URL WAREHOUSE STATE_DIR ROWS [LOG_URL]

Ingests a rate stream (20 rows a second, ids 0, 1, 2...) into ods.logged until the
table holds ROWS rows and, if LOG_DRIVER_STOP_FILE is set, that file exists, then stops
cleanly (exit 0; exit 3 if it did not get there in time). Its log is embedded in this driver, or the external one at LOG_URL. With
SPARK_BARRIER_CRASH_AT set it dies at that point instead (exit 97); run again, it
resumes from its checkpoint and replays the batch it died in.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import spark_barrier
from spark_barrier import local_spark_builder
from tests.spark_barrier.pipeline import NUMBERS_SCHEMA, rate_numbers

JOB, TABLE = "ingest_logged", "ods.logged"
STOP_FILE_ENV = "LOG_DRIVER_STOP_FILE"


def main(
    url: str, db_url: str, warehouse: str, state_dir: str, rows: int, log_url: str | None
) -> int:
    spark = local_spark_builder("log-driver").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    job = spark_barrier.register(
        spark,
        url,
        job=JOB,
        outputs={TABLE: NUMBERS_SCHEMA},
        catalog_uri=db_url,
        warehouse=warehouse,
        state_dir=state_dir,
        log="external" if log_url else "embedded",
        log_url=log_url,
    )
    stream = rate_numbers(spark, 20)
    query = job.start(stream, job.sink(), trigger_seconds=0.5)
    deadline = time.monotonic() + 180
    try:
        while _committed_rows(job) < rows or not _told_to_stop():
            if query.exception() is not None:
                raise query.exception()  # type: ignore[misc]
            if time.monotonic() > deadline:
                return 3
            time.sleep(0.3)
        return 0
    finally:
        spark_barrier.stop_between_batches(query)
        job.close()
        spark.stop()


def _told_to_stop() -> bool:
    """A test that must see this driver's log before it goes holds it with a stop file."""
    stop_file = os.environ.get(STOP_FILE_ENV)
    return stop_file is None or Path(stop_file).exists()


def _committed_rows(job: spark_barrier.BarrierJob) -> int:
    snapshot = job.table(TABLE).current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.get("total-records", "0"))


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(*args[:4], int(args[4]), args[5] if len(args) > 5 else None))
