"""The log store's spill (no Spark): rows past the memory bound that no snapshot holds yet
go to Arrow files and read back the same; a batch's files, once claimed for its snapshot
summary, outlive the log's retention (the snapshot's expiry deletes them: see
test_expiry.py); unclaimed ones go with their entries; over HTTP, through a real log
service on loopback.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pyarrow as pa
import pytest

from metaservice.logstore import LogClient, LogWriter
from metaservice.logstore.server import LogService
from metaservice.logstore.spill import Spill
from metaservice.logstore.store import LogFull, LogStore, TableLog
from tests.metaservice.log_cli import ctrl_c, log_start

TABLE = "dw.events"
SCHEMA = pa.schema([pa.field("id", pa.int64())])
T0 = 1_700_000_000_000


def rows(*ids: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": list(ids)}, schema=SCHEMA)


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.arrow")} if folder.exists() else set()


def spilling_log(folder: Path, max_bytes: int) -> TableLog:
    log = TableLog(TABLE, max_bytes=max_bytes)
    log.spill = Spill(str(folder))
    return log


def read_ids(log: TableLog, after_seq: int = 0) -> list[int]:
    result = log.read(after_seq=after_seq, epoch=log.epoch)
    return [i for e in result.entries for i in log.rows_of(e).column("id").to_pylist()]


def test_rows_past_the_bound_spill_to_files_and_read_back_the_same(tmp_path: Path) -> None:
    chunk = rows(*range(100))
    log = spilling_log(tmp_path / "log", max_bytes=int(chunk.nbytes) * 2)
    for i in range(5):  # batch 0, in five chunks, none persisted
        log.append(T0, 0, rows(*range(i * 100, i * 100 + 100)))

    status = log.status()
    assert status.bytes <= log.max_bytes and not status.over_bound
    assert (status.entries, status.spilled_entries) == (5, 3)
    assert status.spilled_bytes == 3 * chunk.nbytes
    assert status.spill_folder == str(tmp_path / "log")
    assert len(files_in(tmp_path / "log")) == 3
    assert read_ids(log) == list(range(500)), "the oldest went to files, in order"


def test_a_claimed_batchs_files_outlive_the_log_and_unclaimed_ones_go_with_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "log"
    log = spilling_log(folder, max_bytes=0)  # every unpersisted entry spills
    log.keep_barriers = 1
    log.append(T0, 0, rows(1))
    claimed = log.claim_spilled(0)
    with pytest.raises(LogFull):  # after the claim (a straggler): it would be listed nowhere
        log.append(T0, 0, rows(2))
    log.persisted(T0, 0, snapshot_id=10)
    log.append(T0 + 1000, 1, rows(3))  # spilled, never claimed (its claim failed, say)
    log.persisted(T0 + 1000, 1, snapshot_id=11)
    assert len(claimed) == 1 and Path(claimed[0]).exists()
    assert len(files_in(folder)) == 2

    log.append(T0 + 2000, 2, rows(4))
    log.persisted(T0 + 2000, 2, snapshot_id=12)  # keeps one barrier: batches 0 and 1 go

    assert [e.batch_id for e in log.read(after_batch=1).entries] == [2]
    assert Path(claimed[0]).exists(), "a snapshot summary lists it: its expiry deletes it"
    assert files_in(folder) == {Path(claimed[0]).name, *_names(log)}
    assert log.status().spilled_entries == 1  # batch 2's


def _names(log: TableLog) -> set[str]:
    return {Path(e.spilled.path).name for e in log.read(after_batch=1).entries if e.spilled}


def test_a_reset_deletes_the_dropped_batches_unclaimed_files_only(tmp_path: Path) -> None:
    folder = tmp_path / "log"
    log = spilling_log(folder, max_bytes=0)
    log.reset(after_batch_id=-1)
    log.append(T0, 0, rows(1))
    log.persisted(T0, 0, snapshot_id=10)
    log.append(T0 + 1000, 1, rows(2))
    # Over the bound, persisted rows go before any spill: batch 0 is dropped (its file
    # was never claimed, so it goes too), batch 1 spills.
    assert [e.batch_id for e in log.read(after_batch=0).entries] == [1]
    claimed = log.claim_spilled(1)  # the commit of batch 1 may have landed
    log.append(T0 + 2000, 2, rows(3))  # a batch the writer never committed
    assert len(files_in(folder)) == 2

    log.reset(after_batch_id=0)

    assert len(claimed) == 1 and files_in(folder) == {Path(claimed[0]).name}
    assert log.status().spilled_entries == 0
    # the replayed batch 1 spills again (the claim was undone with the batch)
    log.append(T0 + 1000, 1, rows(2))
    assert log.status().spilled_entries == 1 and len(files_in(folder)) == 2


def test_a_spill_folder_that_cannot_be_written_refuses_the_rows_past_the_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    log = spilling_log(blocker / "log", max_bytes=0)
    with caplog.at_level(logging.WARNING), pytest.raises(LogFull):
        log.append(T0, 0, rows(1))
    status = log.status()
    assert status.over_bound and status.spilled_entries == 0 and status.entries == 0
    assert any("could not spill" in r.getMessage() for r in caplog.records)
    log.persisted(T0, 0, snapshot_id=3)
    with pytest.raises(LogFull):  # still nowhere to put rows past the bound
        log.append(T0 + 1000, 1, rows(2))


def test_the_spill_space_is_bounded_too(tmp_path: Path) -> None:
    log = spilling_log(tmp_path / "log", max_bytes=0)
    one = rows(1).nbytes
    log.max_spill_bytes = 2 * one
    log.append(T0, 0, rows(1))
    log.append(T0, 0, rows(2))
    with pytest.raises(LogFull):
        log.append(T0, 0, rows(3))
    status = log.status()
    assert status.spilled_entries == 0 and status.spilled_bytes == 0  # batch 0 let go
    assert files_in(tmp_path / "log") == set(), "its unclaimed files go with it"


def test_a_log_service_spills_under_its_root_and_serves_spilled_rows(tmp_path: Path) -> None:
    store = LogStore(max_bytes=0, spill_root=str(tmp_path / "spill"))
    with LogService(store) as service, LogWriter(service.url) as writer:
        writer.reset(TABLE, after_batch_id=-1)  # as a writer starting with nothing committed
        writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(1, 2))
        writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(3))
        files = writer.claim_spilled(TABLE, batch_id=0)
        assert writer.claim_spilled(TABLE, batch_id=0) == files, "asking again: same list"
        with LogClient(service.url) as client:
            read = client.read(TABLE, after_batch=-1)
            status = client.status(TABLE)
    assert read.rows is not None and read.rows.column("id").to_pylist() == [1, 2, 3]
    assert len(files) == 2 and all(f.startswith(str(tmp_path / "spill" / TABLE)) for f in files)
    assert all(Path(f).exists() for f in files)
    (table_status,) = status
    assert table_status["spilled_entries"] == 2 and table_status["bytes"] == 0


def test_a_claim_of_a_bad_batch_id_is_422_and_changes_nothing(tmp_path: Path) -> None:
    store = LogStore(max_bytes=0, spill_root=str(tmp_path / "spill"))
    with LogService(store) as service, LogWriter(service.url) as writer:
        writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(1))
        r = httpx.post(f"{service.url}/v1/tables/{TABLE}/spilled", json={"batch_id": -3})
        assert r.status_code == 422 and r.json()["field"] == "batch_id"
        # batch 0 was not claimed: the next append of it still spills
        writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(2))
    assert store.table(TABLE).status().spilled_entries == 2


def test_log_start_spills_to_its_spill_dir_and_refuses_a_bad_property(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from metaservice.cli import app as cli_app

    bad = CliRunner().invoke(cli_app, ["log", "start", "--spill-property", "endpoint"])
    assert bad.exit_code == 2 and "is not KEY=VALUE" in bad.output

    with log_start("--max-bytes", "0", "--spill-dir", str(tmp_path / "spill")) as (started, url):
        with LogWriter(url) as writer:
            writer.append(TABLE, barrier=T0, batch_id=0, rows=rows(1))
            files = writer.claim_spilled(TABLE, batch_id=0)
        err = ctrl_c(started)
    assert started.returncode == 0, err
    assert f"spills to {tmp_path / 'spill'}" in err
    assert files == [str(tmp_path / "spill" / TABLE / Path(files[0]).name)]
    assert Path(files[0]).exists()
