"""Faults of the MetaService's own processes, with real processes and no Spark.

A source job and a derived job (threads, see ``workload.py``) run against a real
``metaservice start`` process while its PostgreSQL server restarts, or while the
service itself is SIGKILLed and started again. Afterwards nothing reported is
lost or recorded twice, barriers never go back and consistent versions still
answer, at their barriers, exactly the snapshots the jobs committed.

Each scenario runs twice: with a source job that retries until the service
answers (``retry``: nothing can commit meanwhile), and with one holding an
offline grant (``offline``: it keeps committing with barriers of its own, and its
claims and reports wait in its outbox).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from metaservice.client import MetaServiceClient
from tests.faults.processes import PrivatePostgres, ServiceProcess
from tests.faults.workload import BatchRecord, Workload, check_after_fault

pytestmark = [pytest.mark.faults, pytest.mark.slow]

INTERVAL_MS = 200  # short slots: many barriers in a few seconds
DOWN_S = 2.0
IN_FLIGHT_S = 1.0  # a request in flight when the database went down is answered within
SOURCE_MODES = ["retry", "offline"]
MakeService = Callable[..., ServiceProcess]


def _warm_up(w: Workload) -> None:
    w.register()
    w.start()
    w.wait_for(lambda: len(w.derived_batches) >= 5, 30, "5 derived batches before the fault")
    offline = w.offline_barriers
    if offline is not None:
        w.wait_for(lambda: offline.granted, 10, "the source job's offline grant")


def _progress_after(w: Workload, source_barrier: int) -> None:
    """Both jobs move past where the source was when the fault hit."""
    w.wait_for(
        lambda: (last := w.last_derived()) is not None and last.barrier > source_barrier,
        30,
        f"a derived batch past barrier {source_barrier} after the fault",
    )
    after = len(w.source_batches)
    w.wait_for(lambda: len(w.source_batches) >= after + 10, 30, "10 more source batches")


def _check_outage(w: Workload, source_mode: str, down_from: float, down_to: float) -> None:
    """What the source job did while the service could not record anything: batches
    answered while the database was down, except a request in flight when it went down
    (recorded just before, its answer may arrive after ``down_from`` on a loaded
    machine) answered within IN_FLIGHT_S."""

    def in_outage(b: BatchRecord) -> bool:
        in_flight = b.asked_at < down_from and b.answered_at < down_from + IN_FLIGHT_S
        return down_from < b.answered_at < down_to and not in_flight

    derived = [b for b in w.derived_batches if in_outage(b)]
    assert not derived, f"derived batches got barriers during the outage: {derived}"
    during = [b for b in w.source_batches if in_outage(b)]
    if source_mode == "retry":
        assert not during, f"source batches got barriers while nothing could record them: {during}"
        assert w.unavailable.get("source", 0) > 0
    else:
        assert len(during) >= 3, f"only {len(during)} offline source batches in {DOWN_S} s"


def _assert_no_server_errors(log: str) -> None:
    for sign in ("unhandled error", "Traceback"):
        assert sign not in log, f"the service log has {sign!r}:\n{log[-5000:]}"


@pytest.mark.parametrize("source_mode", SOURCE_MODES)
@pytest.mark.parametrize("stop_mode", ["fast", "immediate"])
def test_postgres_restart_mid_run_loses_nothing_and_barriers_never_go_back(
    private_pg: PrivatePostgres,
    make_service: MakeService,
    tmp_path: Path,
    stop_mode: str,
    source_mode: str,
) -> None:
    service = make_service(private_pg.url, barrier_interval_ms=INTERVAL_MS)
    w = Workload(service.url, tmp_path, offline=source_mode == "offline")
    try:
        _warm_up(w)
        w.set_phase("stopping")
        private_pg.stop(stop_mode)
        stopped_at = time.monotonic()
        source_barrier = w.last_source().barrier  # type: ignore[union-attr]
        w.set_phase("down")
        time.sleep(DOWN_S)
        backlog = w.source_reporter.outbox.backlog
        w.set_phase("starting")
        starting_at = time.monotonic()
        private_pg.start()
        w.set_phase("after")
        _progress_after(w, source_barrier)
        w.stop()

        # While the database was down: 503 database_unavailable, never a 500 ...
        server_errors = [p for p in w.probes if p.status is not None and p.status >= 500]
        assert all(p.status == 503 and p.code == "database_unavailable" for p in server_errors), [
            p for p in server_errors if (p.status, p.code) != (503, "database_unavailable")
        ]
        down = [p for p in w.probes if p.phase == "down"]
        assert len(down) >= 10, down
        assert all((p.status, p.code) == (503, "database_unavailable") for p in down), down
        assert w.unavailable.get("reader", 0) > 0
        _check_outage(w, source_mode, stopped_at, starting_at)
        if source_mode == "offline":
            assert backlog > 0, "the offline source job's claims and reports should wait"
        # ... and afterwards the same service process answers again.
        assert any(p.phase == "after" and p.status == 200 for p in w.probes)
        assert service.alive() and service.starts == 1

        with MetaServiceClient(service.url) as client:
            counts = check_after_fault(w, client)
        assert counts["final consistent barrier"] > source_barrier, counts
        log = service.log()
        _assert_no_server_errors(log)
        assert "database unreachable" in log
        print(f"PostgreSQL {stop_mode} restart, {source_mode}: {counts}, {w.unavailable}")
    finally:
        w.close()


@pytest.mark.parametrize("source_mode", SOURCE_MODES)
def test_service_sigkill_mid_run_then_restart_loses_no_acknowledged_report(
    make_service: MakeService, sqlite_file_url: str, tmp_path: Path, source_mode: str
) -> None:
    service = make_service(sqlite_file_url, barrier_interval_ms=INTERVAL_MS)
    w = Workload(service.url, tmp_path, offline=source_mode == "offline")
    try:
        _warm_up(w)
        w.set_phase("down")
        killed_at = time.monotonic()
        service.kill()
        time.sleep(DOWN_S)
        answered_before = [b for b in w.source_batches if b.answered_at < killed_at]
        source_barrier = max(b.barrier for b in answered_before)
        backlog = w.source_reporter.outbox.backlog
        w.set_phase("starting")
        starting_at = time.monotonic()
        service.restart()
        restarted_at = time.monotonic()
        w.set_phase("after")
        _progress_after(w, source_barrier)
        w.stop()

        _check_outage(w, source_mode, killed_at, starting_at)
        if source_mode == "offline":
            assert backlog > 0, "the offline source job's claims and reports should wait"
        # Barriers asked for after the restart are above every one answered before.
        asked_after = [b for b in w.source_batches if b.asked_at > restarted_at]
        assert asked_after
        assert min(b.barrier for b in asked_after) > source_barrier
        derived_before = [b.barrier for b in w.derived_batches if b.answered_at < killed_at]
        derived_after = [b.barrier for b in w.derived_batches if b.asked_at > restarted_at]
        assert derived_after and min(derived_after) > max(derived_before)

        with MetaServiceClient(service.url) as client:
            counts = check_after_fault(w, client)
        assert counts["final consistent barrier"] > source_barrier, counts
        log = service.log()
        _assert_no_server_errors(log)
        assert log.count("=== start") == 2, log[-3000:]
        assert log.count("MetaService ready on database") == 2, log[-3000:]
        assert log.count("Application startup complete") == 2, log[-3000:]
        print(f"SIGKILL, {source_mode}: {counts}, {w.unavailable}")
    finally:
        w.close()
