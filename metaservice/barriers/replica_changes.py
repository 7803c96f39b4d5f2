"""Long-poll wake-ups across replicas on one PostgreSQL: ``LISTEN/NOTIFY``.

A replica's :class:`~metaservice.barriers.changes.Changes` wakes its own long polls
when a job moves there. Here the names it was told (after the change's transaction
committed) go to the other replicas too: a sender thread coalesces them (everything
told within :data:`COALESCE_S` in one ``NOTIFY``, names deduplicated), and a listener
thread on a connection of its own hands the other replicas' names to this replica's
``Changes`` on its event loop. A notification is a hint, never a decision: the poll
reads the database again when woken, and its periodic resync still covers what was
lost (a notification dropped while a connection was down, a write path that does not
notify). The channel is named after the database schema, so replicas of one
deployment hear each other and those of another schema (tests) do not. The per-slot
advancer's process, which serves no poll, only sends (:class:`ReplicaNotifier`).

SQLite has no replicas: nothing starts there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import uuid
import zlib
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from metaservice.barriers.changes import Changes
from metaservice.db import is_sqlite, normalise_url

log = logging.getLogger("metaservice.changes")

COALESCE_S = 0.01  # names told within this long go in one NOTIFY
MAX_PAYLOAD_BYTES = 7000  # PostgreSQL's limit is 8000
RECONNECT_S = 1.0
LISTEN_WAIT_S = 0.5  # how often the listener looks whether it was stopped


def channel_for(schema: str) -> str:
    """The ``NOTIFY`` channel of the replicas on ``schema`` (channels are database-wide)."""
    return f"metaservice_changes_{zlib.crc32(schema.encode()):08x}"


class ReplicaChanges:
    """The sender and listener threads of one replica (see the module docstring)."""

    def __init__(self, db_url: str, changes: Changes, loop: asyncio.AbstractEventLoop) -> None:
        self.changes = changes
        self.loop = loop
        self.replica = uuid.uuid4().hex[:12]
        self._engine: Engine = create_engine(normalise_url(db_url), poolclass=NullPool)
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.channel = _channel_of(self._engine)
        self.listening = threading.Event()  # set once LISTEN ran (tests)
        self._threads = [
            threading.Thread(target=self._send_loop, name="changes-notify", daemon=True),
            threading.Thread(target=self._listen_loop, name="changes-listen", daemon=True),
        ]
        changes.on_local = self.tell
        for thread in self._threads:
            thread.start()

    def tell(self, names: list[str]) -> None:
        """This replica's jobs that moved (their transactions committed)."""
        with self._lock:
            self._pending.update(names)
        self._wake.set()

    def stop(self) -> None:
        self.changes.on_local = None
        self._stop.set()
        self._wake.set()
        self._wake_listener()
        for thread in self._threads:
            thread.join(timeout=5)
        self._engine.dispose()

    def _wake_listener(self) -> None:
        """End the listener's wait for a notification now, not up to
        :data:`LISTEN_WAIT_S` later: a note of this replica's own, which it ignores
        (stopping a replica took half a second, most of a test's teardown)."""
        if not self.listening.is_set():
            return
        conn: Any = None
        try:
            conn = _connect(self._engine)
            _send(conn, self.channel, json.dumps({"r": self.replica, "j": []}))
        except Exception as exc:  # it ends at its next timeout instead
            log.debug("could not wake the listener: %s", exc)
        finally:
            _close(conn)

    # -- sending ------------------------------------------------------------------

    def _send_loop(self) -> None:
        conn: Any = None
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.wait(COALESCE_S):
                break
            self._wake.clear()
            with self._lock:
                names, self._pending = sorted(self._pending), set()
            if not names:
                continue
            try:
                if conn is None:
                    conn = _connect(self._engine)
                _notify(conn, self.channel, self.replica, names)
            except Exception as exc:  # a hint lost: the polls' resync covers it
                log.debug("could not notify the other replicas: %s", exc)
                _close(conn)
                conn = None
        _close(conn)

    # -- listening ----------------------------------------------------------------

    def _listen_loop(self) -> None:
        while not self._stop.is_set():
            conn: Any = None
            try:
                conn = _connect(self._engine)
                psycopg_conn = conn.driver_connection
                psycopg_conn.execute(f'LISTEN "{self.channel}"')
                self.listening.set()
                while not self._stop.is_set():
                    # notifies() waits out its whole timeout, however many notes come
                    for note in psycopg_conn.notifies(timeout=LISTEN_WAIT_S):
                        if self._stop.is_set():
                            break
                        self._heard(note.payload)
            except Exception as exc:
                log.debug("listening for the other replicas failed: %s", exc)
                self._stop.wait(RECONNECT_S)
            finally:
                _close(conn)

    def _heard(self, payload: str) -> None:
        try:
            doc = json.loads(payload)
            names = [str(n) for n in doc["j"]]
        except (ValueError, KeyError, TypeError):
            return
        if doc.get("r") == self.replica or not names:
            return  # this replica's own: its polls were woken already
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(lambda: self.changes.notify(names, remote=True))


