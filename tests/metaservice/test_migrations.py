"""The migrations build the schema the models declare (tables, columns, types,
indexes, constraints), on both databases: a model change without its migration, or a
migration that differs from its model, fails here."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from metaservice.db import make_engine
from metaservice.models import Base


def test_the_migrated_schema_is_the_models_schema(db_url):
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_commits_with_a_snapshot_have_their_own_index(db_url):
    engine = make_engine(db_url)
    try:
        indexes = {ix["name"]: ix for ix in inspect(engine).get_indexes("commits")}
    finally:
        engine.dispose()
    partial = indexes["ix_commits_table_barrier_with_snapshot"]
    assert partial["column_names"] == ["table_id", "barrier", "batch_id", "snapshot_id"]
    where = partial.get("dialect_options", {})
    assert any("snapshot_id IS NOT NULL" in str(v) for v in where.values()), partial
