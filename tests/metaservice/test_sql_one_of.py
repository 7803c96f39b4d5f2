"""``metaservice.sql.one_of``: the rows ``IN`` would find, on both databases, whether the
values come with the statement or at execution, and when SQLAlchemy reuses a compiled
statement for new values (its compiled cache)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    create_engine,
    insert,
    select,
)

from metaservice.db import normalise_url
from metaservice.sql import one_of

_META = MetaData()
_ROWS = Table(
    "one_of_rows", _META, Column("id", Integer, primary_key=True), Column("name", String(20))
)
_BY_NAMES = select(_ROWS.c.id).where(one_of(_ROWS.c.name, bindparam("names", expanding=True)))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = create_engine(normalise_url(db_url))
    _META.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(_ROWS), [{"id": i, "name": f"n{i}"} for i in range(10)])
    try:
        yield engine
    finally:
        _META.drop_all(engine)
        engine.dispose()


def _ids(engine: Engine, values: object) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(_ROWS.c.id).where(one_of(_ROWS.c.id, values))).scalars())  # type: ignore[arg-type]


def test_values_given_with_the_statement(engine: Engine) -> None:
    # The same statement shape three times: the second and third come from the cache.
    assert _ids(engine, [1, 2]) == [1, 2]
    assert _ids(engine, [3, 4, 5]) == [3, 4, 5]
    assert _ids(engine, range(8, 20)) == [8, 9]
    assert _ids(engine, []) == []
    assert _ids(engine, {7}) == [7]


def test_values_given_at_execution(engine: Engine) -> None:
    with engine.connect() as conn:
        found = [
            sorted(conn.execute(_BY_NAMES, {"names": names}).scalars())
            for names in (["n1", "n7"], ["n2"], [], ["n9", "x"])
        ]
    assert found == [[1, 7], [2], [], [9]]


def test_one_parameter_on_postgresql_however_many_values(engine: Engine) -> None:
    compiled = str(select(_ROWS.c.id).where(one_of(_ROWS.c.id, range(6000))).compile(engine))
    if engine.dialect.name == "postgresql":
        assert "= ANY (" in compiled and compiled.count("%(") == 1, compiled
    else:
        assert " IN (" in compiled and "= 1" not in compiled, compiled
    assert _ids(engine, range(6000)) == list(range(10))
