"""Real processes for the fault tests: a private PostgreSQL server and the MetaService.

Both are started, stopped, killed and restarted for real, so a test can take the
database away from a running service or SIGKILL the service mid-run::

    with PrivatePostgres() as pg, ServiceProcess(pg.url, log_path) as service:
        pg.restart()        # the service keeps running and must answer 503, not 500
        service.kill()      # SIGKILL, no shutdown hooks
        service.restart()   # the same port, the same database

Neither ever outlives its ``with`` block (or the interpreter, see ``_live``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Self

import httpx
import pytest

# Everything started and not yet stopped: stopped at interpreter exit if a test (or a
# fixture finaliser) could not, so that no server outlives the run.
_live: set[Any] = set()


@atexit.register
def _stop_leftovers() -> None:
    for process in list(_live):
        with contextlib.suppress(Exception):
            process.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def missing(reason: str) -> NoReturn:
    """A prerequisite is missing: an error under CI=true, a skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


# -- PostgreSQL ---------------------------------------------------------------------------


def postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` with initdb and pg_ctl, or the PATH's."""
    found = []
    for candidate in Path("/usr/lib/postgresql").glob("*/bin"):
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            with contextlib.suppress(ValueError):
                found.append((int(candidate.parent.name), candidate))
    if found:
        return max(found)[1]
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    return None


class _Managed:
    """A child process as a context manager: started on entry (cleaned up if the start
    fails), closed on exit."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class PrivatePostgres(_Managed):
    """A PostgreSQL server of one test's own: restarting it disturbs nothing else.

    The data folder is a fresh temporary folder (deleted by ``close``); the server
    listens on 127.0.0.1 only, on a free port kept across restarts, with its unix
    socket in that folder, trust authentication and fsync off. initdb refuses to
    run as root, so as root the binaries run as the ``postgres`` OS user.
    """

    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir or postgres_bin_dir()
        if self.bin_dir is None:
            missing("PostgreSQL server binaries (initdb, pg_ctl) not found")
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                missing("running as root, and runuser is missing to run initdb as 'postgres'")
            try:
                import pwd

                account = pwd.getpwnam("postgres")
            except KeyError:
                missing("running as root, and there is no 'postgres' OS user to run initdb as")
            self._as_user = [str(runuser), "-u", "postgres", "--"]
            self._uid, self._gid = account.pw_uid, account.pw_gid
        self.port = free_port()
        self.root: Path | None = None
        self.running = False

    # -- paths and commands

    @property
    def data(self) -> Path:
        assert self.root is not None, "the server was never initialised"
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        assert self.root is not None, "the server was never initialised"
        return self.root / "server.log"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the server's ``postgres`` database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 60) -> str:
        command = [*self._as_user, str(self.bin_dir / tool), *args]  # type: ignore[operator]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{tool} took over {timeout} s: {command}") from exc
        if done.returncode != 0:
            server_log = tail(self.log_path) if self.root else ""
            raise RuntimeError(
                f"{' '.join(command)} failed with {done.returncode}:\n{done.stdout}{done.stderr}"
                f"\n--- server log ---\n{server_log}"
            )
        return done.stdout

    def _init(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="faults-pg-"))
        if self._as_user:
            os.chown(self.root, self._uid, self._gid)
        _live.add(self)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            # Safe while the machine stays up: written data survives a server crash
            # (``stop("immediate")``) in the OS cache. synchronous_commit stays on: off,
            # a crash loses transactions the service already reported as committed.
            "fsync": "off",
            "max_connections": "100",
            "log_min_messages": "warning",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# tests/faults/processes.py\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    # -- life cycle

    def start(self, timeout: float = 60) -> None:
        if self.root is None:
            self._init()
        self._run(
            "pg_ctl",
            "start",
            "-D",
            str(self.data),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            str(int(timeout)),
            timeout=timeout + 10,
        )
        self.running = True
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30) -> None:
        """Until a TCP connection is accepted (pg_ctl -w checks the unix socket)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL on port {self.port} does not accept connections after "
                        f"{timeout} s\n--- server log ---\n{tail(self.log_path)}"
                    ) from None
                time.sleep(0.05)

    def stop(self, mode: str = "fast", timeout: float = 60) -> None:
        """``fast``: disconnect clients and shut down cleanly; ``immediate``: crash-like,
        recovery on the next start."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown stop mode {mode!r}")
        if not self.running:
            return
        self._run(
            "pg_ctl",
            "stop",
            "-D",
            str(self.data),
            "-m",
            mode,
            "-w",
            "-t",
            str(int(timeout)),
            timeout=timeout + 10,
        )
        self.running = False

    def restart(self, mode: str = "fast", down_seconds: float = 0.0) -> None:
        self.stop(mode)
        time.sleep(down_seconds)
        self.start()

    def close(self) -> None:
        """Stop the server (immediately if a clean stop fails) and delete its folder."""
        try:
            if self.running:
                try:
                    self.stop("fast", timeout=30)
                except Exception:
                    self.stop("immediate", timeout=30)
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = None
            _live.discard(self)

    def __repr__(self) -> str:
        return f"PrivatePostgres(port={self.port}, running={self.running}, root={self.root})"


# -- the MetaService ----------------------------------------------------------------------


def metaservice_executable() -> str:
    """The ``metaservice`` script of the interpreter running the tests (.venv/bin)."""
    beside = Path(sys.executable).parent / "metaservice"
    if beside.exists():
        return str(beside)
    found = shutil.which("metaservice")
    if found is None:
        missing("the metaservice command is not installed (run `make install`)")
    return str(found)


class ServiceProcess(_Managed):
    """The real MetaService (``metaservice start``) as a child process.

    Its output goes to ``log_path`` (appended across restarts, each start marked by a
    ``=== start N ===`` line). The port is chosen once and kept, so clients keep
    their URL across ``kill``/``restart``.
    """

    def __init__(
        self,
        db_url: str,
        log_path: Path,
        *,
        barrier_interval_ms: int | None = None,
        workdir: Path | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.db_url = db_url
        self.log_path = Path(log_path)
        self.workdir = Path(workdir) if workdir else self.log_path.parent
        self.port = free_port()
        self.args = [
            metaservice_executable(),
            "start",
            "--db",
            db_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        if barrier_interval_ms is not None:
            self.args += ["--barrier-interval-ms", str(barrier_interval_ms)]
        self.args += list(extra_args)
        # Only what the test says: no METASERVICE_* setting leaks in from the caller.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("METASERVICE_")}
        self.env["METASERVICE_WAREHOUSE"] = str(self.workdir / "warehouse")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout: float = 60) -> None:
        """Start the service and wait until GET /healthz answers 200."""
        if self.alive():
            raise RuntimeError(f"the MetaService is already running (pid {self.pid})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"=== start {self.starts}: {' '.join(self.args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env=self.env,
            )
        _live.add(self)
        self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2) as http:
            while True:
                if not self.alive():
                    code = self.proc.returncode if self.proc else None
                    raise RuntimeError(
                        f"the MetaService exited with {code} while starting\n"
                        f"--- {self.log_path} ---\n{tail(self.log_path)}"
                    )
                try:
                    if http.get(self.url + "/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"the MetaService did not answer /healthz on {self.url} within "
                        f"{timeout} s\n--- {self.log_path} ---\n{tail(self.log_path)}"
                    )
                time.sleep(0.1)

    def kill(self, timeout: float = 30) -> int | None:
        """SIGKILL (no shutdown hooks run) and wait for the process to be gone."""
        return self._signal(signal.SIGKILL, timeout)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (uvicorn shuts down gracefully); SIGKILL if that takes over ``timeout``."""
        try:
            return self._signal(signal.SIGTERM, timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def _signal(self, sig: signal.Signals, timeout: float) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        _live.discard(self)
        return code

    def restart(self, timeout: float = 60) -> None:
        """Start again on the same port (after ``kill`` or ``stop``; stops it if needed)."""
        if self.alive():
            self.stop()
        self.start(timeout)

    def close(self) -> None:
        """Never leaves the process behind, whatever state it is in."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop(timeout=10)
            except Exception:
                self.kill()
        _live.discard(self)

    def __repr__(self) -> str:
        return f"ServiceProcess(url={self.url}, pid={self.pid}, starts={self.starts})"
