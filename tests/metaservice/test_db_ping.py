"""A pooled PostgreSQL connection is pinged before use only after sitting idle
(metaservice.db.PING_AFTER_IDLE_S), not on every checkout (issue 13): a dead idle
connection is still replaced before a transaction uses it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from metaservice.db import Database

pytestmark = pytest.mark.postgres


def _kill(pg_url: str, pid: int) -> None:
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    admin.dispose()


def _pings(db: Database) -> list[str]:
    """The SELECT 1 pings the pool sends (below SQLAlchemy's statement events)."""
    seen: list[str] = []
    dialect = db.engine.dialect
    original = dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        seen.append("ping")
        return original(dbapi_conn)

    dialect.do_ping = counted  # type: ignore[method-assign]
    return seen


def _backend_pid(db: Database) -> int:
    return int(db.read(lambda s: s.execute(text("SELECT pg_backend_pid()")).scalar_one()))


def test_a_connection_in_use_moments_ago_is_not_pinged(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1, max_overflow=0, ping_after_idle_s=60)
    try:
        pings = _pings(db)
        first = _backend_pid(db)
        for _ in range(5):
            assert _backend_pid(db) == first
        assert pings == []
    finally:
        db.dispose()


def test_a_dead_idle_connection_is_replaced_before_use(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1, max_overflow=0, ping_after_idle_s=0.05)
    try:
        pings = _pings(db)
        first = _backend_pid(db)
        _kill(pg_url, first)
        time.sleep(0.1)
        # The pool's one connection is dead: the ping finds it, a new one serves.
        second = _backend_pid(db)
        assert second != first
        assert pings == ["ping"]
    finally:
        db.dispose()


def test_without_the_idle_ping_a_dead_connection_fails_its_request(pg_url: str) -> None:
    """The ping is what saves the request above (the test can fail): the same dead
    connection handed out within the idle window fails, and the next one works."""
    db = Database(pg_url, pool_size=1, max_overflow=0, ping_after_idle_s=60)
    try:
        first = _backend_pid(db)
        _kill(pg_url, first)
        with pytest.raises(OperationalError) as failed:
            _backend_pid(db)
        assert failed.value.connection_invalidated
        assert _backend_pid(db) != first
    finally:
        db.dispose()
