"""A derived job's Spark driver, run as its own process by the exactly-once tests.

    python -m tests.spark_barrier.derived_driver URL DB_URL WAREHOUSE STATE_DIR UNTIL_BARRIER

Copies ods.numbers into dwd.numbers_copy until the job has committed UNTIL_BARRIER,
then stops cleanly (exit 0); exit 3 if it did not get there in time. With
SPARK_BARRIER_CRASH_AT set it dies at that point instead (exit 97).
"""

from __future__ import annotations

import sys
import time

import spark_barrier
from spark_barrier import local_spark_builder
from tests.spark_barrier.pipeline import NUMBERS_SCHEMA

JOB, SOURCE, TARGET = "copy_numbers", "ods.numbers", "dwd.numbers_copy"


def main(url: str, db_url: str, warehouse: str, state_dir: str, until: int) -> int:
    spark = local_spark_builder("derived-driver").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    job = spark_barrier.register(
        spark,
        url,
        job=JOB,
        inputs=[SOURCE],
        outputs={TARGET: NUMBERS_SCHEMA},
        catalog_uri=db_url,
        warehouse=warehouse,
        state_dir=state_dir,
    )
    query = job.start(job.source(SOURCE), job.sink(), trigger_seconds=0.5)
    deadline = time.monotonic() + 180
    try:
        while job.client.get_job(JOB).frontier < until:
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


if __name__ == "__main__":
    url, db_url, warehouse, state_dir, until = sys.argv[1:6]
    sys.exit(main(url, db_url, warehouse, state_dir, int(until)))
