"""Engines and units of work.

Every request runs in one transaction: ``Database.write`` for requests that
change something, ``Database.read`` for queries. Services and repositories only
``flush()``; the unit of work commits, or rolls back on any error, and retries
the whole function when the database reports a lock conflict or deadlock
(SQLite's ``database is locked``, PostgreSQL's deadlock/serialization errors).

SQLite: write transactions start with ``BEGIN IMMEDIATE`` so that two writers
never both hold a read snapshot and then fight over the upgrade to a write
lock; reads use WAL mode and never block writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from metaservice.settings import DEFAULT_MAX_TRANSACTIONS, OLDEST_EVERY

log = logging.getLogger("metaservice.db")

T = TypeVar("T")
U = TypeVar("U")  # a unit of work: a Session, or a Connection (read_single)

# Threads of the async units of work: as many as the PostgreSQL pool's connections
# (pool_size + max_overflow below), so a thread never queues for one behind the others.
_THREADS = 40

# PostgreSQL SQLSTATEs worth retrying: serialization failure, deadlock, unique violation
# under a concurrent insert (a rerun then finds the row and answers idempotently).
_RETRY_SQLSTATES = {"40001", "40P01", "23505"}
_MAX_ATTEMPTS = 8

# A pooled PostgreSQL connection idle for longer than this is pinged (``SELECT 1``)
# before it is handed out. SQLAlchemy's ``pool_pre_ping`` pings on every checkout: a
# round trip per transaction on the hot requests, for connections that were in use a
# few milliseconds before. A connection that died within this window (the database
# restarted) fails its request with 503 ``database_unavailable``, and the pool then
# replaces every connection older than the failure.
PING_AFTER_IDLE_S = 1.0


# How many units of work of one Database run at once; the others wait their turn in
# order of priority, then arrival, holding no connection and no lock. Measured on the
# fleet of issue 13: with 40 at once, the one Python process's threads took turns at
# the GIL in the middle of their transactions, and PostgreSQL saw 15-20 sessions *idle
# in transaction*, their row locks held while Python served the others; every lock was
# held longer the more requests came, and the queues behind the locks grew. The
# service's setting ``max_transactions`` (default: this) overrides it.
MAX_TRANSACTIONS = DEFAULT_MAX_TRANSACTIONS

# Priorities of units of work (lower first): what a running job waits for before its
# batch can go on (its barrier, its commit report, the offline grant that lets its
# frontier follow the clock), then a derived job's next-barrier long poll, then the
# rest (listener events, reads, admin).
URGENT = 0
POLL = 1
NORMAL = 2
# Every OLDEST_EVERY-th turn handed over goes to the oldest waiter whatever its
# priority, so that lower priorities are slowed under load, never starved (the value
# lives in metaservice.settings, whose description of max_transactions names it).


class _Waiter:
    """One unit of work waiting for its turn: a thread (``loop`` None) or a coroutine."""

    __slots__ = ("event", "future", "gone", "handed", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.event = threading.Event() if loop is None else None
        self.future: asyncio.Future[None] | None = loop.create_future() if loop else None
        self.handed = False  # given a turn (under the lock of _Turns)
        self.gone = False  # cancelled while waiting: skipped

    def hand(self) -> None:
        self.handed = True
        if self.event is not None:
            self.event.set()
        elif self.loop is not None and self.future is not None:
            self.loop.call_soon_threadsafe(_resolve, self.future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Turns:
    """At most ``slots`` holders at once; waiters are let in by priority, then arrival
    (every :data:`OLDEST_EVERY` turns, the oldest waiter first).

    Threads wait with :meth:`enter`, coroutines with :meth:`enter_async` (before they
    take a thread: a coroutine waiting here holds neither a thread nor a connection, so
    an urgent request never queues in the executor behind others waiting for a turn).
    A thread that already holds a turn (a unit of work run inside another) goes on
    without a second one, so nesting never waits for itself.
    """

    def __init__(self, slots: int) -> None:
        self._lock = threading.Lock()
        self._free = slots
        self._queue: list[tuple[int, int, _Waiter]] = []
        self._arrival = itertools.count()
        self._handoffs = 0
        self._held = threading.local()

    def _take_or_queue(self, priority: int, waiter: _Waiter) -> bool:
        with self._lock:
            if self._free > 0 and not self._queue:
                self._free -= 1
                return True
            heapq.heappush(self._queue, (priority, next(self._arrival), waiter))
            return False

    def enter(self, priority: int) -> bool:
        """Wait for a turn; whether one was taken (False: this thread holds one)."""
        depth = getattr(self._held, "depth", 0)
        self._held.depth = depth + 1
        if depth:
            return False
        waiter = _Waiter()
        if not self._take_or_queue(priority, waiter):
            assert waiter.event is not None
            waiter.event.wait()  # the leaving holder hands its turn over
        return True

    async def enter_async(self, priority: int) -> None:
        """Wait for a turn on the event loop; give it back with :meth:`give_back`."""
        waiter = _Waiter(asyncio.get_running_loop())
        if self._take_or_queue(priority, waiter):
            return
        assert waiter.future is not None
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                handed, waiter.gone = waiter.handed, True
            if handed:
                self.give_back()
            raise

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """This thread runs under a turn taken for it (by :meth:`enter_async`)."""
        self._held.depth = getattr(self._held, "depth", 0) + 1
        try:
            yield
        finally:
            self._held.depth -= 1

    def leave(self, took: bool) -> None:
        self._held.depth -= 1
        if took:
            self.give_back()

    def give_back(self) -> None:
        with self._lock:
            self._handoffs += 1
            if self._handoffs % OLDEST_EVERY == 0 and self._queue:
                # The oldest waiter, whatever its priority: under a load of urgent work
                # the rest (listener events, reads, the console) still gets a share.
                oldest = min(range(len(self._queue)), key=lambda i: self._queue[i][1])
                self._queue[oldest], self._queue[-1] = self._queue[-1], self._queue[oldest]
                waiter = self._queue.pop()[2]
                heapq.heapify(self._queue)
                if not waiter.gone:
                    waiter.hand()
                    return
            while self._queue:
                waiter = heapq.heappop(self._queue)[2]
                if not waiter.gone:
                    waiter.hand()
                    return
            self._free += 1


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` as psycopg 3 URLs."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def is_sqlite(url: str) -> bool:
    return make_url(normalise_url(url)).get_backend_name() == "sqlite"


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalise_url(url)
    if is_sqlite(url):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs
        )
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_size", 20)
    kwargs.setdefault("max_overflow", 20)
    ping_after_idle_s = kwargs.pop("ping_after_idle_s", PING_AFTER_IDLE_S)
    engine = create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        _ping_idle_connections(engine, ping_after_idle_s)
    return engine


def _ping_idle_connections(engine: Engine, idle_s: float) -> None:
    """Ping a pooled connection on checkout only when it sat idle in the pool for more
    than ``idle_s`` seconds (see :data:`PING_AFTER_IDLE_S`)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info["checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("checked_in")
        if since is None or time.monotonic() - since <= idle_s:
            return  # a new connection, or one in use moments ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            # The pool replaces the connection and checks out again.
            raise DisconnectionError(f"pooled connection failed its ping: {exc}") from exc


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN can be IMMEDIATE.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError) and "database is locked" in str(exc):
        return True
    if isinstance(exc, DBAPIError):
        sqlstate = getattr(exc.orig, "sqlstate", None)
        return sqlstate in _RETRY_SQLSTATES
    return False