def _channel_of(engine: Engine) -> str:
    """The channel of the replicas on the engine's schema."""
    with engine.connect() as conn:
        schema = conn.exec_driver_sql("SELECT current_schema()").scalar_one()
    return channel_for(str(schema))


def _notify(conn: Any, channel: str, sender: str, names: list[str]) -> None:
    """Tell the channel's listeners that these jobs moved, on a connection of
    :func:`_connect`."""
    for payload in payloads(sender, names):
        _send(conn, channel, payload)


def _send(conn: Any, channel: str, payload: str) -> None:
    conn.driver_connection.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def _connect(engine: Engine) -> Any:
    """A connection of its own (no pool), in autocommit: a NOTIFY goes at once."""
    raw = engine.raw_connection()
    driver = raw.driver_connection
    assert driver is not None  # a connection just opened has its driver's
    driver.autocommit = True
    return raw


def _close(conn: Any) -> None:
    """Close a connection of :func:`_connect`, broken or not."""
    if conn is not None:
        # Invalidated first: it closes the driver's connection with no reset, whose
        # rollback on a connection the server dropped would log a traceback.
        with contextlib.suppress(Exception):
            conn.invalidate()
        with contextlib.suppress(Exception):  # closing a broken connection
            conn.close()


def payloads(sender: str, names: list[str]) -> list[str]:
    """The ``NOTIFY`` payloads telling that these jobs moved, each under PostgreSQL's
    size limit; ``sender`` is the replica (or process) telling, which ignores its own."""
    out: list[str] = []
    chunk: list[str] = []
    size = 0
    for name in names:
        if chunk and size + len(name) + 4 > MAX_PAYLOAD_BYTES - 40:
            out.append(json.dumps({"r": sender, "j": chunk}))
            chunk, size = [], 0
        chunk.append(name)
        size += len(name.encode()) + 4
    if chunk:
        out.append(json.dumps({"r": sender, "j": chunk}))
    return out


class ReplicaNotifier:
    """Tells every replica of the schema that jobs moved, from a process that serves no
    long poll itself (the advancer's, ``barriers/advancer.py``): one ``NOTIFY`` per
    call, sent at once on a connection of its own. A hint like any other: one lost
    (the database unreachable) is covered by the polls' resync."""

    def __init__(self, db_url: str) -> None:
        self.sender = f"advancer-{uuid.uuid4().hex[:12]}"
        self._engine: Engine = create_engine(normalise_url(db_url), poolclass=NullPool)
        self._conn: Any = None
        self._channel: str | None = None

    def __call__(self, names: list[str]) -> None:
        try:
            if self._channel is None:
                self._channel = _channel_of(self._engine)
            if self._conn is None:
                self._conn = _connect(self._engine)
            _notify(self._conn, self._channel, self.sender, sorted(set(names)))
        except Exception as exc:
            log.debug("could not notify the replicas: %s", exc)
            _close(self._conn)
            self._conn = None

    def close(self) -> None:
        _close(self._conn)
        self._conn = None
        self._engine.dispose()


def start_replica_changes(db_url: str, changes: Changes) -> ReplicaChanges | None:
    """Start passing long-poll wake-ups between replicas (PostgreSQL only); call from
    the event loop the service runs on."""
    if is_sqlite(db_url):
        return None
    try:
        return ReplicaChanges(db_url, changes, asyncio.get_running_loop())
    except Exception as exc:  # the resync still wakes polls: never fail a start for it
        log.warning("long polls will not hear other replicas: %s", exc)
        return None
