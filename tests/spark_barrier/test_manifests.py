"""Manifest entries kept once read (spark_barrier.iceberg.manifests), without Spark."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import ManifestFile
from pyiceberg.table import Table

from spark_barrier.iceberg import manifests

SCHEMA = pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.string())])


@pytest.fixture
def table(tmp_path: Path) -> Iterator[Table]:
    catalog = SqlCatalog(
        "t", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri()
    )
    catalog.create_namespace("ods")
    table = catalog.create_table("ods.t", schema=SCHEMA)
    for i in range(4):
        table.append(pa.table({"k": [i, i + 10], "v": [str(i), str(i + 10)]}, schema=SCHEMA))
    yield table
    manifests.uninstall()


def plan(table: Table) -> list[tuple[str, int, Any]]:
    return sorted(
        (t.file.file_path, t.file.record_count, t.file.spec_id) for t in table.scan().plan_files()
    )


def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The manifests pyiceberg itself decodes from now on."""
    seen: list[str] = []
    original = ManifestFile.fetch_manifest_entry

    def counted(manifest: ManifestFile, io: Any, discard_deleted: bool = True) -> Any:
        seen.append(manifest.manifest_path)
        return original(manifest, io, discard_deleted)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)
    return seen


def test_a_manifest_is_decoded_once_and_plans_stay_the_same(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    without = plan(table)
    seen = reads(monkeypatch)
    manifests.install()
    assert plan(table) == without
    assert len(seen) == 4  # one manifest per append
    assert plan(table) == without
    assert len(seen) == 4  # all kept

    table.delete("k = 1")  # rewrites one file: an overwrite with new manifests
    table.append(pa.table({"k": [99], "v": ["99"]}, schema=SCHEMA))
    after = plan(table)
    rows = sorted(r["k"] for r in table.scan().to_arrow().to_pylist())
    assert rows == [0, 2, 3, 10, 11, 12, 13, 99]
    manifests.uninstall()
    assert plan(table) == after  # pyiceberg's own reading gives the same files


def test_no_more_entries_than_the_limit_are_kept(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifests, "MAX_ENTRIES", 3)
    manifests.install()
    plan(table)
    assert manifests.kept_entries() <= 3
    seen = reads(monkeypatch)
    assert plan(table) == plan(table)
    assert seen  # some were read again
