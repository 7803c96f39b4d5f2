"""The migrations build the schema the models declare (tables, columns, types,
indexes, constraints), on both databases: a model change without its migration, or a
migration that differs from its model, fails here."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.orm import Session

from metaservice.db import make_engine
from metaservice.iceberg_rest import repository as repo
from metaservice.migrate import alembic_config, upgrade
from metaservice.models import Base
from metaservice.versions import repository as versions_repo


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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request) -> str:  # type: ignore[no-untyped-def]
    """An empty database of each kind, not migrated."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")  # type: ignore[no-any-return]


def test_0018_keeps_a_live_catalog_session_and_what_it_reads(empty_url):
    """A session opened before 0018 (a row per table, a lease of named snapshots) reads
    the same tables and snapshots after it, and its lease still pins them."""
    upgrade(empty_url, "0017")
    engine = make_engine(empty_url)
    try:
        with engine.begin() as conn:
            for i, name in ((1, "ods.a"), (2, "dw.b")):
                conn.execute(
                    text("INSERT INTO tables (id, name, created_ms) VALUES (:i, :n, 0)"),
                    {"i": i, "n": name},
                )
            conn.execute(
                text(
                    "INSERT INTO leases (id, barrier, created_ms, expires_ms) "
                    "VALUES ('l1', 5000, 0, 99999999999999)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO lease_snapshots (lease_id, table_id, snapshot_id) "
                    "VALUES ('l1', 1, 77), ('l1', 2, NULL)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO catalog_sessions (lease_id, warehouse, created_ms) "
                    "VALUES ('l1', 'consistent', 0)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO catalog_session_tables (lease_id, name, table_id) "
                    "VALUES ('l1', 'ods.a', 1), ('l1', 'dw.b', 2)"
                )
            )
        upgrade(empty_url)
        with Session(engine) as session:
            row = repo.session_row(session, "l1")
            assert row is not None and not row.all_tables
            assert row.tables == {"ods.a": (1, 77), "dw.b": (2, None)}
            assert [(t.name, t.snapshot_id) for t in repo.session_tables(session, row)] == [
                ("dw.b", None),
                ("ods.a", 77),
            ]
            assert versions_repo.live_lease_snapshots(session, 1, 0) == [("l1", 99999999999999, 77)]
        command.downgrade(alembic_config(empty_url), "0017")  # and back: the rows return
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM catalog_session_tables), "
                    "(SELECT count(*) FROM lease_snapshots), (SELECT count(*) FROM leases)"
                )
            ).one()
        assert tuple(rows) == (2, 2, 1)
    finally:
        engine.dispose()
