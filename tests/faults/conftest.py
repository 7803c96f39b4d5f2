"""Fixtures for the fault tests: a private PostgreSQL server and MetaService processes.

Everything here is function-scoped and lives in the test's own tmp_path (the
PostgreSQL data folder excepted: it is a temporary folder the ``postgres`` OS user
can write, deleted afterwards). Finalisers stop every process, even when the test
fails half-way, so nothing outlives its test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.processes import PrivatePostgres, ServiceProcess


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A running PostgreSQL server of this test's own (``.url``, ``.restart()``...)."""
    with PrivatePostgres() as pg:
        yield pg


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Starts a real MetaService process: ``make_service(db_url, **options)``.

    Options are ``ServiceProcess``'s (``barrier_interval_ms``, ``extra_args``, ``env``);
    the log goes to ``tmp_path/service-N.log``. Every service made is killed at the end.
    """
    made: list[ServiceProcess] = []

    def make(db_url: str, start: bool = True, **options: Any) -> ServiceProcess:
        workdir = tmp_path / f"service-{len(made) + 1}"
        workdir.mkdir()
        service = ServiceProcess(
            db_url, tmp_path / f"service-{len(made) + 1}.log", workdir=workdir, **options
        )
        made.append(service)
        if start:
            service.start()
        return service

    yield make
    for service in made:
        service.close()


@pytest.fixture
def sqlite_file_url(tmp_path: Path) -> str:
    """A SQLite file database in the test's folder (the service migrates it on start)."""
    return f"sqlite:///{tmp_path / 'metaservice.db'}"
