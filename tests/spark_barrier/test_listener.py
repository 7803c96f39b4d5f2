"""The session's StreamingQueryListener lives as long as the jobs that report through it."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import types as T

import spark_barrier
from spark_barrier.job import BarrierJob
from tests.spark_barrier.pipeline import Service

NUMBERS = T.StructType([T.StructField("id", T.LongType())])


def _listeners(spark: SparkSession) -> int:
    """Listeners registered with the session's StreamingQueryManager (the JVM's list)."""
    return len(spark._jsparkSession.streams().listListeners())  # type: ignore[union-attr]


def _register(spark: SparkSession, service: Service, job: str) -> BarrierJob:
    return spark_barrier.register(
        spark,
        service.url,
        job=job,
        outputs={f"ods.{job}": NUMBERS},
        catalog_properties=service.catalog_properties,
        state_dir=service.state_dir,
    )


def test_the_listener_is_removed_from_spark_when_its_last_job_closes(
    spark: SparkSession, service: Service
) -> None:
    before = _listeners(spark)
    first, second = _register(spark, service, "first"), _register(spark, service, "second")
    assert _listeners(spark) == before + 1  # one per session and MetaService

    first.close()
    assert _listeners(spark) == before + 1  # the second job still reports through it
    second.close()
    # Spark calls every listener for every event of every query: none is left behind.
    assert _listeners(spark) == before

    again = _register(spark, service, "first")
    assert _listeners(spark) == before + 1
    again.close()
    assert _listeners(spark) == before
