"""A Spark standalone cluster on loopback for tests: a master and N workers started from the
installed pyspark package (``$SPARK_HOME`` = the package folder, ``bin/spark-class``).

In tests, take the session fixture ``spark_cluster`` (tests/conftest.py): one cluster per
run, started by the first test that asks for it. Outside pytest::

    with StandaloneCluster(workers=2) as cluster:
        subprocess.run(
            [sys.executable, "-m", "my.driver", "--master", cluster.master_url],
            cwd=REPO_ROOT, env=cluster.driver_env(), check=True,
        )

What a job on the cluster needs:

- **A driver process of its own.** The test run already holds a local SparkSession (one
  SparkContext per process, tests/conftest.py), so run the driver as a subprocess
  (``python -m tests.spark_barrier.cluster_smoke_driver`` is the worked example).
- **The master URL:** ``cluster.master_url`` (``spark://127.0.0.1:PORT``). Build the session
  with ``spark_barrier.local_spark_builder(name, master=cluster.master_url)``: it keeps the
  driver on 127.0.0.1 (executors connect back there), the UI off and Python workers on the
  venv's interpreter.
- **The driver's environment:** ``cluster.driver_env()``. It names the venv's Python in
  ``PYSPARK_PYTHON`` (the driver tells executors which interpreter to start), puts the repo
  root on ``PYTHONPATH`` and passes the cluster's app settings in ``PYSPARK_SUBMIT_ARGS``
  (small executors, ``spark.cores.max`` = all worker cores, and a session start that waits
  until every executor has registered, so tasks spread over all workers).
- **Shared storage.** Executors run in other processes, with the worker's work folder as
  their current directory and their own environment: nothing in driver memory, no relative
  path and no environment variable set in the driver reaches them. Files go to an absolute
  path both sides reach (a tmp folder on this machine) or to object storage (an S3 server
  on loopback); pass settings in the job's closure or as ``spark.executorEnv.NAME``.

Logs: ``cluster.log_dir`` holds ``master.log`` and ``worker-N.log``; each executor's
stdout/stderr are under ``cluster.work_dirs[N]/<app-id>/<executor-id>/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tests.faults.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
EXECUTOR_MEMORY = "512m"  # Spark refuses less than 450m; the worker offers 1g.
DAEMON_MEMORY = "256m"  # heap of the master and worker JVMs (default 1g); they only schedule
# The C1 compiler only and one GC thread: JVMs that run tiny jobs start faster and take
# about half the CPU time on this 2-core machine (measured: 25 s instead of 47 s of CPU time
# for the cluster and the smoke job). The driver JVM keeps the defaults.
LEAN_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
LOG_TAIL_CHARS = 3000


def spark_home() -> Path:
    """The installed pyspark package: it carries bin/spark-class and the jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def log_tail(path: Path) -> str:
    if not path.exists():
        return f"== {path}: no log written ==\n"
    text = path.read_text(errors="replace")
    return f"== {path} (last {LOG_TAIL_CHARS} chars) ==\n{text[-LOG_TAIL_CHARS:]}\n"


