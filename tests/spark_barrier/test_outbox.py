"""The local write-ahead-log outbox (G4): format, recovery from damage, acks, delivery."""

from __future__ import annotations

import errno
import logging
import shutil
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spark_barrier.outbox.log as outbox_mod  # where the log writes and syncs
from spark_barrier.outbox import (
    HEADER_BYTES,
    Deliverer,
    Outbox,
    OutboxFullError,
    OutboxLockedError,
    decode_frame_header,
    encode_frame,
)

LOGGER = "spark_barrier.outbox"


def report(i: int, pad: int = 0) -> dict[str, Any]:
    return {
        "job": "orders_to_dwd",
        "batch_id": i,
        "barrier": 1_700_000_000_000 + 1000 * i,
        "table": "dw.order_detail",
        "snapshot_id": 4_000_000_000_000_000_000 + i,
        "pad": "é" * pad,  # non-ASCII: payloads are UTF-8
    }


def seqs(box: Outbox) -> list[int]:
    return [e.seq for e in box.pending()]


def wal_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.wal"))


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


# --------------------------------------------------------------------------- format


def test_frame_layout_is_the_documented_one() -> None:
    payload = b'{"a":1}'
    frame = encode_frame(7, payload)
    assert len(frame) == HEADER_BYTES + len(payload)
    length, crc, seq = decode_frame_header(frame[:HEADER_BYTES])
    assert (length, seq) == (len(payload), 7)
    assert frame[:4] == len(payload).to_bytes(4, "little")
    assert frame[8:16] == (7).to_bytes(8, "little")
    assert frame[HEADER_BYTES:] == payload
    # The CRC covers length, sequence number and payload.
    assert crc == zlib.crc32(frame[:4] + frame[8:16] + payload)


def test_append_reopen_reads_back_in_order(tmp_path: Path) -> None:
    with Outbox(tmp_path, segment_bytes=512) as box:
        assigned = [box.append(report(i, pad=i % 7)) for i in range(60)]
        assert assigned == list(range(1, 61))
        assert [e.record for e in box.pending()] == [report(i, pad=i % 7) for i in range(60)]
        assert len(box.segments) > 3
    names = wal_files(tmp_path)
    assert names[0] == "00000000000000000001.wal"
    with Outbox(tmp_path, segment_bytes=512) as box:
        assert [e.record for e in box.pending()] == [report(i, pad=i % 7) for i in range(60)]
        assert seqs(box) == assigned
        assert box.append(report(60)) == 61
        assert box.backlog == 61


def test_segments_are_named_by_first_seq_and_rotated_at_the_size(tmp_path: Path) -> None:
    with Outbox(tmp_path, segment_bytes=400) as box:
        for i in range(40):
            box.append(report(i))
        big = box.append(report(99, pad=300))  # bigger than a segment: gets its own
    files = sorted(tmp_path.glob("*.wal"))
    firsts = [int(p.stem) for p in files]
    with Outbox(tmp_path, segment_bytes=400) as box:
        entries = list(box.pending())
    assert firsts[0] == 1 and big in firsts
    assert all(p.stat().st_size <= 400 for p in files if int(p.stem) != big)
    # Each segment's name is the sequence number of its first record.
    starts = {e.seq for e in entries if e.seq in firsts}
    assert starts == set(firsts)


def test_read_batch_pages_through_in_order(tmp_path: Path) -> None:
    with Outbox(tmp_path, segment_bytes=300) as box:
        for i in range(50):
            box.append(report(i))
        got: list[int] = []
        after = 0
        while batch := box.read_batch(after, 7):
            assert len(batch) <= 7
            got += [e.seq for e in batch]
            after = batch[-1].seq
        assert got == list(range(1, 51))
        assert [e.seq for e in box.read_batch(20, 3)] == [21, 22, 23]  # random access too


# --------------------------------------------------------------------------- acks


def test_ack_deletes_only_fully_acked_segments(tmp_path: Path) -> None:
    with Outbox(tmp_path, segment_bytes=700) as box:
        for i in range(30):
            box.append(report(i))
        firsts = sorted(int(p.stem) for p in tmp_path.glob("*.wal"))
        assert len(firsts) >= 3 and firsts[2] - firsts[1] >= 3
        inside_second = firsts[1] + 1  # second segment only partly acknowledged
        box.ack(inside_second)
        assert sorted(int(p.stem) for p in tmp_path.glob("*.wal")) == firsts[1:]
        assert seqs(box) == list(range(inside_second + 1, 31))
        box.ack(firsts[2] - 1)  # exactly the end of the second segment
        assert sorted(int(p.stem) for p in tmp_path.glob("*.wal")) == firsts[2:]
        box.ack(3)  # going backwards is a no-op
        assert box.acked_seq == firsts[2] - 1


