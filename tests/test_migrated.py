"""The tests' fresh databases (tests/migrated.py) are the ones ``alembic upgrade`` makes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text

from metaservice.migrate import head_revision, upgrade
from tests.conftest import pg_schema
from tests.migrated import migrate_fresh


def _catalog(url: str) -> dict[str, Any]:
    """Every table's columns, keys, indexes and rows, and the migration it is at."""
    engine = create_engine(url)
    try:
        found = inspect(engine)
        tables = sorted(found.get_table_names())
        with engine.connect() as conn:
            return {
                name: {
                    "columns": [
                        (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                        for c in found.get_columns(name)
                    ],
                    "primary_key": found.get_pk_constraint(name)["constrained_columns"],
                    "foreign_keys": sorted(
                        (tuple(f["constrained_columns"]), f["referred_table"], str(f["options"]))
                        for f in found.get_foreign_keys(name)
                    ),
                    "indexes": sorted(
                        (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                        for i in found.get_indexes(name)
                    ),
                    "unique": sorted(
                        (u["name"], tuple(u["column_names"]))
                        for u in found.get_unique_constraints(name)
                    ),
                    "rows": sorted(
                        repr(tuple(r)) for r in conn.execute(text(f'SELECT * FROM "{name}"'))
                    ),
                }
                for name in tables
            }
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def two_empty(request, tmp_path) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
        return
    with pg_schema() as first, pg_schema() as second:
        yield first, second


def test_a_fresh_database_is_the_one_upgrade_makes(two_empty: tuple[str, str]) -> None:
    upgraded, copied = two_empty
    upgrade(upgraded)
    migrate_fresh(copied)
    a, b = _catalog(upgraded), _catalog(copied)
    assert "alembic_version" in b and len(b) > 10
    assert a == b
    assert b["alembic_version"]["rows"] == [repr((head_revision(),))]
