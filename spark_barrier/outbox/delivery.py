"""The deliverer: a background thread sending an outbox's records in order, with
backoff, and the other delivery path's hold, take and settle (a barrier request
carrying reports, spark_barrier/carry.py)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from types import TracebackType

from spark_barrier.outbox.errors import OutboxClosedError, OutboxError
from spark_barrier.outbox.frames import Entry, Report
from spark_barrier.outbox.log import Outbox

log = logging.getLogger("spark_barrier.outbox")  # one logger for the whole package

# --------------------------------------------------------------------------- delivery


class Deliverer:
    """Background thread delivering an outbox's records in order through ``send``.

    ``send(batch)`` gets up to ``batch_size`` reports in sequence order and must raise
    on failure, in which case delivery is retried with exponential backoff
    (``initial_backoff_s`` doubling up to ``max_backoff_s``, each delay shortened by a
    random fraction up to ``jitter`` so that many drivers do not retry in lockstep). A
    retry reads the outbox again: it sends the failed batch's records and those written
    during the outage, up to ``batch_size``, so a backlog drains in full batches.
    It should raise only for failures worth retrying: a report the service refuses for
    good (e.g. a 409 conflict) must be logged and swallowed by ``send``, or it would
    block every later report. After a success the batch is acknowledged in the outbox.
    Delivery is at-least-once (see the module docstring).

    Another delivery path (a barrier request carrying the job's reports, see
    ``spark_barrier/carry.py``) may deliver records too: :meth:`hold` keeps records
    back for a while so that it can carry them, :meth:`take` hands it the records not
    yet sent (never while ``send`` is sending them), and :meth:`settle` says whether
    they were acknowledged (then they count as delivered, and are acknowledged in the
    outbox) or not (then this thread sends them at once, as any other).
    """

    def __init__(
        self,
        outbox: Outbox,
        send: Callable[[list[Report]], object],
        *,
        batch_size: int = 100,
        initial_backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        jitter: float = 0.5,
        name: str = "outbox-deliverer",
    ) -> None:
        if batch_size < 1 or initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("need batch_size >= 1 and 0 < initial_backoff_s <= max_backoff_s")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        self._outbox = outbox
        self._send = send
        self._batch_size = batch_size
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._jitter = jitter
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._delivered = outbox.acked_seq  # sent successfully (acked or about to be)
        self._failures = 0  # consecutive failed attempts
        self._failing_since = 0.0
        # The other delivery path: records from _held_from on wait until _held_until
        # (time.monotonic) for it; records up to _carrying are in its hands; _sending
        # while this thread's send has a batch.
        self._state = threading.Lock()
        self._wakeup = threading.Event()
        self._held_from = 0
        self._held_until = 0.0
        self._carrying = 0
        self._sending = False

    @property
    def delivered_seq(self) -> int:
        return self._delivered

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def start(self) -> Deliverer:
        self._thread.start()
        return self

    # -- the other delivery path

    def hold(self, seq: int, seconds: float) -> None:
        """Keep record ``seq`` and the later ones back for up to ``seconds`` (from now),
        for another path to deliver; a hold already running keeps its (earlier) end. None
        while delivery is failing: the service is unreachable, so no barrier request
        will carry them either."""
        if self._failures:
            return
        with self._state:
            if self._held_until > time.monotonic() and self._held_from <= seq:
                return
            self._held_from, self._held_until = seq, time.monotonic() + seconds
        self._wakeup.set()

    def take(self, limit: int, accept: Callable[[Report], bool]) -> list[Entry]:
        """The oldest records not sent yet that ``accept`` takes, up to ``limit``, in
        order, handed to the caller until :meth:`settle` (none while this thread is
        sending, or while an earlier take is not settled)."""
        with self._state:
            if self._sending or self._carrying:
                return []
            try:
                batch = self._outbox.read_batch(self._delivered, limit)
            except OutboxError:
                return []
            taken: list[Entry] = []
            for entry in batch:  # a prefix: delivery stays in order
                if not accept(entry.record):
                    break
                taken.append(entry)
            if taken:
                self._carrying = taken[-1].seq
            return taken

    def settle(self, upto_seq: int, acknowledged: bool) -> None:
        """The records taken up to ``upto_seq`` were acknowledged by the MetaService
        (they count as delivered), or not (this thread sends them now)."""
        with self._state:
            if self._carrying == upto_seq:
                self._carrying = 0
            if acknowledged:
                self._delivered = max(self._delivered, upto_seq)
            # The hold was for what was taken; a later record starts a hold of its own,
            # and one appended meanwhile (rare) is sent now.
            self._held_until = 0.0
        self._wakeup.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything appended so far is acknowledged; False on timeout."""
        with self._state:
            self._held_until = 0.0  # nothing waits for another path any more
        self._wakeup.set()
        target = self._outbox.last_seq
        done = self._outbox.wait_acked(target, timeout, cancel=self._stop)
        return done or self._outbox.acked_seq >= target

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the thread; a ``send`` in progress is allowed to finish within ``timeout``."""
        self._stop.set()
        self._wakeup.set()
        self._outbox._wake()  # out of wait_for_records / wait_acked at once
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("outbox deliverer still busy in send() after %s s", timeout)

    def __enter__(self) -> Deliverer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._step()
            self._try_ack()  # do not resend after a restart what was already delivered
        except OutboxClosedError:
            pass

    def _step(self) -> None:
        self._wakeup.clear()  # a wake-up from here on ends the wait below at once
        with self._state:
            self._delivered = max(self._delivered, self._outbox.acked_seq)
            wait = self._carrying > 0  # in the other path's hands: wait for its answer
            held = self._held_until - time.monotonic() if self._held_until else 0.0
            batch: list[Entry] = []
            if not wait:
                try:
                    batch = self._outbox.read_batch(self._delivered, self._batch_size)
                except OutboxClosedError:
                    raise
                except Exception as exc:
                    self._failed(exc, "cannot read the outbox")
                    return
                if held > 0:
                    batch = [e for e in batch if e.seq < self._held_from]
                self._sending = bool(batch)
        if not batch:
            self._try_ack()
            if wait or held > 0:
                self._wakeup.wait(min(1.0, held) if held > 0 else 1.0)
            else:
                self._outbox.wait_for_records(self._delivered, 1.0, cancel=self._stop)
            return
        delivered = False
        try:
            delivered = self._deliver([e.record for e in batch])
        finally:
            with self._state:
                self._sending = False
                if delivered:
                    self._delivered = max(self._delivered, batch[-1].seq)
        if delivered:
            self._try_ack()

    def _deliver(self, records: list[Report]) -> bool:
        """Send once; a failure waits out its backoff and leaves the records for the next
        step to read again (with any written since)."""
        try:
            self._send(records)
        except Exception as exc:
            self._failed(exc, "cannot deliver reports to the MetaService")
            return False
        self._recovered()
        return True

    def _try_ack(self) -> None:
        if self._delivered <= self._outbox.acked_seq:
            return
        try:
            self._outbox.ack(self._delivered)
        except OutboxClosedError:
            raise
        except Exception as exc:
            # Retried with the next ack (acks are cumulative); until then, a restart
            # would resend these reports, which the idempotent receiver tolerates.
            log.warning("could not record the acknowledgement of %d: %s", self._delivered, exc)

    def _failed(self, exc: Exception, what: str) -> None:
        self._failures += 1
        self._held_until = 0.0  # unreachable: nothing will carry the held records
        if self._failures == 1:
            self._failing_since = time.monotonic()
            log.warning(
                "%s (%s: %s); %d reports waiting in outbox %s; retrying with backoff up to %g s",
                what, type(exc).__name__, exc, self._outbox.backlog, self._outbox.directory,
                self._max_backoff_s,
            )  # fmt: skip
        else:
            log.debug("%s, attempt %d: %s", what, self._failures, exc)
        self._stop.wait(self._backoff(self._failures))

    def _recovered(self) -> None:
        if self._failures:
            log.info(
                "delivery to the MetaService recovered after %d failed attempts over %.1f s; "
                "%d reports waiting in outbox %s",
                self._failures, time.monotonic() - self._failing_since, self._outbox.backlog,
                self._outbox.directory,
            )  # fmt: skip
        self._failures = 0

    def _backoff(self, attempt: int) -> float:
        delay = min(self._max_backoff_s, self._initial_backoff_s * 2.0 ** min(attempt - 1, 62))
        return delay * (1 - self._jitter * random.random())