def database_contended(exc: DBAPIError) -> bool:
    """A transaction that lost to others (deadlock, serialization failure, SQLite's
    lock) on every one of its attempts: nothing was applied, and a retry may succeed."""
    return _retryable(exc)


# PostgreSQL SQLSTATEs of a schema older than the code: undefined table, undefined column.
_SCHEMA_BEHIND_SQLSTATES = {"42P01", "42703"}
# SQLite says the same in words (its "no such ..." errors are OperationalErrors).
_SCHEMA_BEHIND_SQLITE = ("no such table", "no such column", "has no column named")


def schema_behind(exc: DBAPIError) -> bool:
    """A statement named a table or column the database does not have: it was not
    migrated to this version of the MetaService (``metaservice db upgrade``)."""
    if getattr(exc.orig, "sqlstate", None) in _SCHEMA_BEHIND_SQLSTATES:
        return True
    message = str(exc.orig)
    return isinstance(exc, OperationalError) and any(s in message for s in _SCHEMA_BEHIND_SQLITE)


def database_unreachable(exc: DBAPIError) -> bool:
    """The database could not be reached or dropped the connection (restart, network),
    as opposed to a statement that failed: the request changed nothing and may be retried."""
    if database_contended(exc) or schema_behind(exc):
        return False  # psycopg's deadlock is an OperationalError too, but not an outage
    if exc.connection_invalidated:
        return True
    if isinstance(exc, OperationalError) and "database is locked" not in str(exc):
        return True
    return isinstance(exc, InterfaceError)


