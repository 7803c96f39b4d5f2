"""An S3-compatible server on loopback for the tests: moto's, in a process of its own.

    with S3Server(log_path) as s3:
        catalog = load_catalog({"type": "sql", "uri": ..., "warehouse": s3.warehouse("t1"),
                                **s3.properties})

:class:`S3Server` starts ``python -m moto.server`` on 127.0.0.1 and a free port, waits
until it answers, and creates the bucket. Its :attr:`~S3Server.properties` are the
pyiceberg properties that reach it (endpoint, keys, region, path-style addressing),
the same for the test process, Spark's Python workers and a cluster's executors: all
of them talk to it over TCP, nothing is shared in memory.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from pyarrow import fs

from tests.faults.processes import free_port

BUCKET = "warehouse"
REGION = "us-east-1"
ACCESS_KEY = "testing"  # moto accepts any keys
SECRET_KEY = "testing"


class S3Server:
    """``python -m moto.server`` on loopback with one bucket, stopped on exit."""

    def __init__(self, log_path: Path, bucket: str = BUCKET, start_timeout_s: float = 60.0) -> None:
        self.log_path = log_path
        self.bucket = bucket
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def properties(self) -> dict[str, str]:
        """pyiceberg's S3 properties for this server (merge them into catalog properties)."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
            "s3.force-virtual-addressing": "false",  # path-style: no bucket DNS names
        }

    def warehouse(self, name: str) -> str:
        """A warehouse URI of its own under the bucket, e.g. ``s3://warehouse/t1``."""
        return f"s3://{self.bucket}/{name}"

    def filesystem(self) -> fs.S3FileSystem:
        return fs.S3FileSystem(
            endpoint_override=self.endpoint,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            allow_bucket_creation=True,
        )

    def keys(self, uri: str) -> list[str]:
        """The object keys under ``uri`` (``s3://bucket/prefix``), sorted."""
        selector = fs.FileSelector(uri.removeprefix("s3://"), recursive=True, allow_not_found=True)
        infos = self.filesystem().get_file_info(selector)
        return sorted(i.path for i in infos if i.type == fs.FileType.File)

    def __enter__(self) -> S3Server:
        self.port = free_port()
        log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()  # the child holds its own descriptor
        try:
            self._wait_until_up()
            self.filesystem().create_dir(self.bucket)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _wait_until_up(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"moto.server exited with {self._process.returncode}; see {self.log_path}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto.server did not listen within {self.start_timeout_s} s")

    def _stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None


def closed_port() -> int:
    """A loopback port nothing listens on (for "unreachable" tests)."""
    return free_port()
