"""The per-slot advancer: once a slot it raises the watermark S to the last closed slot
and advances every idle derived job, so that consistent-version reads never write
(the argument, G1 and G2 with its bound, is in :mod:`metaservice.barriers.watermark`).

:func:`tick` is one round: the raise (a short transaction under the watermark lock
held exclusively), then the advance (a transaction of its own, which takes derived
jobs' rows with ``SKIP LOCKED`` only). Tests and simulations call it with their
``ManualClock``; the service runs it in the background (:class:`Advancer`, started in
the app's lifespan when ``settings.idle_advance`` resolves to ``background``) as each
slot of its clock starts.

With several replicas on one PostgreSQL, one of them leads: the one holding the
session-level advisory lock ``(ADVANCER_LOCK, hashtext(current_schema()))`` on a
connection of its own (``pg_try_advisory_lock``, tried again each slot by the
others; a leader that dies drops its connection and the lock with it). Leading is
only about cost: two ticks at once are safe (each raise only moves S up, under the
exclusive lock; each advance only moves jobs whose rows it locked), so a lost
connection noticed late does no harm.

On PostgreSQL the service runs the advancer in a process of its own
(:class:`AdvancerProcess`, ``python -m metaservice.barriers.advancer``): a tick is
Python work for every idle derived job (about 0.1 ms each), and in the process that
serves requests it held the interpreter while they waited. On 10,000 jobs a
consistent-version read's p99 was 196 ms with the advancer in the service's process
and 19 ms without it, ``/healthz``'s 34 ms and 1.5 ms (``bench_service.py --part
reads``). The process tells the replicas' long polls through ``NOTIFY``
(``replica_changes.ReplicaNotifier``), reads its settings as JSON from its standard
input, and ends when that closes: when the service stops it, or dies. The service
starts it again if it ends on its own. SQLite (one process, writers serialised) keeps
the advancer on a thread of the service.
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from metaservice.barriers import watermark
from metaservice.barriers.changes import EVERY_JOB, Changes
from metaservice.barriers.idle import advance_idle_many
from metaservice.barriers.replica_changes import ReplicaNotifier
from metaservice.clock import SystemClock
from metaservice.context import Context
from metaservice.db import Database, is_sqlite
from metaservice.models import DERIVED, Job
from metaservice.settings import Settings

log = logging.getLogger("metaservice.advancer")

# A tick runs this long after its slot starts: a slot's last batches asked for their
# barrier just before it ended.
TICK_DELAY_MS = 5


def ms_until_tick(now_ms: float, interval_ms: int) -> float:
    """How long from ``now_ms`` until the next tick: :data:`TICK_DELAY_MS` into the next slot."""
    return interval_ms - now_ms % interval_ms + TICK_DELAY_MS


@dataclass(frozen=True)
class Tick:
    raised: int | None  # the new watermark, or None when it was there already
    advanced: int  # batches the MetaService recorded for idle derived jobs


def advance_all(session: Session, ctx: Context) -> int:
    """Advance every idle derived job as far as its inputs allow (in this write
    transaction); how many batches were recorded."""
    jobs = list(session.execute(select(Job).where(Job.kind == DERIVED).order_by(Job.id)).scalars())
    return advance_idle_many(session, ctx, jobs, seal=False)


def tick(db: Database, ctx: Context) -> Tick:
    """One round of the advancer: raise S, then advance idle derived jobs."""
    raised = db.write(lambda session: watermark.raise_to_closed_slot(session, ctx))
    advanced = db.write(lambda session: advance_all(session, ctx))
    return Tick(raised=raised, advanced=advanced)


Notify = Callable[[list[str]], None]  # told the names of jobs that moved


class Advancer:
    """Runs :func:`tick` as each slot of ``ctx``'s clock starts, on a daemon thread,
    while this replica leads (see the module docstring); ``notify`` is told
    :data:`EVERY_JOB` after a tick that moved something."""

    def __init__(self, db: Database, ctx: Context, notify: Notify | None = None) -> None:
        self.db, self.ctx, self.notify = db, ctx, notify
        self.ticks = 0
        self._stop = threading.Event()
        self._leader: Connection | None = None
        self._thread = threading.Thread(target=self._run, name="metaservice-advancer", daemon=True)

    def start(self) -> Advancer:
        log.info("advancing idle jobs every %d ms slot", self.ctx.interval)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self._resign()

    def _run(self) -> None:
        while True:
            wait_ms = ms_until_tick(self.ctx.now_ms(), self.ctx.interval)
            if self._stop.wait(wait_ms / 1000):
                return
            try:
                if self._leads():
                    self.run_once()
            except (DBAPIError, PoolTimeout) as exc:  # the database unreachable: next slot
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
                log.warning("advancer tick failed (%s); the next one is a slot from now", first)
                self._resign()
            except Exception:  # a failed round: next slot
                log.exception("advancer tick failed; the next one is a slot from now")
                self._resign()

    def run_once(self) -> Tick:
        """One tick; then the long polls of this replica (and, through theirs, of the
        others) are told that every job may have moved, if the tick moved anything."""
        done = tick(self.db, self.ctx)
        self.ticks += 1
        if self.notify is not None and (done.raised is not None or done.advanced):
            self.notify([EVERY_JOB])
        return done

    def _leads(self) -> bool:
        if self.db.engine.dialect.name != "postgresql":
            return True  # SQLite: every process ticks (writers are serialised; harmless)
        if self._leader is not None:
            self._leader.execute(select(1))  # still connected (else: resign, try again)
            return True
        # outside a transaction: the connection holds the lock, not an open transaction
        conn = self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        key = func.hashtext(func.current_schema())
        got = conn.execute(select(func.pg_try_advisory_lock(watermark.ADVANCER_LOCK, key)))
        if got.scalar():
            self._leader = conn
            log.info("this replica leads the idle advancer")
            return True
        conn.close()
        return False

    def _resign(self) -> None:
        if self._leader is not None:
            try:
                # closed, not returned to the pool: the session-level lock goes with it
                self._leader.invalidate()
                self._leader.close()
            except Exception:
                log.debug("closing the advancer's leader connection failed", exc_info=True)
            self._leader = None


class AdvancerProcess:
    """The advancer in a process of its own (see the module docstring), started again
    a second after it ends unless the service is stopping it."""

    RESTART_S = 1.0

    def __init__(self, settings: Settings) -> None:
        self._settings = settings.model_dump_json()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._supervise, name="metaservice-advancer-process", daemon=True
        )

    def start(self) -> AdvancerProcess:
        self._thread.start()
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _supervise(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._stop.is_set():
                    return
                proc = self._proc = subprocess.Popen(
                    [sys.executable, "-m", "metaservice.barriers.advancer"],
                    stdin=subprocess.PIPE,
                    text=True,
                    # not in the service's process group: a Ctrl-C in the terminal
                    # stops the service, which then stops this process itself
                    start_new_session=True,
                )
                assert proc.stdin is not None  # asked for: PIPE
                with contextlib.suppress(OSError):  # it ended at once: told below
                    proc.stdin.write(self._settings + "\n")
                    proc.stdin.flush()
            code = proc.wait()
            if not self._stop.is_set():
                log.error(
                    "the advancer process ended (exit status %s); starting it again in %.0f s",
                    code,
                    self.RESTART_S,
                )
                self._stop.wait(self.RESTART_S)

    def stop(self, timeout: float = 10) -> None:
        with self._lock:
            self._stop.set()
            proc = self._proc
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # the process ends its tick and stops
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the advancer process did not stop in %.0f s; killing it", timeout)
                proc.kill()
                proc.wait()
        self._thread.join(timeout)


def start_advancer(
    db: Database, ctx: Context, changes: Changes | None = None
) -> Advancer | AdvancerProcess | None:
    """The background advancer when the settings ask for one, started: a process of
    its own on PostgreSQL, a thread on SQLite or on a clock other than the system's
    (a process has only the system clock); None otherwise."""
    if ctx.idle_advance != "background":
        return None
    if not is_sqlite(ctx.settings.db_url) and isinstance(ctx.clock, SystemClock):
        return AdvancerProcess(ctx.settings).start()  # its process keeps the system clock
    return Advancer(db, ctx, changes.notify_threadsafe if changes is not None else None).start()


def main() -> None:
    """The advancer's process: settings as JSON on the first line of standard input;
    it runs until standard input closes."""
    from metaservice.logs import log_config

    settings = Settings.model_validate_json(sys.stdin.readline())
    logging.config.dictConfig(log_config(settings.log_level, settings.log_format))
    db = Database(settings.db_url)
    notify = ReplicaNotifier(settings.db_url)
    advancer = Advancer(db, Context(settings=settings, clock=SystemClock()), notify).start()
    try:
        sys.stdin.read()  # until the service closes the pipe, or ends
    finally:
        advancer.stop()
        notify.close()
        db.dispose()


if __name__ == "__main__":
    main()
