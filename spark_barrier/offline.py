"""Offline barriers: a source job keeps committing while the MetaService is unreachable (G4).

The protocol is the MetaService's (``metaservice/barriers/offline.py``); this is the
job's half. While the service answers, a background thread reports in about once a
second (``PUT /jobs/{job}/offline-grant``), promising a *floor*: the lowest barrier
the job will ever give itself. The service keeps the job's frontier below that
floor, so a slot the job may still use is never treated as complete by a reader.
Reporting once a slot, it reports just after each slot begins: until then the slot
before is not complete for the job's readers (a report at a random phase made
readers wait half a slot for it on average).

When a batch cannot get its barrier from the service within ``offline_after_s``,
the job gives it one itself: the current slot of its clock (corrected by the offset
the grants taught it), never below the floor nor below an earlier batch's barrier.
The claim goes into the durable outbox, and is fsynced whatever the outbox's fsync
mode, *before* the batch is committed to Iceberg: a batch whose claim could be lost
(``fsync="interval"`` and a machine crash) would be replayed as committed while the
MetaService never heard of its barrier, and its commit report would be refused; the
job would also promise a floor above it on restart. So a replayed batch finds the
same barrier, and the outbox later delivers claims and commit reports in order. The job reports in again only once every claim (and
release) has been delivered: reporting in earlier could let the frontier pass a
barrier that is still on its way.

State kept under the job's state folder: ``offline.json`` (floor, clock offset and
interval, fsynced before the floor is relied on); the claims themselves live in the
outbox. A clean :meth:`OfflineBarriers.close` releases the grant through the outbox.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from metaservice.barriers.schemas import BatchBarrier, OfflineGrant
from metaservice.client import ApiError, MetaServiceClient, Unavailable
from metaservice.clock import Clock, SystemClock
from metaservice.contract import slot_of
from spark_barrier.outbox import Outbox, OutboxFullError

log = logging.getLogger("spark_barrier.offline")

T = TypeVar("T")

CLAIM = "claim"
RELEASE = "release"
_STATE_FILE = "offline.json"
# A heartbeat that reports about once a slot reports this long after each slot of the
# MetaService's clock begins: its promise then passes the slot just closed, which the
# job's tables (and every reader of them) wait for. The service records no floor past
# its own slot, so a report just before the boundary would move nothing for a whole
# heartbeat; the margin covers the error of the clock offset the job learnt, and a
# jitter spreads a fleet's reports.
SLOT_REPORT_MARGIN_MS = 20
SLOT_REPORT_JITTER_MS = 30
# A job whose barrier requests carry its promise (spark_barrier/carry.py) reports in
# with its batches: its heartbeat then waits this share of a slot past the slot's start
# for the batch's request, and sends nothing in a slot a request already reported in.
CARRIED_WAIT_SHARE = 0.5
# Room a claim keeps free in the outbox for its batch's commit reports (about 140
# bytes per output table), so that a full outbox stops the job before it commits a
# batch whose report could not be written, not after.
COMMIT_REPORTS_RESERVE_BYTES = 4096


class NoOfflineGrant(Unavailable):
    """The MetaService is unreachable and the job holds no grant to go on without it."""


@dataclass
class GrantState:
    floor: int  # never give a batch a barrier below this
    offset_ms: int  # MetaService clock minus this machine's clock
    interval_ms: int


def claim_record(
    job: str, batch_id: int, barrier: int, query_id: str | None = None
) -> dict[str, Any]:
    record = {"kind": CLAIM, "job": job, "batch_id": batch_id, "barrier": barrier}
    if query_id is not None:
        record["query_id"] = query_id
    return record


def release_record(job: str) -> dict[str, Any]:
    return {"kind": RELEASE, "job": job}


class OfflineBarriers:
    """Barriers for one source job's batches, from the MetaService or, offline, its own.

    >>> offline = OfflineBarriers(client, "ingest_orders", outbox, state_dir)  # doctest: +SKIP
    >>> barrier = offline.barrier_for(batch_id)                                  # doctest: +SKIP
    """

    def __init__(
        self,
        client: MetaServiceClient,
        job: str,
        outbox: Outbox,
        state_dir: Path,
        *,
        heartbeat_s: float = 1.0,
        offline_after_s: float = 2.0,
        clock: Clock | None = None,
    ) -> None:
        self.client = client
        self.clock = clock or SystemClock()
        self.job = job
        self.outbox = outbox
        self.offline_after_s = offline_after_s
        self._state_path = state_dir / _STATE_FILE
        self._lock = threading.RLock()
        self._state = _load(self._state_path)
        self._claims: dict[int, int] = {}  # batch id -> barrier, claimed and maybe undelivered
        self._control_seq = 0  # outbox sequence number of the latest claim or release
        self._offline_logged = False
        self._reported_slot = -1  # the service's slot of the latest report (either path)
        self._carried_slot = -1  # ... of the latest promise a barrier request carried
        # How a batch asks the MetaService for its barrier (carry.BatchRequests.ask, which
        # carries the job's parts, once the job wires it).
        self.ask: Callable[[int, str | None], BatchBarrier] = lambda batch_id, query_id: (
            self.client.batch_barrier(self.job, batch_id, query_id=query_id)
        )
        self._recover_claims()
        self._stop = threading.Event()
        self._heartbeat_s = heartbeat_s
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"offline-grant:{job}", daemon=True
        )
        self._thread.start()

    # -- what the sink asks ---------------------------------------------------------
    def barrier_for(
        self, batch_id: int, patience_s: float = 300.0, query_id: str | None = None
    ) -> int:
        """The barrier of a source batch: the one already claimed for it, the
        MetaService's answer, or, when the service stays unreachable for
        ``offline_after_s`` and the job holds a grant, one of its own.
        ``query_id``: the Spark query running the batch, sent with the request or claim."""
        with self._lock:
            known = self._claims.get(batch_id)
        if known is not None:
            return known
        if not self.controls_pending():
            wait = self.offline_after_s if self.granted else patience_s
            try:
                answer = _retry(lambda: self.ask(batch_id, query_id), wait)
            except Unavailable as exc:
                if not self.granted:
                    raise self._no_grant() from exc
            else:
                self.observe(answer.barrier)
                return answer.barrier
        return self.claim(batch_id, query_id)

    def observe(self, barrier: int) -> None:
        """A barrier the job used: later batches never get an earlier one."""
        with self._lock:
            if self._state is not None and barrier > self._state.floor:
                self._state.floor = barrier
                _save(self._state_path, self._state)

    def claim(self, batch_id: int, query_id: str | None = None) -> int:
        """Give ``batch_id`` a barrier of the job's own, on disk in the outbox first."""
        with self._lock:
            if batch_id in self._claims:
                return self._claims[batch_id]
            if self._state is None:
                raise self._no_grant()
            barrier = max(self._state.floor, self._clock_slot())
            self._control_seq = self.outbox.append(
                claim_record(self.job, batch_id, barrier, query_id),
                reserve_bytes=COMMIT_REPORTS_RESERVE_BYTES,
            )
            # Durable before the batch commits, whatever the outbox's fsync mode (see
            # the module docstring); offline batches are rare, so is this fsync.
            self.outbox.sync()
            self._claims[batch_id] = barrier
            self._state.floor = barrier
            _save(self._state_path, self._state)
        if not self._offline_logged:
            log.warning(
                "MetaService unreachable: job %s gives batch %d barrier %d itself; "
                "claims and commits wait in outbox %s",
                self.job, batch_id, barrier, self.outbox.directory,
            )  # fmt: skip
            self._offline_logged = True
        return barrier

    # -- grants ----------------------------------------------------------------------
    @property
    def granted(self) -> bool:
        with self._lock:
            return self._state is not None

    def controls_pending(self) -> bool:
        """True while a claim or release has not reached the MetaService."""
        return self.outbox.acked_seq < self._control_seq

    def report_in(self) -> bool:
        """Renew the grant with a fresh promise; False while claims are undelivered."""
        with self._lock:
            # Checked under the lock that claims take: a claim made after this point
            # is at or above the promise, so the floor the service records is below it.
            if self.controls_pending():
                return False
            promise = self._promise()
            if self._state is not None:
                self._state.floor = promise
                _save(self._state_path, self._state)  # the promise holds across a crash
        sent = self.clock.now_ms()
        grant = self.client.offline_grant(self.job, promise)
        self._granted(promise, grant, sent, self.clock.now_ms())
        return True

    # -- a promise carried by a barrier request (spark_barrier/carry.py) ---------------
    def promise_to_carry(self) -> int | None:
        """The promise a barrier request may carry (as :meth:`report_in` makes it, held
        across a crash); None while claims are undelivered or before the first grant."""
        with self._lock:
            if self.controls_pending() or self._state is None:
                return None
            promise = self._promise()
            self._state.floor = promise
            _save(self._state_path, self._state)
            return promise

    def carried(self, promise: int, grant: OfflineGrant, sent_ms: int, received_ms: int) -> None:
        """A barrier request carried ``promise`` and renewed the grant: the heartbeat
        sends nothing more this slot."""
        self._granted(promise, grant, sent_ms, received_ms)
        with self._lock:
            self._carried_slot = grant.barrier

    @property
    def interval_ms(self) -> int | None:
        """The barrier clock's slot width, as the grants taught it."""
        with self._lock:
            return self._state.interval_ms if self._state is not None else None

    def _granted(self, promise: int, grant: OfflineGrant, sent: int, received: int) -> None:
        with self._lock:
            state = GrantState(
                floor=max(promise, grant.barrier, self._state.floor if self._state else 0),
                offset_ms=grant.now_ms - (sent + received) // 2,
                interval_ms=grant.interval_ms,
            )
            self._state = state
            self._reported_slot = max(self._reported_slot, grant.barrier)
            _save(self._state_path, state)
        if self._offline_logged:
            log.info("job %s reports to the MetaService again", self.job)
            self._offline_logged = False

    def close(self, release: bool = True) -> None:
        """Stop reporting in; with ``release``, give the grant back through the outbox
        (after every claim), so the job's tables follow the clock while it is stopped."""
        self._stop.set()
        self._thread.join(timeout=10)
        if release:
            with self._lock:
                try:
                    self._control_seq = self.outbox.append(release_record(self.job))
                except OutboxFullError:
                    log.warning(
                        "job %s: outbox full, its offline grant stays until the job runs "
                        "again or an operator releases it",
                        self.job,
                    )
                    return
                self._state = None
                self._state_path.unlink(missing_ok=True)

    # -- internals -------------------------------------------------------------------
    def _no_grant(self) -> NoOfflineGrant:
        return NoOfflineGrant(
            f"the MetaService at {self.client.url} is unreachable and job '{self.job}' "
            "holds no offline grant (it has not reached the service since it started); "
            "start the MetaService, then restart the query"
        )

    def _promise(self) -> int:
        if self._state is None:
            return 0  # a first grant floors at the service's slot
        return max(self._state.floor, self._clock_slot())

    def _clock_slot(self) -> int:
        assert self._state is not None
        return slot_of(self.clock.now_ms() + self._state.offset_ms, self._state.interval_ms)

    def _recover_claims(self) -> None:
        """Claims and releases still in the outbox from an earlier run of the driver."""
        for entry in self.outbox.pending():
            record = entry.record
            if record.get("job") != self.job or record.get("kind") not in (CLAIM, RELEASE):
                continue
            self._control_seq = entry.seq
            if record["kind"] == CLAIM:
                self._claims[int(record["batch_id"])] = int(record["barrier"])

    def _until_next_report_s(self) -> float:
        """The heartbeat's wait: ``heartbeat_s``, ended early at the start of the next
        slot (plus the margin) when the heartbeat is at least once a slot anyway."""
        with self._lock:
            state = self._state
        if state is None or self._heartbeat_s * 1000 > state.interval_ms:
            return self._heartbeat_s
        now = self.clock.now_ms() + state.offset_ms
        slot = slot_of(now, state.interval_ms)
        next_slot = slot + state.interval_ms
        margin = SLOT_REPORT_MARGIN_MS + random.uniform(0, SLOT_REPORT_JITTER_MS)
        with self._lock:
            carrying = self._carried_slot >= slot - state.interval_ms
        at = next_slot + margin
        if carrying:  # the next batch's request will likely report in: give it time
            return (next_slot + max(margin, state.interval_ms * CARRIED_WAIT_SHARE) - now) / 1000
        return min(self._heartbeat_s, (at - now) / 1000)

    def _reported_this_slot(self) -> bool:
        """Whether a report (a heartbeat, or a promise a barrier request carried) already
        reached the service in its current slot: at most one heartbeat a slot, and none
        in a slot a request reported in."""
        with self._lock:
            state = self._state
            if state is None:
                return False
            now = self.clock.now_ms() + state.offset_ms
            return self._reported_slot >= slot_of(now, state.interval_ms)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._until_next_report_s()):
            if self._reported_this_slot():
                continue
            try:
                self.report_in()
            except Unavailable as exc:
                log.debug("job %s cannot report in: %s", self.job, exc)
            except ApiError as exc:
                log.warning("MetaService refused job %s's offline grant: %s", self.job, exc)


def _retry(call: Callable[[], T], give_up_after_s: float) -> T:
    deadline = time.monotonic() + give_up_after_s
    delay = 0.1
    while True:
        try:
            return call()
        except Unavailable:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _load(path: Path) -> GrantState | None:
    try:
        return GrantState(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        # Without it the job cannot prove its floor: it waits for the service once.
        log.warning("ignoring unreadable %s (%s); the next grant replaces it", path, exc)
        return None


def _save(path: Path, state: GrantState) -> None:
    """Replace the state file atomically and durably (temp file, fsync, rename)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(asdict(state), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
