"""Fixtures for the Spark-side tests: one local SparkSession, a fresh catalog per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from spark_barrier.iceberg_io import open_catalog
from spark_barrier.spark_session import local_spark_builder


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for the whole run (starting a JVM takes seconds)."""
    session = local_spark_builder("spark_barrier-tests").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    """The test's warehouse folder."""
    path = tmp_path / "warehouse"
    path.mkdir()
    return path


@pytest.fixture
def catalog(tmp_path: Path, warehouse: Path) -> Catalog:
    """A pyiceberg SqlCatalog on a SQLite file of its own, warehouse under tmp_path."""
    return open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", str(warehouse))


# The embedded MetaService of the pipeline tests (defined with its helpers).
from tests.spark_barrier.pipeline import service  # noqa: E402, F401
