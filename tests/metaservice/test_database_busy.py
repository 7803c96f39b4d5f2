"""A database that is reachable but too contended answers 503 ``database_busy`` (retry),
not 503 ``database_unavailable`` (an outage) nor 500: a deadlock that outlived the
transaction's retries, and a replica whose connection pool stayed exhausted.

The errors are real ones: a PostgreSQL deadlock between two connections, and
SQLAlchemy's pool timing out. They reach the service's own error handlers through a
route added to the app for the test.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from metaservice.app import create_app
from metaservice.db import database_contended, database_unreachable, schema_behind
from metaservice.settings import Settings


def _app_raising(settings: Settings, error: BaseException) -> TestClient:
    app = create_app(settings)

    @app.get("/raise")
    def _raise() -> None:
        raise error

    return TestClient(app, raise_server_exceptions=False)


def _deadlock(url: str) -> OperationalError:
    """Two transactions lock two rows in opposite orders; PostgreSQL aborts one."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS busy_rows"))
        conn.execute(text("CREATE TABLE busy_rows (id int primary key)"))
        conn.execute(text("INSERT INTO busy_rows VALUES (1), (2)"))
    both_locked_one = threading.Barrier(2)
    errors: list[BaseException] = []

    def lock(first: int, second: int) -> None:
        try:
            with engine.begin() as conn:
                conn.execute(text(f"SELECT * FROM busy_rows WHERE id = {first} FOR UPDATE"))
                both_locked_one.wait(timeout=10)
                conn.execute(text(f"SELECT * FROM busy_rows WHERE id = {second} FOR UPDATE"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=lock, args=pair) for pair in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    engine.dispose()
    assert len(errors) == 1 and isinstance(errors[0], OperationalError), errors
    return errors[0]


@pytest.mark.postgres
def test_a_deadlock_is_contention_not_an_outage(pg_url: str) -> None:
    deadlock = _deadlock(pg_url)
    assert getattr(deadlock.orig, "sqlstate", None) == "40P01"
    assert database_contended(deadlock) and not database_unreachable(deadlock)
    with _app_raising(Settings(db_url=pg_url), deadlock) as http:
        answer = http.get("/raise")
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "database_busy"
    assert "Nothing was applied" in answer.json()["message"]
    assert answer.headers["Retry-After"] == "1"


def test_an_exhausted_connection_pool_answers_busy(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url, pool_size=1, max_overflow=0, pool_timeout=0.1)
    held = engine.connect()
    try:
        with pytest.raises(PoolTimeout) as timeout:
            engine.connect()
    finally:
        held.close()
        engine.dispose()
    with _app_raising(Settings(db_url=sqlite_url), timeout.value) as http:
        answer = http.get("/raise")
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "database_busy"
    assert "connection" in answer.json()["message"]


@pytest.mark.postgres
def test_a_failing_statement_is_still_a_500(pg_url: str) -> None:
    """Only contention, outages and a database behind this version (a missing table:
    ``test_api_lifecycle_ops``) are 503s: a statement that fails otherwise is the
    service's bug. (On PostgreSQL: SQLite reports most failures as OperationalErrors,
    which the service takes for an unreachable database.)"""
    engine = create_engine(pg_url)
    with pytest.raises(DBAPIError) as failed, engine.connect() as conn:
        conn.execute(text("SELECT 1 / 0"))
    engine.dispose()
    error: Any = failed.value
    assert not database_contended(error)
    with _app_raising(Settings(db_url=pg_url), error) as http:
        answer = http.get("/raise")
    assert answer.status_code == 500 and answer.json()["code"] == "internal"


def test_a_missing_table_on_a_database_at_the_newest_migration_is_the_services_bug(
    db_url: str,
) -> None:
    """A missing table is `database_behind` (503) only on a database behind this version
    (``test_api_lifecycle_ops``); at the newest migration it is a bug of ours: 500."""
    engine = create_engine(db_url)
    with pytest.raises(DBAPIError) as failed, engine.connect() as conn:
        conn.execute(text("SELECT * FROM no_such_table"))
    engine.dispose()
    assert schema_behind(failed.value)
    with _app_raising(Settings(db_url=db_url), failed.value) as http:
        answer = http.get("/raise")
    assert answer.status_code == 500 and answer.json()["code"] == "internal"
