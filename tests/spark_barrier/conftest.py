"""Fixtures for the Spark-side tests: a fresh catalog per test (the SparkSession is
shared by the whole run, see tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog

from spark_barrier.iceberg.catalog import open_catalog


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
