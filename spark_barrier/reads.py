"""Consistent batch reads: several tables at one consistent version."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame, SparkSession

from metaservice.client import MetaServiceClient
from metaservice.versions.schemas import ConsistentVersion
from spark_barrier.iceberg.read import read_snapshot
from spark_barrier.iceberg.stamps import snapshot_at


@dataclass
class ConsistentRead:
    """DataFrames of several tables that belong together, and the version they come from."""

    version: ConsistentVersion
    frames: dict[str, DataFrame]

    def __getitem__(self, table: str) -> DataFrame:
        return self.frames[table]


def read_consistent(
    spark: SparkSession,
    client: MetaServiceClient,
    catalog: Catalog,
    tables: Sequence[str],
    *,
    at_or_before: int | None = None,
    lease_seconds: int | None = None,
) -> ConsistentRead:
    """Read ``tables`` at their latest consistent version (optionally pinned by a lease).

    >>> read = read_consistent(spark, ms, catalog, ["dwd.order_detail", "dws.item_revenue"])  # doctest: +SKIP
    >>> read["dws.item_revenue"].show()  # doctest: +SKIP
    """
    version = client.consistent_version(
        tables, at_or_before=at_or_before, lease_seconds=lease_seconds
    )
    frames = {
        name: read_snapshot(spark, catalog.load_table(name), snapshot)
        for name, snapshot in version.snapshots.items()
    }
    return ConsistentRead(version=version, frames=frames)


def read_at_barrier(spark: SparkSession, catalog: Catalog, table: str, barrier: int) -> DataFrame:
    """``table`` as of ``barrier``: its latest snapshot stamped at or before it."""
    iceberg = catalog.load_table(table)
    return read_snapshot(spark, iceberg, snapshot_at(iceberg, barrier))
