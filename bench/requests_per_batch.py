"""Requests per batch, counted from spark_barrier's own client code paths (issue 32's
figure: source 1, derived <= 3; before it, 4 and 3 + inputs).

Drives two source jobs and a derived job reading both with the code a Spark driver
runs between Spark's calls, without Spark itself:

- a source batch, at each whole slot (Spark's trigger, the barrier interval): the
  sink's barrier through ``OfflineBarriers.barrier_for`` and ``BatchRequests.ask``
  (carrying the last batch's report, progress and promise), the batch's work, its
  report into the ``OutboxReporter`` and its progress into the ``BarrierListener``;
  the grant's heartbeat thread runs as in a driver;
- a derived trigger: every input's ``BarrierStreamReader.latestOffset`` in turn (as
  Spark calls them), then, once they agree on a new end, ``BatchRequests.ask`` with
  the span Spark planned, the work, the report and the progress.

Every request of those objects goes through one counting transport per job; the
figure is the requests sent in the measured window over the batches whose barrier was
asked in it. ``python -m bench.bench_service --part requests`` runs it alone (on the
service it starts); the fleet runs it beside its simulated drivers.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from metaservice.client import ConflictError, MetaServiceClient
from metaservice.topology.schemas import JobEvent
from spark_barrier.carry import BatchRequests, carry_seconds
from spark_barrier.job import NEXT_BARRIER_WAIT_MS
from spark_barrier.listener import BarrierListener
from spark_barrier.offline import OfflineBarriers
from spark_barrier.report import OutboxReporter
from spark_barrier.source import BarrierStreamReader

PLANNING_S = 0.02  # Spark planning a batch before its sink asks for the barrier
WORK_S = 0.05  # the batch's work between its barrier and its report
POLLING_DELAY_S = 0.01  # spark.sql.streaming.pollingDelay: a trigger with no new batch
GOAL = {"source": 1.0, "derived": 3.0}


class Counting(httpx.BaseTransport):
    """One job's requests by route, those started inside the window."""

    def __init__(self, window: tuple[float, float]) -> None:
        self.inner = httpx.HTTPTransport()
        self.window = window
        self.kinds: Counter[str] = Counter()
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.window[0] <= time.time() < self.window[1]:
            with self._lock:
                self.kinds[f"{request.method} {route(request.url.path)}"] += 1
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def route(path: str) -> str:
    path = re.sub(r"/jobs/[^/]+", "/jobs/{job}", path)
    return re.sub(r"/batches/\d+", "/batches/{id}", path)


class _Driver(threading.Thread):
    def __init__(self, url: str, name: str, window: tuple[float, float], state: Path) -> None:
        super().__init__(name=f"driver:{name}", daemon=True)
        self.url, self.job, self.window, self.state = url, name, window, state
        self.counting = Counting(window)
        self.client = MetaServiceClient(url, transport=self.counting, timeout=30)
        self.batches = 0  # asked for their barrier in the window
        self.errors: list[str] = []
        self.query_id = f"rpb-{name}"

    def in_window(self) -> bool:
        return self.window[0] <= time.time() < self.window[1]

    def run(self) -> None:
        try:
            self.drive()
        except Exception as exc:  # reported, not raised: the figure says it
            self.errors.append(repr(exc))

    def drive(self) -> None:
        raise NotImplementedError

    def figure(self) -> dict[str, Any]:
        sent = sum(self.counting.kinds.values())
        return {
            "batches": self.batches,
            "requests": sent,
            "per_batch": sent / self.batches if self.batches else None,
            "by_route": dict(sorted(self.counting.kinds.items())),
            "errors": self.errors[:5],
        }


