"""Fresh databases at the migrations' head, made in milliseconds instead of by Alembic.

About 1,100 tests each need an empty database migrated to head. ``alembic upgrade``
took 0.3 s of a worker on SQLite and 0.5-1 s on PostgreSQL, where every upgrade also
holds one advisory lock, so the test processes took turns: minutes of every run. Here
each test process migrates once and copies the result:

- SQLite: ``upgrade`` into a template file, which each test's database file is a copy of;
- PostgreSQL: ``upgrade`` into a template schema while every statement it sends is
  recorded (with its parameters), then replayed in one transaction into each test's own
  schema (its URL's ``search_path``; the migrations name no schema); once a test is
  done with its schema, the schema is emptied back to head for the process's next test
  (:func:`pg_schema_at_head`).

Either way the database is the one ``upgrade`` makes (``tests/test_migrated.py``
compares their catalogs). Tests of the migrations themselves call ``upgrade``.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

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


# --------------------------------------------------------------------------- reuse
#
# Even replayed, a PostgreSQL schema at head costs 0.16 s of the machine's CPU to create,
# migrate and drop (most of it the server's DDL), for each of about 550 tests. A test
# process keeps the schemas its tests used instead and empties one for the next test:
# every row deleted, the rows the migrations wrote put back and every sequence set back
# as they were at head (about 20 ms, most of it the catalog's fingerprint). A schema
# whose catalog a test changed (a table of its own, such as a pyiceberg SQL catalog's,
# or an index dropped) or that could not be emptied is dropped as before, so the next
# test always gets the one upgrade makes (tests/test_migrated.py compares a reused one).


@dataclass(frozen=True)
class Rows:
    """Every row of a schema's tables, and its sequences' positions."""

    tables: dict[str, tuple[list[str], list[tuple[Any, ...]]]]  # table -> (columns, rows)
    sequences: dict[str, tuple[int, bool]]  # sequence -> (last_value, is_called)


@dataclass(frozen=True)
class _Head:
    """What an unused schema at head holds: its catalog's fingerprint, and the rows the
    migrations wrote with its sequences' positions."""

    fingerprint: str
    rows: Rows


_head: _Head | None = None
_free_schemas: list[str] = []
_server: Engine | None = None  # one connection of this process: schemas made, reset, dropped


def _server_of(base: str) -> Engine:
    global _server
    if _server is None:
        _server = create_engine(base, pool_size=1)
    return _server


# Every table, column (with its type and nullability), constraint, index, trigger and
# function of the connection's schema, as one text; schema names left out, and the
# triggers PostgreSQL makes for foreign keys (named by their oids).
_FINGERPRINT = """
SELECT md5(coalesce(string_agg(item, E'\\n' ORDER BY item), '')) FROM (
    SELECT c.relname || ' ' || c.relkind::text || ' ' || coalesce(a.attname, '') || ' '
           || coalesce(format_type(a.atttypid, a.atttypmod), '') || ' '
           || coalesce(a.attnotnull::text, '') AS item
    FROM pg_class c
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE c.relnamespace = current_schema()::regnamespace
    UNION ALL
    SELECT conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
    UNION ALL
    SELECT tablename || ' ' || replace(indexdef, current_schema() || '.', '')
    FROM pg_indexes WHERE schemaname = current_schema()
    UNION ALL
    SELECT tgrelid::regclass::text || ' ' || tgname FROM pg_trigger t
    JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal
    UNION ALL
    SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
) items
"""


def _read_rows(conn: Any) -> Rows:
    tables = {}
    names = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    for table in sorted(conn.exec_driver_sql(names).scalars()):
        result = conn.exec_driver_sql(f'SELECT * FROM "{table}"')
        tables[table] = (list(result.keys()), [tuple(r) for r in result])
    names = "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()"
    sequences = {}
    for name in sorted(conn.exec_driver_sql(names).scalars()):
        value, called = conn.exec_driver_sql(f'SELECT last_value, is_called FROM "{name}"').one()
        sequences[name] = (int(value), bool(called))
    return Rows(tables, sequences)


def _put_rows(conn: Any, rows: Rows) -> None:
    """Replace every row of the tables ``rows`` names with its rows, and set its
    sequences (in the caller's transaction)."""
    # No foreign key checked while the rows go and come back (superuser only).
    conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
    for table, (columns, values) in rows.tables.items():
        conn.exec_driver_sql(f'DELETE FROM "{table}"')
        if values:
            names = ", ".join(f'"{c}"' for c in columns)
            marks = ", ".join(["%s"] * len(columns))
            conn.exec_driver_sql(f'INSERT INTO "{table}" ({names}) VALUES ({marks})', values)
    for name, (value, called) in rows.sequences.items():
        conn.exec_driver_sql("SELECT setval(%s, %s, %s)", (f'"{name}"', value, called))


def _read_head(conn: Any) -> _Head:
    return _Head(conn.exec_driver_sql(_FINGERPRINT).scalar_one(), _read_rows(conn))


def _empty(base: str, schema: str) -> bool:
    """Bring a used schema back to head (see above); False when it cannot be reused."""
    assert _head is not None
    try:
        with _server_of(base).begin() as conn:
            conn.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
            conn.exec_driver_sql("SET LOCAL lock_timeout = '5s'")  # a test left a session
            # the same tables and sequences as at head, and the same definitions
            if conn.exec_driver_sql(_FINGERPRINT).scalar_one() != _head.fingerprint:
                return False
            _put_rows(conn, _head.rows)
        return True
    except Exception:  # whatever went wrong, dropping the schema is always right
        return False


@contextmanager
def _in_schema(url: str) -> Iterator[Any]:
    """A transaction of this process's engine in the schema ``url`` names (a URL from
    :func:`with_search_path`)."""
    parsed = make_url(url)
    schema = parsed.query["options"].removeprefix("-csearch_path=")
    base = parsed.difference_update_query(["options"]).render_as_string(hide_password=False)
    with _server_of(base).begin() as conn:
        conn.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
        yield conn


def pg_rows(url: str) -> Rows:
    """Every row of the PostgreSQL schema ``url`` names (its ``search_path``)."""
    with _in_schema(url) as conn:
        return _read_rows(conn)


def pg_put_rows(url: str, rows: Rows) -> None:
    """Make the PostgreSQL schema ``url`` names hold ``rows`` (from :func:`pg_rows` of a
    schema with the same catalog), as one transaction."""
    with _in_schema(url) as conn:
        _put_rows(conn, rows)


@contextmanager
def pg_schema_at_head(base: str) -> Iterator[str]:
    """The URL of a PostgreSQL schema at head for one test: a used one emptied, or a new
    one migrated; kept for the next test afterwards, or dropped."""
    global _head
    server = _server_of(base)
    if _free_schemas:
        schema = _free_schemas.pop()
    else:
        schema = "t_" + uuid.uuid4().hex[:12]
        with server.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        migrate_fresh(with_search_path(base, schema))
    if _head is None:
        with server.begin() as conn:
            conn.exec_driver_sql(f"SET LOCAL search_path TO {schema}")
            _head = _read_head(conn)
    try:
        yield with_search_path(base, schema)
    finally:
        if _empty(base, schema):
            _free_schemas.append(schema)
        else:
            with server.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")


def drop_free_schemas() -> None:
    """Drop the schemas this process kept (at its end)."""
    global _server
    if _server is None:
        return
    with _server.begin() as conn:
        while _free_schemas:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {_free_schemas.pop()} CASCADE")
    _server.dispose()
    _server = None


def with_search_path(url: str, schema: str) -> str:
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}options={quote(f'-csearch_path={schema}')}"
