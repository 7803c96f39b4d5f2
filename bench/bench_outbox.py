"""Benchmark the local report outbox (spark_barrier.outbox).

Measures, for N realistic commit reports in a temporary directory:

- append throughput with an fsync per record (``fsync="always"``), from one thread and
  from four (group commit shares fsyncs between concurrent appenders);
- append throughput with ``fsync="interval"``;
- how long a backlog of N reports takes to drain through a Deliverer whose ``send`` is
  a no-op, and through one that POSTs each batch with httpx to an in-process
  ``http.server`` on 127.0.0.1 answering 200.

Usage: python bench/bench_outbox.py [--out bench/results/outbox.json] [--records 10000]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from spark_barrier.outbox import Deliverer, Outbox

Report = dict[str, Any]


def make_report(i: int) -> Report:
    """What the barrier sink reports after a commit."""
    barrier = 1_767_225_600_000 + 1000 * i
    return {
        "kind": "commit",
        "job": "dwd_order_detail",
        "batch_id": i,
        "barrier": barrier,
        "table": "dw.order_detail",
        "snapshot_id": 6_917_529_027_641_081_856 + 7919 * i,
        "parent_snapshot_id": 6_917_529_027_641_081_856 + 7919 * (i - 1),
        "rows_added": 1200 + i % 97,
        "committed_at_ms": barrier + 850,
    }


def time_appends(directory: Path, n: int, threads: int = 1, **options: Any) -> float:
    """Records per second appended (including the final fsync of close)."""
    reports = [make_report(i) for i in range(n)]
    with Outbox(directory, **options) as box:
        start = time.perf_counter()
        if threads == 1:
            for r in reports:
                box.append(r)
        else:
            _append_in_threads(box, reports, threads)
        box.sync()
        elapsed = time.perf_counter() - start
        assert box.last_seq == n
    return n / elapsed


def _append_in_threads(box: Outbox, reports: list[Report], threads: int) -> None:
    def work(part: list[Report]) -> None:
        for r in part:
            box.append(r)

    workers = [threading.Thread(target=work, args=(reports[t::threads],)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def time_drain(directory: Path, n: int, send: Callable[[list[Report]], None], batch: int) -> float:
    """Seconds for a Deliverer to deliver and acknowledge a backlog of n reports."""
    with Outbox(directory, fsync="interval") as box:
        for i in range(n):
            box.append(make_report(i))
        box.sync()
        start = time.perf_counter()
        with Deliverer(box, send, batch_size=batch) as deliverer:
            if not deliverer.flush(timeout=300):
                raise RuntimeError(f"backlog not drained: {box.backlog} reports left")
        elapsed = time.perf_counter() - start
        assert box.backlog == 0
    return elapsed


class _Receiver(BaseHTTPRequestHandler):
    received = 0  # reports, summed over requests (the server is only used by one sender)
    # Headers and body go out in separate writes; with Nagle on, each response would
    # wait ~40 ms for the client's delayed ACK and the figure would measure that.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received += len(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would swamp the output


@contextmanager
def local_receiver() -> Iterator[str]:
    """A tiny HTTP server on a free loopback port, answering 200 to every POST."""
    _Receiver.protocol_version = "HTTP/1.1"  # keep-alive, as the real client would get
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run(n: int, batch: int) -> dict[str, Any]:
    results: dict[str, Any] = {
        "records": n,
        "report_bytes": len(json.dumps(make_report(n), separators=(",", ":"))),
        "batch_size": batch,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-outbox-") as tmp:
        root = Path(tmp)
        results["append_fsync_always_per_s"] = time_appends(root / "always", n)
        results["append_fsync_always_4_threads_per_s"] = time_appends(root / "always4", n, 4)
        results["append_fsync_interval_per_s"] = time_appends(
            root / "interval", n, fsync="interval", fsync_interval_s=1.0
        )
        results["drain_noop_s"] = time_drain(root / "noop", n, lambda b: None, batch)
        with local_receiver() as url, httpx.Client(base_url=url, timeout=10) as client:

            def post(b: list[Report]) -> None:
                client.post("/api/v1/reports", json=b).raise_for_status()

            _Receiver.received = 0
            results["drain_http_s"] = time_drain(root / "http", n, post, batch)
            results["http_reports_received"] = _Receiver.received
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/outbox.json"))
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=100)
    args = parser.parse_args()
    results = run(args.records, args.batch_size)
    for key, value in results.items():
        shown = f"{value:,.0f}" if key.endswith("per_s") else value
        shown = f"{value:.3f}" if key.endswith("_s") and not key.endswith("per_s") else shown
        print(f"{key:40} {shown}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