class SourceDriver(_Driver):
    def __init__(self, url: str, name: str, table: str, window: Any, state: Path, interval_ms: int):
        super().__init__(url, name, window, state)
        self.table, self.interval_s = table, interval_ms / 1000

    def drive(self) -> None:
        carry_s = carry_seconds(int(self.interval_s * 1000))
        reporter = OutboxReporter(self.client, self.state / "outbox", carry_s=carry_s)
        offline = OfflineBarriers(self.client, self.job, reporter.outbox, self.state)
        offline.report_in()
        listener = BarrierListener(self.client)
        listener.jobs.add(self.job)
        listener.carry(self.job, carry_s)
        requests = BatchRequests(self.client, self.job, reporter, listener, offline)
        offline.ask = lambda batch_id, query_id: requests.ask(batch_id, query_id=query_id)
        last = self.client.get_job(self.job).last_batch_id
        batch = 0 if last is None else last + 1
        try:
            while time.time() < self.window[1]:
                now = time.time()
                time.sleep((now // self.interval_s + 1) * self.interval_s - now)  # the trigger
                time.sleep(PLANNING_S)
                counted = self.in_window()
                barrier = offline.barrier_for(batch, query_id=self.query_id)
                self.batches += counted
                time.sleep(WORK_S)
                reporter.report(_report(self.job, batch, barrier, self.table))
                listener._put(self.job, _progress(self.query_id, batch))
                batch += 1
        finally:
            offline.close(release=True)
            reporter.flush(10)
            reporter.close()
            listener.stop()


class DerivedDriver(_Driver):
    def __init__(
        self, url: str, name: str, table: str, inputs: list[str], window: Any, state: Path
    ):
        super().__init__(url, name, window, state)
        self.table, self.inputs = table, inputs

    def drive(self) -> None:
        reporter = OutboxReporter(self.client, self.state / "outbox")  # reports go at once
        listener = BarrierListener(self.client)
        listener.jobs.add(self.job)
        listener.carry(self.job, carry_seconds(1000))
        requests = BatchRequests(self.client, self.job, None, listener, None)
        readers = []
        for table in self.inputs:
            options = {"url": self.url, "job": self.job, "table": table, "catalog": "{}"}
            options["shared_ends"] = str(self.state / "next-barrier.json")  # as job.source
            reader = BarrierStreamReader({**options, "wait_ms": str(NEXT_BARRIER_WAIT_MS)}, None)  # type: ignore[arg-type]
            reader._client = self.client  # its own in a driver: the same requests
            readers.append(reader)
        job = self.client.get_job(self.job)
        start = {"barrier": job.frontier}
        batch = 0 if job.last_batch_id is None else job.last_batch_id + 1
        try:
            while time.time() < self.window[1]:
                ends = {r.latestOffset(start, None)["barrier"] for r in readers}  # type: ignore[arg-type]
                end = ends.pop() if len(ends) == 1 else None
                if end is None or end <= start["barrier"]:
                    time.sleep(POLLING_DELAY_S)
                    continue
                time.sleep(PLANNING_S)
                counted = self.in_window()
                try:
                    answer = requests.ask(
                        batch, start=start["barrier"], end=end, query_id=self.query_id
                    )
                except ConflictError as exc:
                    if exc.code != "empty_range":
                        raise
                    start, batch = {"barrier": end}, batch + 1
                    continue
                self.batches += counted
                time.sleep(WORK_S)
                reporter.report(_report(self.job, batch, answer.barrier, self.table))
                listener._put(self.job, _progress(self.query_id, batch))
                start, batch = {"barrier": end}, batch + 1
        finally:
            reporter.flush(10)
            reporter.close()
            listener.stop()


def _report(job: str, batch: int, barrier: int, table: str) -> dict[str, Any]:
    snapshot = 10**12 + batch
    return {
        "job": job,
        "batch_id": batch,
        "barrier": barrier,
        "table": table,
        "snapshot_id": snapshot,
    }


def _progress(run_id: str, batch: int) -> JobEvent:
    return JobEvent(event="progress", run_id=run_id, batch_id=batch, num_input_rows=100)


def requests_per_batch(
    url: str, seconds: float = 12.0, warmup_s: float = 3.0, interval_ms: int = 1000
) -> dict[str, Any]:
    """Register two sources and a derived job reading both (fresh names), drive them
    for ``warmup_s`` + ``seconds``, and count their requests per batch."""
    with MetaServiceClient(url, timeout=30) as ms:
        ms.put_job("rpb_src_a", outputs=["rpb.a"])
        ms.put_job("rpb_src_b", outputs=["rpb.b"])
        ms.put_job("rpb_der", inputs=["rpb.a", "rpb.b"], outputs=["rpb.ab"])
    now = time.time()
    # Starts and ends mid-slot, away from the sources' triggers.
    start = (now + warmup_s) // 1 + 0.5
    window = (start, start + seconds)
    with tempfile.TemporaryDirectory(prefix="bench-rpb-") as tmp:
        root = Path(tmp)
        drivers: list[_Driver] = [
            SourceDriver(url, "rpb_src_a", "rpb.a", window, root / "a", interval_ms),
            SourceDriver(url, "rpb_src_b", "rpb.b", window, root / "b", interval_ms),
            DerivedDriver(url, "rpb_der", "rpb.ab", ["rpb.a", "rpb.b"], window, root / "d"),
        ]
        for d in drivers:
            (root / d.job).mkdir()
            d.state = root / d.job
            d.start()
        for d in drivers:
            d.join(timeout=window[1] - time.time() + 60)
    sources = [d.figure() for d in drivers[:2]]
    derived = drivers[2].figure()
    per_source = [s["per_batch"] for s in sources if s["per_batch"] is not None]
    result = {
        "seconds": seconds,
        "source": {
            "per_batch": max(per_source) if per_source else None,
            "jobs": sources,
        },
        "derived": {"inputs": 2, **derived},
        "goal": GOAL,
    }
    for d in drivers:
        d.client.close()
    return result


def print_requests_per_batch(result: dict[str, Any]) -> None:
    for kind in ("source", "derived"):
        figure = result[kind]
        per = figure["per_batch"]
        shown = f"{per:.2f}" if per is not None else "-"
        print(f"    requests per batch, {kind:8} {shown} (goal <= {result['goal'][kind]:g})")
    for s in result["source"]["jobs"][:1]:
        print(f"      source by route:  {s['by_route']}  errors {s['errors']}")
    d = result["derived"]
    print(f"      derived by route: {d['by_route']}  errors {d['errors']}")