def test_acked_position_survives_reopen(tmp_path: Path) -> None:
    with Outbox(tmp_path, segment_bytes=400) as box:
        for i in range(20):
            box.append(report(i))
        box.ack(12)
    with Outbox(tmp_path, segment_bytes=400) as box:
        assert box.acked_seq == 12
        assert seqs(box) == list(range(13, 21))
        box.ack(20)
        assert wal_files(tmp_path) == []  # a drained outbox holds no segment
        assert box.size_bytes == 0
    with Outbox(tmp_path, segment_bytes=400) as box:
        # Numbers continue past the acked position: a reused one would count as delivered.
        assert box.backlog == 0 and list(box.pending()) == []
        assert box.append(report(20)) == 21
        assert seqs(box) == [21]


def test_ack_beyond_the_log_is_refused(tmp_path: Path) -> None:
    with Outbox(tmp_path) as box:
        box.append(report(0))
        with pytest.raises(ValueError, match="last appended record is 1"):
            box.ack(2)


def test_damaged_acked_file_falls_back_to_redelivery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Outbox(tmp_path, segment_bytes=400) as box:
        for i in range(20):
            box.append(report(i))
        box.ack(15)
        first_kept = min(int(p.stem) for p in tmp_path.glob("*.wal"))
    (tmp_path / "ACKED").write_text('{"acked": 95, "crc": 1}\n')  # a bit-rotted number
    with caplog.at_level(logging.WARNING, LOGGER), Outbox(tmp_path, segment_bytes=400) as box:
        # Never skip unacknowledged reports: resend from the oldest segment instead.
        assert box.acked_seq == first_kept - 1
        assert seqs(box) == list(range(first_kept, 21))
    assert "ACKED" in caplog.text


# --------------------------------------------------------------------------- damage


@dataclass(frozen=True)
class Pristine:
    directory: Path
    files: dict[str, bytes]  # segment file name -> bytes
    bounds: dict[str, list[tuple[int, int]]]  # name -> [(seq, end offset of its frame)]
    records: dict[int, dict[str, Any]]
    acked: int


def _frame_bounds(data: bytes, first: int) -> list[tuple[int, int]]:
    out, offset, seq = [], 0, first
    while offset < len(data):
        length, _, _ = decode_frame_header(data[offset : offset + HEADER_BYTES])
        offset += HEADER_BYTES + length
        out.append((seq, offset))
        seq += 1
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    directory = tmp_path_factory.mktemp("pristine")
    records = {}
    with Outbox(directory, segment_bytes=420) as box:
        for i in range(16):
            records[box.append(report(i, pad=i % 5))] = report(i, pad=i % 5)
        box.ack(3)  # a partly acknowledged first segment is part of the picture
    files = {p.name: p.read_bytes() for p in sorted(directory.glob("*.wal"))}
    assert len(files) >= 4
    bounds = {name: _frame_bounds(data, int(name[:-4])) for name, data in files.items()}
    return Pristine(directory, files, bounds, records, acked=3)


def _first_difference(a: bytes, b: bytes) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _expected_survivors(p: Pristine, damaged: dict[str, bytes]) -> list[int]:
    """Every record before the first changed byte (in log order) survives, nothing after."""
    kept: list[int] = []
    for name in sorted(p.files):
        cut = _first_difference(p.files[name], damaged[name])
        kept += [seq for seq, end in p.bounds[name] if cut is None or end <= cut]
        if cut is not None:
            break
    return [s for s in kept if s > p.acked]


@dataclass(frozen=True)
class Damage:
    kind: str  # truncate | flip | zero | zero_extend
    segment: int
    position: float  # fraction of the segment's length
    size: int
    bit: int

    def apply(self, data: bytes) -> bytes:
        at = min(int(self.position * len(data)), max(len(data) - 1, 0))
        if self.kind == "truncate":
            return data[: int(self.position * (len(data) + 1))]
        if not data:
            return data
        if self.kind == "flip":
            return data[:at] + bytes([data[at] ^ (1 << self.bit)]) + data[at + 1 :]
        if self.kind == "zero":
            return data[:at] + b"\0" * len(data[at : at + self.size]) + data[at + self.size :]
        return data + b"\0" * self.size  # zero_extend: e.g. ext4 after a crash


