"""The tests' fresh databases (tests/migrated.py) are the ones ``alembic upgrade`` makes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text

from metaservice.clock import ManualClock
from metaservice.migrate import head_revision, upgrade
from tests.conftest import START_MS, pg_base_url_or_skip, pg_schema
from tests.metaservice.helpers import custom_client, put_job, run_batch
from tests.migrated import migrate_fresh, pg_schema_at_head


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


@pytest.mark.postgres
def test_a_schema_used_by_a_test_is_emptied_back_to_the_one_upgrade_makes() -> None:
    base = pg_base_url_or_skip()
    with pg_schema_at_head(base) as first, custom_client(first, ManualClock(START_MS)) as client:
        put_job(client, "a", ["ods.a"])  # what a test leaves: rows, the clock moved
        put_job(client, "b", ["ods.b"])
        run_batch(client, "b", 0, {"ods.b": 1})
    with pg_schema_at_head(base) as reused, pg_schema() as upgraded:
        assert reused == first, "the used schema was not kept for the next test"
        upgrade(upgraded)
        assert _catalog(reused) == _catalog(upgraded)
        with custom_client(reused, ManualClock(START_MS)) as client:  # ids start again
            put_job(client, "b", ["ods.b"])
        engine = create_engine(reused)
        with engine.connect() as conn:
            ids = conn.execute(text("SELECT id FROM jobs")).scalars().all()
        engine.dispose()
        assert ids == [1], ids


@pytest.mark.postgres
def test_a_schema_whose_catalog_a_test_changed_is_not_reused() -> None:
    base = pg_base_url_or_skip()
    with pg_schema_at_head(base) as first:
        engine = create_engine(first)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE iceberg_tables (x int)"))
        engine.dispose()
    with pg_schema_at_head(base) as second:
        assert second != first


@pytest.mark.postgres
def test_every_schema_a_test_used_is_kept() -> None:
    # Each schema its own: nothing of one schema's catalog (such as the names of the
    # triggers PostgreSQL makes for foreign keys, by oid) may tell two apart.
    base = pg_base_url_or_skip()
    with pg_schema_at_head(base) as one, pg_schema_at_head(base) as two:
        pass
    with pg_schema_at_head(base) as again, pg_schema_at_head(base) as again_too:
        assert {again, again_too} == {one, two}
