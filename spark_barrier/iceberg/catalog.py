"""The Iceberg catalog on the Spark side: loading it (:mod:`metaservice.catalog_loading`,
the one module both sides load catalogs with, re-exported here) and creating the tables
jobs write (:func:`ensure_table`, :func:`check_partition_by`).

This module imports no pyspark at load time: a Spark ``StructType`` given as a schema is
mapped only when one is passed (pyspark is loaded by then).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table, TableProperties

from metaservice.catalog_loading import (
    CATALOG_NAME,
    DB_URL_ENV,
    DEFAULT_DB_URL,
    DEFAULT_WAREHOUSE,
    WAREHOUSE_ENV,
    CatalogUnavailable,
    check_warehouse,
    load_catalog,
    normalised_properties,
    open_catalog,
    shown,
    sql_catalog_properties,
)
from spark_barrier.iceberg.partitioning import check_same_spec, describe, partition_spec

if TYPE_CHECKING:
    from pyspark.sql import types as T

__all__ = [
    "CATALOG_NAME",
    "DB_URL_ENV",
    "DEFAULT_DB_URL",
    "DEFAULT_WAREHOUSE",
    "WAREHOUSE_ENV",
    "CatalogUnavailable",
    "check_partition_by",
    "check_warehouse",
    "ensure_table",
    "load_catalog",
    "normalised_properties",
    "open_catalog",
    "shown",
    "sql_catalog_properties",
]


def ensure_table(
    catalog: Catalog,
    identifier: str,
    schema: pa.Schema | Schema | T.StructType,
    partition_by: Sequence[str] = (),
) -> Table:
    """Return table `identifier` (`ns.table`), creating its namespace and itself if missing.

    `schema` may be an Arrow schema, a pyiceberg schema or a Spark `StructType`
    (mapped with `spark_schema_to_arrow`). `partition_by` is the partition spec of a
    new table, e.g. `["day(ordered_at)", "bucket(16, item_id)", "region"]` (see
    :mod:`spark_barrier.iceberg.partitioning`); it is checked against `schema` before
    anything is created, so a bad spec leaves no namespace and no table behind.

    An existing table is returned as is (its schema is not evolved); when
    `partition_by` is given and the table's spec is not that one, `PartitionSpecError`
    says so. Without `partition_by`, an existing table's spec is accepted whatever it is.
    """
    namespace = identifier.rsplit(".", 1)[0] if "." in identifier else None
    if namespace is None:
        raise ValueError(f"table identifier needs a namespace: {identifier!r}")
    iceberg_schema = _iceberg_schema(schema)
    spec = partition_spec(partition_by, iceberg_schema)
    try:
        # Looked up first: pyiceberg's SQL, Hive, Glue and DynamoDB catalogs write a new
        # table's metadata file before they find the name taken, so creating an existing
        # table would leave an orphan metadata file in it at every job start.
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        catalog.create_namespace_if_not_exists(namespace)
        table = catalog.create_table_if_not_exists(  # (another driver may be creating it)
            identifier,
            schema=iceberg_schema,
            partition_spec=spec,
            properties={TableProperties.COMMIT_NUM_RETRIES: "0"},
        )
    if partition_by:
        asked = describe(spec, iceberg_schema)
        check_same_spec(identifier, describe(table.spec(), table.schema()), asked)
    return table


def check_partition_by(
    schema: pa.Schema | Schema | T.StructType, partition_by: Sequence[str]
) -> None:
    """Raise `PartitionSpecError` if `partition_by` cannot partition a table of `schema`.

    Creates nothing: checking every output's spec first keeps a registration that
    fails on one of them from creating the others.
    """
    partition_spec(partition_by, _iceberg_schema(schema))


def _iceberg_schema(schema: pa.Schema | Schema | T.StructType) -> Schema:
    # A partition spec names its columns by field id: give an Arrow (or Spark) schema
    # ids as create_table would (it converts the same way, then renumbers by name).
    if isinstance(schema, Schema):
        return schema
    if not isinstance(schema, pa.Schema):  # a Spark StructType: pyspark is loaded already
        from spark_barrier.iceberg.schemas import spark_schema_to_arrow

        schema = spark_schema_to_arrow(schema)
    return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
