"""What the log store's tests share: a batch's barrier, the ids in a table, and a
reader polled a few times."""

from __future__ import annotations

import pyarrow as pa

from metaservice.logstore import LogReader
from tests.metaservice.helpers import T0


def barrier_of(batch_id: int) -> int:
    return T0 + batch_id * 1000  # one batch per barrier unless a test says otherwise


def ids_of(table: pa.Table | None) -> list[int]:
    return [] if table is None else table.column("id").to_pylist()


def drain(reader: LogReader, polls: int = 6) -> tuple[list[int], list[str]]:
    """Poll a few times; the ids delivered and the source of each poll that gave rows."""
    got: list[int] = []
    sources = []
    for _ in range(polls):
        new = reader.poll()
        if new is not None:
            got += ids_of(new)
            sources.append(reader.source)
    return got, sources