damages = st.builds(
    Damage,
    kind=st.sampled_from(["truncate", "flip", "zero", "zero_extend"]),
    segment=st.integers(0, 10),
    position=st.floats(0, 1),
    size=st.integers(1, 200),
    bit=st.integers(0, 7),
)


def _check_recovery(p: Pristine, damage_list: list[Damage]) -> None:
    names = sorted(p.files)
    damaged = dict(p.files)
    for d in damage_list:
        name = names[d.segment % len(names)]
        damaged[name] = d.apply(damaged[name])
    expected = _expected_survivors(p, damaged)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        shutil.copy(p.directory / "ACKED", directory / "ACKED")
        for name, data in damaged.items():
            (directory / name).write_bytes(data)
        with Outbox(directory, segment_bytes=420) as box:  # must not raise
            assert seqs(box) == expected
            assert all(e.record == p.records[e.seq] for e in box.pending())
            floor = max([p.acked, *expected])
            new = [box.append(report(100 + i)) for i in range(3)]
            assert floor < new[0] < new[1] < new[2]
        with Outbox(directory, segment_bytes=420) as box:  # the result is itself clean
            assert seqs(box) == [*expected, *new]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damage=damages)
def test_any_single_damage_keeps_exactly_the_intact_prefix(
    pristine: Pristine, damage: Damage
) -> None:
    _check_recovery(pristine, [damage])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damage_list=st.lists(damages, min_size=2, max_size=3))
def test_several_damages_keep_the_prefix_before_the_first(
    pristine: Pristine, damage_list: list[Damage]
) -> None:
    _check_recovery(pristine, damage_list)


def test_torn_tail_is_cut_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Outbox(tmp_path) as box:
        for i in range(5):
            box.append(report(i))
    (segment,) = tmp_path.glob("*.wal")
    data = segment.read_bytes()
    segment.write_bytes(data[:-3])  # the crash tore the last record
    with caplog.at_level(logging.WARNING, LOGGER), Outbox(tmp_path) as box:
        assert seqs(box) == [1, 2, 3, 4]
        assert box.append(report(9)) == 5
    assert "torn record" in caplog.text


def test_zero_filled_middle_sets_later_segments_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Outbox(tmp_path, segment_bytes=400) as box:
        for i in range(20):
            box.append(report(i))
    files = sorted(tmp_path.glob("*.wal"))
    second = files[1]
    data = bytearray(second.read_bytes())
    data[0:40] = bytes(40)
    second.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, LOGGER), Outbox(tmp_path, segment_bytes=400) as box:
        assert seqs(box) == list(range(1, int(second.stem)))
        assert sorted(p.name for p in tmp_path.glob("*.damaged")) == [
            p.name + ".damaged" for p in files[2:]
        ]
        assert box.append(report(50)) == int(second.stem)
    assert "zero" in caplog.text and "set aside" in caplog.text


def test_intact_records_with_the_wrong_sequence_numbers_are_cut(tmp_path: Path) -> None:
    with Outbox(tmp_path, segment_bytes=400) as box:
        for i in range(12):
            box.append(report(i))
    files = sorted(tmp_path.glob("*.wal"))
    files[2].write_bytes(files[1].read_bytes())  # CRCs fine, but stale content
    with Outbox(tmp_path, segment_bytes=400) as box:
        assert seqs(box) == list(range(1, int(files[2].stem)))


