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
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sqlalchemy import Connection, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from metaservice.barriers import watermark
from metaservice.barriers.changes import EVERY_JOB, Changes
from metaservice.barriers.idle import advance_idle_many
from metaservice.context import Context
from metaservice.db import Database
from metaservice.models import DERIVED, Job

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


class Advancer:
    """Runs :func:`tick` as each slot of ``ctx``'s clock starts, on a daemon thread,
    while this replica leads (see the module docstring)."""

    def __init__(self, db: Database, ctx: Context, changes: Changes | None = None) -> None:
        self.db, self.ctx, self.changes = db, ctx, changes
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
        if self.changes is not None and (done.raised is not None or done.advanced):
            self.changes.notify_threadsafe([EVERY_JOB])
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


def start_advancer(db: Database, ctx: Context, changes: Changes | None = None) -> Advancer | None:
    """The background advancer when the settings ask for one, started; None otherwise."""
    if ctx.idle_advance != "background":
        return None
    return Advancer(db, ctx, changes).start()
