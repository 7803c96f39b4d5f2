"""Fixtures shared by every test: databases (SQLite and PostgreSQL), a manual clock,
and the service in-process.

PostgreSQL tests read the server's URL from METASERVICE_TEST_PG_URL (``.ci/run``
sets it). Each test gets a schema of its own there (one an earlier test of the same
process used, emptied back to head: tests/migrated.py), so tests never see each
other's rows.
Without the variable they are skipped, except under CI=true, where that is an error.
"""

from __future__ import annotations

import gc
import logging
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from metaservice.app import create_app
from metaservice.clock import ManualClock
from metaservice.db import normalise_url
from metaservice.settings import Settings
from tests.cluster import StandaloneCluster
from tests.migrated import drop_free_schemas, migrate_fresh, pg_schema_at_head, with_search_path
from tests.s3 import S3Server

PG_ENV = "METASERVICE_TEST_PG_URL"
# Starlette's TestClient calls the app by the Host name "testserver". The service answers
# only to names it expects (metaservice.http_guard): the tests name theirs, as a deployment
# names its own in allowed_hosts.
os.environ.setdefault("METASERVICE_ALLOWED_HOSTS", '["testserver"]')
START_MS = 1_700_000_000_000  # on the 1 s grid


def pg_base_url() -> str | None:
    url = os.environ.get(PG_ENV)
    if not url:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{PG_ENV} is not set; CI must run the PostgreSQL tests")
        return None
    return normalise_url(url)


def pg_base_url_or_skip() -> str:
    """:func:`pg_base_url`; the test is skipped without one."""
    base = pg_base_url()
    if base is None:
        pytest.skip(f"set {PG_ENV} to run the PostgreSQL tests")
    return base


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Undo what a test's in-process ``metaservice start`` did to logging (dictConfig):
    left in place, its root level of INFO makes py4j log every callback into later
    tests' caplog, and its handler writes to a stderr capture pytest has closed.
    Pytest's own capture handlers, added and removed around each phase, are left alone."""
    saved = {id(lg): _logger_state(lg) for lg in _loggers()}
    yield
    for logger in _loggers():
        level, handlers, propagate, disabled = saved.get(
            id(logger), (logging.NOTSET, [], True, False)
        )
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled
        current = logger.handlers
        logger.handlers[:] = [h for h in current if h in handlers or _is_pytests(h)] + [
            h for h in handlers if h not in current and not _is_pytests(h)
        ]


def _loggers() -> list[logging.Logger]:
    managed = logging.Logger.manager.loggerDict.values()
    return [logging.root, *(lg for lg in managed if isinstance(lg, logging.Logger))]


def _logger_state(logger: logging.Logger) -> tuple[int, list[logging.Handler], bool, bool]:
    return logger.level, list(logger.handlers), logger.propagate, logger.disabled


def _is_pytests(handler: logging.Handler) -> bool:
    return type(handler).__module__.startswith("_pytest")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL schema for one test, dropped afterwards."""
    with pg_schema() as url:
        yield url


@contextmanager
def pg_schema() -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL schema, dropped at the end."""
    base = pg_base_url_or_skip()
    schema = "t_" + uuid.uuid4().hex[:12]
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield with_search_path(base, schema)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path / 'metaservice.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """An empty database of each kind at the migrations' head: the one ``alembic
    upgrade`` makes, copied from one this process migrated, or on PostgreSQL a schema an
    earlier test of this process used, emptied back to head (tests/migrated.py)."""
    if request.param == "sqlite":
        url = request.getfixturevalue("sqlite_url")
        migrate_fresh(url)
        yield url
        return
    base = pg_base_url_or_skip()
    with pg_schema_at_head(base) as url:
        yield url


def pytest_sessionfinish(session: pytest.Session) -> None:
    drop_free_schemas()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run (starting a JVM takes seconds); only
    the tests that ask for it start it."""
    from spark_barrier.spark_session import local_spark_builder

    session = local_spark_builder("metaservice-tests").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    leaked = [q.name for q in session.streams.active]
    if leaked:  # a test left a query running: stop() waits for its batch
        _SLOW_TEARDOWNS.found.append(f"streaming queries still active at the end: {leaked}")
    session.stop()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_MS)


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(db_url=db_url)


@pytest.fixture
def client(settings: Settings, clock: ManualClock) -> Iterator[TestClient]:
    """The service in-process (ASGI), on a manual clock, with its lifespan run."""
    with TestClient(create_app(settings, clock), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Spark standalone cluster on loopback (a master, two workers of 1 core and 1g), one
    for the whole run. Jobs on it run in a driver subprocess: see tests/cluster.py."""
    with StandaloneCluster(base_dir=tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


SPARK_FIXTURES = {"spark", "spark_cluster"}


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collecting imported (the service, pydantic's schemas, SQLAlchemy's tables:
    about 300,000 objects) lives to the end: frozen, the collector's full passes no longer
    walk it. Measured on test_tags and test_api_barriers in one process (2026-12-03, run
    alternately, twice each): garbage collection 14.5 s of 74 CPU-seconds before, 10 s
    after; the total CPU moved within the machine's run-to-run noise."""
    gc.collect()
    gc.freeze()


def pytest_itemcollected(item: pytest.Item) -> None:
    fixtures = set(getattr(item, "fixturenames", ()))
    # Every test that starts Spark is marked spark: `make test` runs `-m spark` (one
    # SparkSession, one cluster) in a pytest process beside `-m "not spark"`.
    if fixtures & SPARK_FIXTURES:
        item.add_marker(pytest.mark.spark)
    # A test on the cluster starts several JVMs: select or skip it with -m slow too.
    if "spark_cluster" in fixtures:
        item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """An S3-compatible server (moto) on loopback with one bucket, for the whole run.
    Tests keep apart by warehouse: ``s3_server.warehouse(name)``, ``s3_server.properties``
    for the pyiceberg properties (see tests/s3.py)."""
    with S3Server(tmp_path_factory.mktemp("s3") / "moto.log") as server:
        yield server


# Fixture teardowns that take long, found by timing the gaps between a test's finalizers:
# pytest counts them in the test's teardown, which names none of them (a session fixture's
# in the last test's). Listed at the end of the run. A plugin rather than hooks of this
# conftest: pytest calls a conftest's fixture hooks only for fixtures of its own folder,
# and session fixtures belong to the root.
class _SlowTeardowns:
    threshold_s = 5.0

    def __init__(self) -> None:
        self.found: list[str] = []
        self._last: float | None = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        self._last = time.monotonic()
        yield
        self._last = None

    def pytest_fixture_post_finalizer(
        self, fixturedef: Any, request: pytest.FixtureRequest
    ) -> None:
        if self._last is None:
            return
        now = time.monotonic()
        if now - self._last >= self.threshold_s:
            self.found.append(
                f"{now - self._last:.1f} s tearing down fixture '{fixturedef.argname}' "
                f"({fixturedef.scope}) after {request.node.nodeid or 'the last test'}"
            )
        self._last = now

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.found:
            terminalreporter.section("slow fixture teardowns")
            for line in self.found:
                terminalreporter.write_line(line)


_SLOW_TEARDOWNS = _SlowTeardowns()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_SLOW_TEARDOWNS, "slow-teardowns")
