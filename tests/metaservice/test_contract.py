"""The stamp format and the barrier grid shared by the service and the Spark side."""

from __future__ import annotations

import pytest

from metaservice.contract import (
    SUMMARY_BARRIER,
    SUMMARY_BATCH,
    SUMMARY_JOB,
    SUMMARY_QUERY,
    Stamp,
    encode_stamp,
    on_grid,
    parse_stamp,
    slot_of,
)


def test_stamp_round_trips_with_and_without_a_query() -> None:
    assert parse_stamp(encode_stamp(2000, "enrich", 7)) == Stamp(2000, "enrich", 7, None)
    assert parse_stamp(encode_stamp(2000, "enrich", 7, "q-1")) == Stamp(2000, "enrich", 7, "q-1")


def test_stamp_is_written_under_the_documented_summary_keys() -> None:
    # Tables written by older versions carry these exact keys: they must never change.
    assert encode_stamp(2000, "enrich", 7, "q-1") == {
        "metaservice.barrier": "2000",
        "metaservice.job": "enrich",
        "metaservice.batch": "7",
        "metaservice.query": "q-1",
    }
    assert tuple(encode_stamp(0, "j", 0, "q")) == (
        SUMMARY_BARRIER,
        SUMMARY_JOB,
        SUMMARY_BATCH,
        SUMMARY_QUERY,
    )


@pytest.mark.parametrize(
    "summary",
    [
        None,
        {},
        {"operation": "append"},
        {SUMMARY_BARRIER: "2000", SUMMARY_JOB: "enrich"},  # no batch
        {SUMMARY_JOB: "enrich", SUMMARY_BATCH: "1"},  # no barrier
    ],
)
def test_a_snapshot_without_the_whole_stamp_is_not_stamped(summary: dict[str, str] | None) -> None:
    assert parse_stamp(summary) is None


def test_a_malformed_stamp_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"metaservice\.batch='seven' is not an integer"):
        parse_stamp({SUMMARY_BARRIER: "2000", SUMMARY_JOB: "enrich", SUMMARY_BATCH: "seven"})


def test_stamp_parses_a_pyiceberg_snapshot_summary() -> None:
    snapshots = pytest.importorskip("pyiceberg.table.snapshots")
    summary = snapshots.Summary(snapshots.Operation.APPEND, **encode_stamp(3000, "load", 2))
    assert parse_stamp(summary) == Stamp(3000, "load", 2)


def test_slot_of_and_on_grid() -> None:
    assert slot_of(1_700_000_002_999, 1000) == 1_700_000_002_000
    assert slot_of(1_700_000_002_000, 1000) == 1_700_000_002_000
    assert slot_of(5_999, 2000) == 4_000
    assert on_grid(4_000, 2000) and not on_grid(5_000, 2000)


def test_log_files_round_trip_through_a_snapshot_summary() -> None:
    from metaservice.contract import SUMMARY_LOG_FILES, encode_log_files, parse_log_files

    paths = ["s3://wh/db/t/log/1-7-3.arrow", "/wh/db/t/log/1-7-4.arrow"]
    assert encode_log_files(paths) == {SUMMARY_LOG_FILES: ",".join(paths)}
    assert parse_log_files({"operation": "append", **encode_log_files(paths)}) == paths
    assert encode_log_files([]) == {} and parse_log_files({}) == [] and parse_log_files(None) == []
