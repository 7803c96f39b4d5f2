"""One request per batch: a barrier request carrying what the job would otherwise send
on its own (``POST /jobs/{job}/batches/{id}/barrier`` with ``reports``, ``progress``,
``floor``).

A source job's request for batch k+1's barrier carries batch k's commit reports, the
listener's progress event and the offline-grant promise. Each part is applied as its
own request would apply it and answered on its own (:class:`.schemas.Carried`): a
refused part refuses nothing else, and the barrier is decided as if the request
carried nothing, synchronously and before the batch commits (it is what catches a
reset query or a second driver). All parts run in the barrier's transaction, in the
order their own requests would have come: the reports, the barrier, the progress, the
promise. A part's refusal is raised by its checks before it writes anything (a report
request's checks all read first, see :mod:`.reports`), so catching it leaves the
transaction holding only the other parts' writes.

When the barrier itself is refused, its transaction is rolled back as before, and the
other parts are applied on their own in a second one (:func:`parts_only`), answered
beside the error. The job's outbox stays the durable store: a report the answer does
not acknowledge is delivered again from there (reports are idempotent).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from metaservice.barriers import batches, offline, reports
from metaservice.barriers.batch_checks import lock_job_named
from metaservice.barriers.schemas import (
    BatchRequest,
    Carried,
    CarriedBatchBarrier,
    PartRefused,
)
from metaservice.context import Context
from metaservice.errors import Invalid, ServiceError, TooLarge
from metaservice.models import Job
from metaservice.topology import service as topology


def barrier_carrying(
    session: Session, ctx: Context, job: str, batch_id: int, request: BatchRequest
) -> CarriedBatchBarrier:
    """The batch's barrier, with each carried part applied and answered on its own; a
    refused barrier raises (see :func:`parts_only`)."""
    carried = Carried()
    _reports(session, ctx, job, request, carried)
    locked = lock_job_named(session, job)
    answer = batches.batch_barrier_of(session, ctx, locked, batch_id, request)
    _after_barrier(session, ctx, job, request, carried, locked)
    return CarriedBatchBarrier(**dict(answer), carried=carried)


def parts_only(session: Session, ctx: Context, job: str, request: BatchRequest) -> Carried:
    """The carried parts of a request whose barrier was refused, applied on their own."""
    carried = Carried()
    _reports(session, ctx, job, request, carried)
    _after_barrier(session, ctx, job, request, carried)
    return carried


def moved(carried: Carried) -> bool:
    """Whether the parts may have moved the job's frontier (a completed batch, a floor)."""
    done = carried.reports is not None and any(r.batch_committed for r in carried.reports.results)
    return done or carried.grant is not None


def _reports(
    session: Session, ctx: Context, job: str, request: BatchRequest, carried: Carried
) -> None:
    if request.reports is None:
        return

    def record() -> None:
        assert request.reports is not None
        most = ctx.settings.max_commits_per_request
        if len(request.reports) > most:
            raise TooLarge(
                f"{len(request.reports)} reports in one request; at most {most}", field="reports"
            )
        for i, report in enumerate(request.reports):
            if report.job != job:
                # The route checked the caller's scope for the job it names, and no other.
                raise Invalid(
                    f"a barrier request of job '{job}' carries a report of job "
                    f"'{report.job}'; report other jobs' commits with POST /commits/batch",
                    field=f"reports.{i}.job",
                    code="other_job",
                )
        carried.reports = reports.report_commits(
            session, ctx, request.reports, field_prefix="reports."
        )

    carried.reports_refused = _refusal(record)


def _after_barrier(
    session: Session,
    ctx: Context,
    job: str,
    request: BatchRequest,
    carried: Carried,
    locked: Job | None = None,
) -> None:
    """The progress and the promise; ``locked``: the job's row as the barrier locked
    and left it, which they take instead of reading it again."""
    if request.progress is not None:
        progress = request.progress

        def record_progress() -> None:
            topology.record_event(session, ctx, job, progress, locked)
            carried.progress = True

        carried.progress_refused = _refusal(record_progress)
    if request.floor is not None:
        floor = request.floor

        def renew() -> None:
            carried.grant = offline.grant(session, ctx, job, floor, locked)

        carried.grant_refused = _refusal(renew)


def _refusal(apply: Callable[[], None]) -> PartRefused | None:
    """Run one part; its refusal as an answer (nothing of the part is written: each
    part's checks raise before it writes)."""
    try:
        apply()
    except ServiceError as exc:
        return PartRefused(status=exc.status, code=exc.code, message=exc.message, field=exc.field)
    return None
