"""Fresh databases at the migrations' head, made in milliseconds instead of by Alembic.

About 1,100 tests each need an empty database migrated to head. ``alembic upgrade``
took 0.3 s of a worker on SQLite and 0.5-1 s on PostgreSQL, where every upgrade also
holds one advisory lock, so the test processes took turns: minutes of every run. Here
each test process migrates once and copies the result:

- SQLite: ``upgrade`` into a template file, which each test's database file is a copy of;
- PostgreSQL: ``upgrade`` into a template schema while every statement it sends is
  recorded (with its parameters), then replayed in one transaction into each test's own
  schema (its URL's ``search_path``; the migrations name no schema).

Either way the database is the one ``upgrade`` makes (``tests/test_migrated.py``
compares their catalogs). Tests of the migrations themselves call ``upgrade``.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from metaservice.db import normalise_url
from metaservice.migrate import upgrade


@dataclass(frozen=True)
class Statement:
    sql: str
    parameters: Any
    many: bool


_sqlite_template: Path | None = None
_pg_script: list[Statement] | None = None


def migrate_fresh(url: str) -> None:
    """Bring the empty database at ``url`` to head, as ``upgrade(url)`` does."""
    if make_url(url).get_backend_name() == "sqlite":
        _copy_sqlite(url)
    else:
        _replay_postgres(url)


def _copy_sqlite(url: str) -> None:
    global _sqlite_template
    target = make_url(url).database
    if not target or target == ":memory:":
        upgrade(url)
        return
    if _sqlite_template is None:
        folder = Path(tempfile.mkdtemp(prefix="ms-template-"))
        atexit.register(shutil.rmtree, folder, True)
        template = folder / "head.db"
        upgrade(f"sqlite:///{template}")  # disposes its engine: nothing left in a WAL
        _sqlite_template = template
    shutil.copyfile(_sqlite_template, target)


def _replay_postgres(url: str) -> None:
    engine = create_engine(normalise_url(url))
    try:
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            for statement in _postgres_script(url):
                run = cursor.executemany if statement.many else cursor.execute
                run(statement.sql, statement.parameters)
            raw.commit()
        finally:
            raw.close()
    finally:
        engine.dispose()


def _postgres_script(url: str) -> list[Statement]:
    """The statements ``upgrade`` sends to an empty schema, recorded once per process."""
    global _pg_script
    if _pg_script is not None:
        return _pg_script
    base = normalise_url(url).split("?", 1)[0]
    schema = "t_tmpl_" + uuid.uuid4().hex[:12]
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    recorded: list[Statement] = []

    def record(conn: Any, cursor: Any, sql: str, parameters: Any, context: Any, many: bool) -> None:
        if "pg_advisory" in sql:  # upgrade's own lock against a concurrent upgrade
            return
        if schema in sql:
            raise AssertionError(f"a migration names its schema, it cannot be replayed: {sql}")
        recorded.append(Statement(sql, parameters, many))

    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        event.listen(Engine, "before_cursor_execute", record)
        try:
            upgrade(f"{base}?options=-csearch_path%3D{schema}")
        finally:
            event.remove(Engine, "before_cursor_execute", record)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        admin.dispose()
    _pg_script = recorded
    return recorded