class Database:
    """Owns the engine; hands out read and write units of work."""

    def __init__(
        self, url: str, *, max_transactions: int = MAX_TRANSACTIONS, **engine_kwargs: Any
    ) -> None:
        self.url = normalise_url(url)
        self._turns = _Turns(max_transactions)
        self.engine = make_engine(self.url, **engine_kwargs)
        self.sqlite = is_sqlite(self.url)
        write_bind = (
            self.engine.execution_options(sqlite_immediate=True) if self.sqlite else self.engine
        )
        # A query reads several rows that move together (a job's frontier and its open
        # batches): it must see one snapshot. SQLite's WAL read transactions do;
        # PostgreSQL needs REPEATABLE READ (read-only, so it never fails to serialise).
        read_bind = (
            self.engine
            if self.sqlite
            else self.engine.execution_options(isolation_level="REPEATABLE READ")
        )
        self._read = sessionmaker(bind=read_bind, expire_on_commit=False)
        self._write = sessionmaker(bind=write_bind, expire_on_commit=False)
        # One statement sees one snapshot by itself: on PostgreSQL it needs no transaction,
        # and autocommit saves the BEGIN and COMMIT round trips (two of the three such a
        # read took); a Connection rather than a Session saves the ORM's bookkeeping
        # (as long again as the round trip). SQLite's BEGIN costs no round trip.
        single_bind = (
            self.engine
            if self.sqlite
            else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        )
        self._single = single_bind.begin
        self._threads: ThreadPoolExecutor | None = None

    def write(self, fn: Callable[[Session], T], priority: int = NORMAL) -> T:
        """Run ``fn`` in a write transaction, retried on lock conflicts; at most
        :data:`MAX_TRANSACTIONS` run at once, the others wait by ``priority``."""
        return self._run(self._write.begin, fn, priority)

    def read(self, fn: Callable[[Session], T], priority: int = NORMAL) -> T:
        return self._run(self._read.begin, fn, priority)

    def read_single(self, fn: Callable[[Connection], T], priority: int = NORMAL) -> T:
        """A read of one statement on a Core connection, outside any transaction on
        PostgreSQL: ``fn`` must send at most one statement (two would each see a
        snapshot of their own)."""
        return self._run(self._single, fn, priority)

    async def read_single_async(self, fn: Callable[[Connection], T], priority: int = NORMAL) -> T:
        """:meth:`read_single` from an ``async`` endpoint (see :meth:`write_async`)."""
        return await self._in_thread(self._single, fn, priority)

    async def write_async(self, fn: Callable[[Session], T], priority: int = NORMAL) -> T:
        """:meth:`write` from an ``async`` endpoint, on a thread of this database's own.

        A plain executor hop costs about half of Starlette's ``run_in_threadpool``
        (anyio's capacity limiter and cancel scope) on the hot requests; the context
        is copied, so the request id still reaches the log lines.
        """
        return await self._in_thread(self._write.begin, fn, priority)

    async def read_async(self, fn: Callable[[Session], T], priority: int = NORMAL) -> T:
        """:meth:`read` from an ``async`` endpoint (see :meth:`write_async`)."""
        return await self._in_thread(self._read.begin, fn, priority)

    async def _in_thread(
        self,
        begin: Callable[[], contextlib.AbstractContextManager[U]],
        fn: Callable[[U], T],
        priority: int,
    ) -> T:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(_THREADS, thread_name_prefix="metaservice-db")
        context = contextvars.copy_context()
        await self._turns.enter_async(priority)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._threads, context.run, self._held_attempts, begin, fn
            )
        finally:
            self._turns.give_back()

    def _held_attempts(
        self, begin: Callable[[], contextlib.AbstractContextManager[U]], fn: Callable[[U], T]
    ) -> T:
        with self._turns.held():
            return self._attempts(begin, fn)

    def _run(
        self,
        begin: Callable[[], contextlib.AbstractContextManager[U]],
        fn: Callable[[U], T],
        priority: int,
    ) -> T:
        took = self._turns.enter(priority)
        try:
            return self._attempts(begin, fn)
        finally:
            self._turns.leave(took)

    def _attempts(
        self, begin: Callable[[], contextlib.AbstractContextManager[U]], fn: Callable[[U], T]
    ) -> T:
        """``fn`` in a unit of work from ``begin`` (a session or a connection), retried."""
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                with begin() as unit:
                    return fn(unit)
            except DBAPIError as exc:
                if attempt == _MAX_ATTEMPTS or not _retryable(exc):
                    raise
                log.debug("retrying transaction after %s (attempt %d)", exc.orig, attempt)
                time.sleep(min(0.2, 0.005 * 2**attempt) * random.random())
        raise AssertionError("unreachable")

    def dispose(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False)
        self.engine.dispose()
