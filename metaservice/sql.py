"""``one_of(column, values)``: ``column IN (values)`` that costs the same for 6,000 values
as for 6.

SQLAlchemy sends ``IN`` with one placeholder per value. On PostgreSQL that query text is
new for every list length, too long for psycopg's query cache, and parsed again by
psycopg on every execution: a list of 6,000 job ids cost 32 ms of the service's CPU
per statement, against 3 ms for the same query as ``column = ANY(%(ids)s::INTEGER[])``
with the list sent as one array (measured on 2 vCPUs, 20 runs each). The per-slot
advancer sends several such lists a tick (every derived job), and reads of many
tables send the tables' names and ids. PostgreSQL plans ``= ANY(array)`` as it plans
``IN (...)`` (an ``IN`` list becomes that array); SQLite, which has no arrays, keeps
``IN``.

Use it where a list grows with the topology; a fixed list of a few states can stay
``in_``. A tuple ``IN`` stays ``in_`` (no array of rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import BindParameter, Boolean, ColumnElement, any_, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.visitors import InternalTraversal, _TraverseInternalsType


class OneOf(ColumnElement[bool]):
    """``column`` is one of the values of an expanding bind parameter."""

    inherit_cache = True
    _is_implicitly_boolean = True  # a condition: SQLite gets no "= 1" appended
    type = Boolean()
    # SQLAlchemy declares it an instance attribute; it is its traversal's layout
    _traverse_internals: _TraverseInternalsType = [  # noqa: RUF012
        ("column", InternalTraversal.dp_clauseelement),
        ("values", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, column: ColumnElement[Any], values: BindParameter[Any]) -> None:
        self.column = column
        self.values = values

    @property
    def _from_objects(self) -> list[Any]:  # a WHERE of it puts the column's table in FROM
        return self.column._from_objects


def one_of(column: Any, values: Iterable[Any] | BindParameter[Any]) -> OneOf:
    """``column IN values``: a list given now, or a named bind parameter for a statement
    built once (``bindparam("ids", expanding=True)``, its list given at execution)."""
    element: ColumnElement[Any] = (
        column.__clause_element__() if hasattr(column, "__clause_element__") else column
    )
    if not isinstance(values, BindParameter):
        values = bindparam(None, list(values), expanding=True, type_=element.type)
    return OneOf(element, values)


@compiles(OneOf)
def _in_list(element: OneOf, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column.in_(element.values), **kw)


@compiles(OneOf, "postgresql")
def _any_of_array(element: OneOf, compiler: SQLCompiler, **kw: Any) -> str:
    # A clone keeps the parameter's key: a statement found in SQLAlchemy's compiled
    # cache takes its values from the new statement's parameter of that key (a new
    # parameter would keep the values it was compiled with: test_sql_one_of.py).
    array = element.values._clone()
    array.expanding = False
    array.type = ARRAY(element.column.type)
    return compiler.process(element.column == any_(array), **kw)
