"""One request per batch: a batch's barrier request carries what the job would
otherwise send on its own.

A source job's request for batch k+1's barrier carries batch k's commit reports (from
the outbox), the listener's progress event and the offline-grant promise
(``POST /jobs/{job}/batches/{id}/barrier`` with ``reports``, ``progress``, ``floor``;
see ``metaservice/barriers/carried.py``). The MetaService applies and answers each
part on its own, and the barrier is decided as if the request carried nothing, before
the batch commits. A derived job's request carries its progress only: its reports
make its readers' next batches possible, so they go at once.

Every part keeps its own path as the durable or fallback one:

- a report stays in the outbox, held back for up to ``carry_s`` for the next request;
  one the answer acknowledges counts as delivered (and is acknowledged in the outbox),
  one it does not (refused, no answer, the request failed) is sent by the outbox's
  deliverer as before, and one no request came for in time too;
- a progress event not recorded goes back to the listener, which sends it;
- a promise renews the grant as the heartbeat would, and the heartbeat sends nothing in
  a slot a request reported in (at most one a slot).

Nothing here imports pyspark: the sink calls :meth:`BatchRequests.ask`, and so does
the fleet benchmark (``bench/bench_service.py``), which counts the requests it makes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from metaservice.barriers.schemas import Carried, CarriedBatchBarrier
from metaservice.client import ApiError, MetaServiceClient
from metaservice.topology.schemas import JobEvent

if TYPE_CHECKING:
    from spark_barrier.listener import BarrierListener
    from spark_barrier.offline import OfflineBarriers
    from spark_barrier.outbox import Entry
    from spark_barrier.report import OutboxReporter

log = logging.getLogger("spark_barrier.carry")

# The most reports one barrier request carries (a backlog drains through the outbox).
MAX_CARRIED_REPORTS = 100


def carry_seconds(interval_ms: int) -> float:
    """How long a report or progress event waits for the next batch's request: a slot
    and a half (a source triggers once a slot; the next batch asks its barrier a
    planning time after the slot begins)."""
    return 1.5 * interval_ms / 1000


@dataclass
class _Parts:
    reports: list[Entry] = field(default_factory=list)
    progress: JobEvent | None = None
    floor: int | None = None
    sent_ms: int = 0


class BatchRequests:
    """A job's barrier requests, carrying its parts (see the module docstring).

    >>> requests = BatchRequests(client, "ingest", reporter, listener, offline)  # doctest: +SKIP
    >>> answer = requests.ask(7, query_id="...")                                 # doctest: +SKIP
    """

    def __init__(
        self,
        client: MetaServiceClient,
        job: str,
        reporter: OutboxReporter | None = None,
        listener: BarrierListener | None = None,
        offline: OfflineBarriers | None = None,
    ) -> None:
        self.client = client
        self.job = job
        self.reporter = reporter
        self.listener = listener
        self.offline = offline

    def ask(
        self,
        batch_id: int,
        *,
        start: int | None = None,
        end: int | None = None,
        query_id: str | None = None,
    ) -> CarriedBatchBarrier:
        """The batch's barrier, with the job's parts carried and each settled by its
        answer; a refused barrier raises as before (its parts settled by the error)."""
        parts = self._take()
        carried: dict[str, Any] = {
            "reports": [e.record for e in parts.reports] or None,
            "progress": parts.progress,
            "floor": parts.floor,
        }
        try:
            answer = self.client.batch_barrier(
                self.job,
                batch_id,
                start=start,
                end=end,
                query_id=query_id,
                **{k: v for k, v in carried.items() if v is not None},
            )
        except ApiError as exc:
            self._settle(parts, exc.carried)
            raise
        except BaseException:
            self._settle(parts, None)
            raise
        self._settle(parts, getattr(answer, "carried", None))
        return answer

    def _take(self) -> _Parts:
        parts = _Parts()
        if self.reporter is not None:
            parts.reports = self.reporter.take_reports(self.job, MAX_CARRIED_REPORTS)
        if self.listener is not None:
            parts.progress = self.listener.take_progress(self.job)
        if self.offline is not None:
            parts.floor = self.offline.promise_to_carry()
            parts.sent_ms = self.offline.clock.now_ms()
        return parts

    def _settle(self, parts: _Parts, carried: Carried | None) -> None:
        """Each part by its answer: ``carried`` None when the request got none."""
        if self.reporter is not None and parts.reports:
            delivered = carried is not None and carried.reports is not None
            if carried is not None and carried.reports_refused is not None:
                refused = carried.reports_refused
                log.info(
                    "job %s: carried reports refused (%s %s); the outbox delivers them",
                    self.job, refused.status, refused.code,
                )  # fmt: skip
            self.reporter.settle(parts.reports, delivered)
        recorded = carried is not None and bool(carried.progress)
        if self.listener is not None and parts.progress is not None and not recorded:
            self.listener.give_back(self.job, parts.progress)
        grant = carried.grant if carried is not None else None
        if self.offline is not None and parts.floor is not None and grant is not None:
            received = self.offline.clock.now_ms()
            self.offline.carried(parts.floor, grant, parts.sent_ms, received)