@dataclass
class Daemon:
    """One master or worker JVM; spark-class execs java, so `process.pid` is the JVM's."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    log_file: IO[bytes]

    def stop(self, grace_s: float) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # Each daemon leads its own process group: this also ends executor JVMs a killed
        # worker left behind (Linux reuses no pid while a group of that id has members).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log_file.close()


class ClusterStartError(RuntimeError):
    pass


class StandaloneCluster:
    """A master and `workers` workers on 127.0.0.1, each worker with `cores_per_worker`
    cores and `memory` for executors. Use as a context manager; `start()`/`stop()` too."""

    def __init__(
        self,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory: str = "1g",
        base_dir: Path | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory = memory
        self.start_timeout_s = start_timeout_s
        self._own_tmp: tempfile.TemporaryDirectory[str] | None = None
        if base_dir is None:  # removed again by stop()
            self._own_tmp = tempfile.TemporaryDirectory(prefix="spark-cluster-")
            base_dir = Path(self._own_tmp.name)
        self.base_dir = base_dir
        self.log_dir = self.base_dir / "logs"
        self.work_dirs = [self.base_dir / "work" / f"worker-{i}" for i in range(workers)]
        self.master_port = 0
        self.webui_port = 0
        self._daemons: list[Daemon] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def status_url(self) -> str:
        return f"http://{HOST}:{self.webui_port}/json/"

    @property
    def worker_pids(self) -> list[int]:
        return [d.process.pid for d in self._daemons if d.name.startswith("worker")]

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the master and the workers; return once the master lists every worker
        ALIVE. On any failure everything started is stopped before the error is raised."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Free now; another process may bind one in between, and then the daemon exits
        # and start() reports its log.
        self.master_port, self.webui_port = free_port(), free_port()
        try:
            self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", HOST, "--port", str(self.master_port)],
                ["--webui-port", str(self.webui_port)],
            )
            for i, work_dir in enumerate(self.work_dirs):
                work_dir.mkdir(parents=True, exist_ok=True)
                self._spawn(
                    f"worker-{i}",
                    "org.apache.spark.deploy.worker.Worker",
                    [self.master_url, "--host", HOST, "--cores", str(self.cores_per_worker)],
                    ["--memory", self.memory, "--work-dir", str(work_dir)],
                    ["--webui-port", str(free_port())],
                )
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise

    def stop(self, grace_s: float = 15.0) -> None:
        """Terminate workers first (they stop their executors), then the master; kill what
        is still running after `grace_s`."""
        while self._daemons:
            self._daemons.pop().stop(grace_s)
        if self._own_tmp is not None:
            self._own_tmp.cleanup()

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, apps), as its web UI serves it."""
        with urllib.request.urlopen(self.status_url, timeout=5) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def daemon_env(self) -> dict[str, str]:
        """The environment of the master and workers; executors inherit a worker's."""
        return {
            **self._shared_env(),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": LEAN_JVM_OPTS,
        }

    def driver_env(self) -> dict[str, str]:
        """The environment for a driver subprocess on this cluster (see the module doc)."""
        submit_args = [
            *("--conf", f"spark.executor.memory={EXECUTOR_MEMORY}"),
            *("--conf", f"spark.executor.cores={self.cores_per_worker}"),
            *("--conf", f"spark.executor.extraJavaOptions={LEAN_JVM_OPTS}"),
            *("--conf", f"spark.cores.max={self.workers * self.cores_per_worker}"),
            # Start the session only when every executor has registered (the ratio counts
            # against spark.cores.max), so a first job already spreads over all workers.
            *("--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0"),
            *("--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=60s"),
            *("--conf", "spark.ui.showConsoleProgress=false"),  # keeps driver logs readable
            "pyspark-shell",  # PySpark requires this last word
        ]
        return {**self._shared_env(), "PYSPARK_SUBMIT_ARGS": shlex.join(submit_args)}

    def _shared_env(self) -> dict[str, str]:
        pythonpath = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": HOST,  # a hostname that does not resolve must not matter
            # Python workers on the venv's interpreter, able to import the repo's modules
            # (tests.*) when a job's functions refer to them.
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(part for part in pythonpath if part),
        }

    def logs(self) -> str:
        """The tail of every daemon's log, for error messages."""
        names = ["master", *(f"worker-{i}" for i in range(self.workers))]
        return "".join(log_tail(self.log_dir / f"{name}.log") for name in names)

    def _spawn(self, name: str, main_class: str, *arg_groups: list[str]) -> None:
        log = self.log_dir / f"{name}.log"
        log_file = log.open("wb")
        args = [arg for group in arg_groups for arg in group]
        command = [str(spark_home() / "bin" / "spark-class"), main_class, *args]
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.daemon_env(),
            cwd=self.base_dir,
            start_new_session=True,
        )
        self._daemons.append(Daemon(name, process, log, log_file))

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        alive = 0
        while time.monotonic() < deadline:
            self._check_daemons_running()
            alive = self._alive_workers()
            if alive >= self.workers:
                return
            time.sleep(0.5)
        raise ClusterStartError(
            f"Spark standalone cluster not up after {self.start_timeout_s:.0f} s: "
            f"{alive} of {self.workers} workers ALIVE at {self.status_url}. Check that Java 17 "
            f"is on PATH and the machine is not overloaded; the logs say more:\n{self.logs()}"
        )

    def _alive_workers(self) -> int:
        try:
            workers = self.status().get("workers", [])
        except (urllib.error.URLError, OSError, ValueError):
            return 0  # the master's web UI is not listening yet
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def _check_daemons_running(self) -> None:
        for daemon in self._daemons:
            code = daemon.process.poll()
            if code is not None:
                raise ClusterStartError(
                    f"Spark {daemon.name} exited with code {code} while the cluster was "
                    f"starting (a port taken, or Java missing?):\n{self.logs()}"
                )