def test_garbage_files_do_not_prevent_opening(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000001.wal").write_bytes(b"\xff" * 10)
    (tmp_path / "00000000000000000009.wal").write_bytes(b"")
    (tmp_path / "ACKED").write_bytes(b"\x00\x01")
    (tmp_path / "notes.txt").write_text("not a segment")
    with Outbox(tmp_path) as box:
        assert list(box.pending()) == []
        assert box.append(report(0)) == 1


# --------------------------------------------------------------------------- bounds and errors


def test_size_bound_raises_a_helpful_error_and_writes_nothing(tmp_path: Path) -> None:
    with Outbox(tmp_path, segment_bytes=1000, max_bytes=2000) as box:
        with pytest.raises(OutboxFullError) as info:
            for i in range(1000):
                box.append(report(i))
        last, size = box.last_seq, box.size_bytes
        files = {p.name: p.read_bytes() for p in tmp_path.glob("*.wal")}
        message = str(info.value)
        assert str(tmp_path) in message
        assert "max_bytes" in message and "2.0 KiB" in message
        assert f"{last} reports" in message
        assert "MetaService" in message and "raise max_bytes" in message
        assert size <= 2000
        with pytest.raises(OutboxFullError):
            box.append(report(0))
        assert box.last_seq == last and box.size_bytes == size
        assert {p.name: p.read_bytes() for p in tmp_path.glob("*.wal")} == files
        box.ack(last)  # the MetaService came back
        assert box.append(report(0)) == last + 1


def test_a_report_that_is_not_json_is_refused_before_writing(tmp_path: Path) -> None:
    with Outbox(tmp_path) as box:
        box.append(report(0))
        with pytest.raises(TypeError):
            box.append({"snapshot": object()})
        with pytest.raises(ValueError):
            box.append({"barrier": float("nan")})
        with pytest.raises(TypeError):
            box.append(["not", "a", "dict"])  # type: ignore[arg-type]
        assert box.append(report(1)) == 2
        assert seqs(box) == [1, 2]


def test_a_failed_write_leaves_no_torn_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = outbox_mod._write_all

    def half_then_enospc(fd: int, data: bytes) -> None:
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    with Outbox(tmp_path) as box:
        box.append(report(0))
        monkeypatch.setattr(outbox_mod, "_write_all", half_then_enospc)
        with pytest.raises(OSError, match="No space"):
            box.append(report(1))
        monkeypatch.setattr(outbox_mod, "_write_all", real)
        assert box.append(report(2)) == 2
    with Outbox(tmp_path) as box:
        assert [e.record for e in box.pending()] == [report(0), report(2)]


def test_one_writer_per_directory(tmp_path: Path) -> None:
    with Outbox(tmp_path), pytest.raises(OutboxLockedError, match="already open"):
        Outbox(tmp_path)
    Outbox(tmp_path).close()  # released on close


def test_concurrent_appends_get_unique_ordered_sequence_numbers(tmp_path: Path) -> None:
    per_thread, threads = 150, 6
    results: dict[int, list[int]] = {}
    with Outbox(tmp_path, segment_bytes=2000) as box:

        def work(t: int) -> None:
            results[t] = [box.append({"thread": t, "i": i}) for i in range(per_thread)]

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert box.durable_seq == box.last_seq == per_thread * threads
    all_seqs = sorted(s for r in results.values() for s in r)
    assert all_seqs == list(range(1, per_thread * threads + 1))
    assert all(r == sorted(r) for r in results.values())
    with Outbox(tmp_path) as box:
        entries = list(box.pending())
    for t in range(threads):
        mine = [e for e in entries if e.record["thread"] == t]
        assert [e.record["i"] for e in mine] == list(range(per_thread))
        assert [e.seq for e in mine] == results[t]


# --------------------------------------------------------------------------- fsync modes


def counting(synced: list[int]) -> Callable[[int], None]:
    real = outbox_mod._datasync

    def datasync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    return datasync


def test_always_mode_fsyncs_before_append_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    with Outbox(tmp_path) as box:
        monkeypatch.setattr(outbox_mod, "_datasync", counting(synced))
        for i in range(5):
            seq = box.append(report(i))
            assert box.durable_seq == seq
        assert len(synced) == 5


def test_interval_mode_syncs_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(outbox_mod, "_datasync", counting(synced))
    with Outbox(tmp_path, fsync="interval", fsync_interval_s=0.05) as box:
        start = len(synced)
        for i in range(200):
            box.append(report(i))
        assert len(synced) - start < 20  # appends did not each wait for an fsync
        assert seqs(box) == list(range(1, 201))  # readable before they are durable
        assert wait_until(lambda: box.durable_seq == 200)
        box.append(report(200))
    with Outbox(tmp_path, fsync="interval") as box:  # close syncs the rest
        assert seqs(box) == list(range(1, 202))


def test_invalid_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        Outbox(tmp_path, fsync="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Outbox(tmp_path, segment_bytes=0)
    Outbox(tmp_path).close()  # a refused open leaves the directory usable


# --------------------------------------------------------------------------- delivery


class FlakySend:
    """Fails the first ``failures`` calls, then records every batch it is given."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.batches: list[list[dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: list[dict[str, Any]]) -> None:
        with self.lock:
            self.calls += 1
            if self.calls <= self.failures:
                raise ConnectionError("MetaService unreachable")
            self.batches.append(list(batch))

    @property
    def delivered(self) -> list[dict[str, Any]]:
        return [r for b in self.batches for r in b]


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Outbox]:
    with Outbox(tmp_path, segment_bytes=1000) as b:
        yield b


def fast_deliverer(
    box: Outbox, send: Callable[[list[dict[str, Any]]], None], **kw: Any
) -> Deliverer:
    kw = {"batch_size": 7, "initial_backoff_s": 0.001, "max_backoff_s": 0.01, **kw}
    return Deliverer(box, send, **kw)


def test_deliverer_retries_then_delivers_everything_in_order(box: Outbox) -> None:
    send = FlakySend(failures=6)
    expected = [report(i) for i in range(60)]
    for r in expected[:30]:
        box.append(r)
    with fast_deliverer(box, send) as deliverer:
        for r in expected[30:]:  # appended while delivery is failing or running
            box.append(r)
        assert deliverer.flush(timeout=10)
    assert send.delivered == expected  # exactly once here: every ack was recorded
    assert all(1 <= len(b) <= 7 for b in send.batches)
    assert box.acked_seq == 60 and box.backlog == 0 and list(box.pending()) == []


def test_deliverer_logs_the_start_and_end_of_an_outage_once(
    box: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    send = FlakySend(failures=25)
    for i in range(10):
        box.append(report(i))
    with caplog.at_level(logging.DEBUG, LOGGER), fast_deliverer(box, send) as deliverer:
        assert deliverer.flush(timeout=10)
    ours = [r for r in caplog.records if r.name.startswith(LOGGER)]
    warnings = [r for r in ours if r.levelno == logging.WARNING]
    infos = [r for r in ours if r.levelno == logging.INFO]
    assert len(warnings) == 1 and len(infos) == 1
    assert "10 reports waiting" in warnings[0].getMessage()
    assert "ConnectionError" in warnings[0].getMessage()
    assert "recovered after 25 failed attempts" in infos[0].getMessage()


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap(box: Outbox) -> None:
    d = Deliverer(box, lambda batch: None, initial_backoff_s=0.2, max_backoff_s=30, jitter=0.5)
    for attempt, full in [(1, 0.2), (2, 0.4), (5, 3.2), (9, 30.0), (500, 30.0)]:
        delays = [d._backoff(attempt) for _ in range(200)]
        assert all(full * 0.5 <= x <= full for x in delays)
        assert max(delays) - min(delays) > 0  # jittered


def test_flush_times_out_while_the_service_is_down_and_close_is_prompt(box: Outbox) -> None:
    send = FlakySend(failures=10**9)
    box.append(report(0))
    deliverer = fast_deliverer(box, send, initial_backoff_s=0.05, max_backoff_s=5).start()
    started = time.monotonic()
    assert deliverer.flush(timeout=0.3) is False
    deliverer.close()
    assert time.monotonic() - started < 3
    assert box.backlog == 1 and send.calls >= 2


def test_unrecorded_ack_means_only_that_batch_is_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Duplicates happen only for batches whose ack was not recorded (receiver is idempotent)."""
    send = FlakySend(failures=0)
    with Outbox(tmp_path) as box:
        for i in range(20):
            box.append(report(i))
        deliverer = fast_deliverer(box, send, batch_size=5).start()
        assert deliverer.flush(timeout=10)
        deliverer.close()
        for i in range(20, 30):
            box.append(report(i))

        def disk_error(directory: Path, seq: int) -> None:
            raise OSError(errno.EIO, "I/O error")

        monkeypatch.setattr(outbox_mod, "_write_acked", disk_error)
        deliverer = fast_deliverer(box, send, batch_size=5).start()
        assert wait_until(lambda: len(send.delivered) == 30)
        deliverer.close()  # the "crash": these acks were never recorded
        assert box.acked_seq == 20
    monkeypatch.undo()
    with Outbox(tmp_path) as box, fast_deliverer(box, send, batch_size=5) as deliverer:
        assert deliverer.flush(timeout=10)
    expected = [report(i) for i in range(30)]
    assert send.delivered == expected + expected[20:]  # the unacked tail, once more, in order


def test_deliverer_with_concurrent_producers(box: Outbox) -> None:
    send = FlakySend(failures=3)
    with fast_deliverer(box, send, batch_size=16) as deliverer:

        def produce(t: int) -> None:
            for i in range(100):
                box.append({"thread": t, "i": i})

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert deliverer.flush(timeout=10)
    assert len(send.delivered) == 400
    for t in range(4):
        assert [r["i"] for r in send.delivered if r["thread"] == t] == list(range(100))
