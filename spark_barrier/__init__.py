"""Barrier-aligned Spark Structured Streaming on Apache Iceberg, coordinated by the MetaService.

import spark_barrier
job = spark_barrier.register(spark, "http://127.0.0.1:8765", job="enrich",
                             inputs=["ods.orders"], outputs={"dwd.detail": schema})
job.start(job.source("ods.orders"), job.sink())
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from metaservice import __version__  # one distribution, one version

if TYPE_CHECKING:
    from spark_barrier.batch_context import BatchContext
    from spark_barrier.errors import BarrierBatchError, BarrierConfigError
    from spark_barrier.job import BarrierJob
    from spark_barrier.log_source import read_log
    from spark_barrier.reads import ConsistentRead, read_at_barrier, read_consistent
    from spark_barrier.registration import register
    from spark_barrier.sink import BarrierSink
    from spark_barrier.spark_session import local_spark_builder
    from spark_barrier.stopping import stop_between_batches

# The public names, loaded on first use: `spark_barrier.iceberg.catalog` (a catalog
# and its tables, made before any SparkSession) must import without pyspark, and
# importing a submodule runs this file first.
_HOME = {
    **dict.fromkeys(("BarrierBatchError", "BarrierConfigError"), "spark_barrier.errors"),
    "BarrierJob": "spark_barrier.job",
    "BarrierSink": "spark_barrier.sink",
    "BatchContext": "spark_barrier.batch_context",
    "register": "spark_barrier.registration",
    "stop_between_batches": "spark_barrier.stopping",
    **dict.fromkeys(
        ("ConsistentRead", "read_at_barrier", "read_consistent"), "spark_barrier.reads"
    ),
    "local_spark_builder": "spark_barrier.spark_session",
    "read_log": "spark_barrier.log_source",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'spark_barrier' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


__all__ = [
    "BarrierBatchError",
    "BarrierConfigError",
    "BarrierJob",
    "BarrierSink",
    "BatchContext",
    "ConsistentRead",
    "__version__",
    "local_spark_builder",
    "read_at_barrier",
    "read_consistent",
    "read_log",
    "register",
    "stop_between_batches",
]
