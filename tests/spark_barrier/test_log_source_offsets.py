"""read_log's offsets (no Spark session): the reader's position with one (epoch, seq) per
log service, and offsets written before a log could be several services."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("pyspark")

from spark_barrier.log_source import _position, _reached, _seek

A, B = "http://127.0.0.1:7001", "http://127.0.0.1:7002"


def reader(*addresses: str) -> Any:
    return SimpleNamespace(
        committed_snapshot=None,
        committed_batch=None,
        committed_job=None,
        positions={},
        source="snapshots",
        addresses=list(addresses),
    )


def test_an_offset_keeps_each_services_position_and_seeks_back_to_it() -> None:
    here = reader(A, B)
    here.committed_snapshot, here.committed_batch, here.committed_job = 9, 3, "clicks"
    here.positions = {B: (20, 7), A: (10, 4)}
    offset = _position(here) | {"source": "log"}
    assert offset["logs"] == {A: [10, 4], B: [20, 7]}  # JSON: lists, sorted by address
    again = reader(A, B)
    _seek(again, offset)
    assert again.positions == {A: (10, 4), B: (20, 7)} and again.source == "log"
    assert (again.committed_snapshot, again.committed_batch, again.committed_job) == (
        9,
        3,
        "clicks",
    )
    assert _reached(again, offset)
    again.positions[B] = (20, 8)
    assert not _reached(again, offset)


def test_an_offset_of_one_log_written_before_several_were_possible_still_loads() -> None:
    old = {
        "committed_snapshot": 9,
        "committed_batch": 3,
        "committed_job": "clicks",
        "epoch": 10,
        "seq": 4,
        "source": "log",
    }
    here = reader(A)
    _seek(here, old)
    assert here.positions == {A: (10, 4)}
    assert _reached(here, old)
