"""``metaservice log start`` as a real subprocess, for the log store's CLI tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.faults.processes import free_port


@contextmanager
def log_start(*options: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``metaservice log start --port P *options`` on a free port, yielded with its URL
    once it answers; killed on the way out if the test did not stop it (:func:`ctrl_c`)."""
    port = free_port()
    started = subprocess.Popen(
        [sys.executable, "-m", "metaservice.cli", "log", "start", "--port", str(port), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert started.poll() is None and time.monotonic() < deadline, started.communicate()
            time.sleep(0.1)
        yield started, url
    finally:
        if started.poll() is None:
            started.kill()


def ctrl_c(started: subprocess.Popen[str]) -> str:
    """Stop the log service as Ctrl-C does; returns what it printed on stderr."""
    started.send_signal(signal.SIGINT)
    _out, err = started.communicate(timeout=30)
    return err
