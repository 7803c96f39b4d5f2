"""Wake-ups for long polls on one replica: which jobs' progress moved.

A derived job's ``next-barrier`` long poll waits for its input writers to move (a
report that completes a batch, a source's new batch, an offline grant) instead of
asking the database again and again. The request paths that change a job's progress
call :meth:`Changes.notify` with the job's name once their transaction has
committed; a poll waits on the names of the jobs it depends on::

    seen = changes.mark()
    ...  # read what the poll depends on, in a read transaction
    await changes.wait(["src_a", "src_b"], since=seen, timeout=0.5)

A change that lands between :meth:`mark` and :meth:`wait` is not lost: ``wait``
returns at once. On PostgreSQL, other replicas' changes arrive too
(:mod:`~metaservice.barriers.replica_changes`: ``LISTEN/NOTIFY``, sent after commit and
coalesced). Not every write path notifies; the poll looks again on its own after a
short timeout (the resync), which covers those. The per-slot advancer, which moves
idle sources' frontiers (the watermark) and idle derived jobs, tells every poll at
once (:data:`EVERY_JOB`) after its tick committed, so a poll waiting on an idle
source looks again as soon as the slot's watermark is raised, not at its resync.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

# Not a job name (those are letters, digits, '_', '.', '-'): "every job may have moved".
EVERY_JOB = "*"


class Changes:
    """Per-replica notifications of moved jobs, for the event loop's coroutines.

    :meth:`notify` and :meth:`wait` must be called on the event loop's thread;
    :meth:`notify_threadsafe` from any thread once a wait has run on the loop.
    """

    def __init__(self) -> None:
        self._generation = 0
        self._moved_at: dict[str, int] = {}  # job name -> generation of its last change
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # Told of this replica's own changes, to pass them to the others (on PostgreSQL).
        self.on_local: Callable[[list[str]], None] | None = None

    def mark(self) -> int:
        """The current generation: pass it to :meth:`wait` as ``since``."""
        return self._generation

    def notify(self, names: Iterable[str], *, remote: bool = False) -> None:
        """These jobs moved (their transaction committed): wake whoever waits on them.
        ``remote``: told by another replica (not passed on again)."""
        names = list(names)
        self._generation += 1
        if EVERY_JOB in names:
            self._moved_at[EVERY_JOB] = self._generation
            for waiting in self._waiters.values():
                for event in waiting:
                    event.set()
        for name in names:
            self._moved_at[name] = self._generation
            for event in self._waiters.get(name, ()):
                event.set()
        if not remote and names and self.on_local is not None:
            self.on_local(names)

    def notify_threadsafe(self, names: Iterable[str]) -> None:
        """:meth:`notify` from a worker thread (a plain ``def`` endpoint)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.notify, list(names))

    async def wait(self, names: Iterable[str], *, since: int, timeout: float) -> bool:
        """Wait until one of the jobs moves after generation ``since``, or ``timeout``
        seconds pass; whether one moved."""
        self._loop = asyncio.get_running_loop()
        wanted = set(names)
        if any(self._moved_at.get(name, 0) > since for name in (*wanted, EVERY_JOB)):
            return True
        event = asyncio.Event()
        for name in wanted:
            self._waiters.setdefault(name, set()).add(event)
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            for name in wanted:
                waiting = self._waiters.get(name)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiters[name]
