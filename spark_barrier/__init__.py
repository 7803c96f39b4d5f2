"""Barrier-aligned Spark Structured Streaming on Apache Iceberg, coordinated by the MetaService.

import spark_barrier
job = spark_barrier.register(spark, "http://127.0.0.1:8765", job="enrich",
                             inputs=["ods.orders"], outputs={"dwd.detail": schema})
job.start(job.source("ods.orders"), job.sink())
"""

from spark_barrier.job import (
    BarrierBatchError,
    BarrierConfigError,
    BarrierJob,
    BarrierSink,
    BatchContext,
    register,
    stop_between_batches,
)
from spark_barrier.reads import ConsistentRead, read_at_barrier, read_consistent
from spark_barrier.spark_session import local_spark_builder

__all__ = [
    "BarrierBatchError",
    "BarrierConfigError",
    "BarrierJob",
    "BarrierSink",
    "BatchContext",
    "ConsistentRead",
    "local_spark_builder",
    "read_at_barrier",
    "read_consistent",
    "register",
    "stop_between_batches",
]
