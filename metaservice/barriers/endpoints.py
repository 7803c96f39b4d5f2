from __future__ import annotations

import random
import time
from functools import partial

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from metaservice.auth.schemas import Role
from metaservice.auth.service import Caller, check_job_scope
from metaservice.barriers import (
    batches,
    carried,
    derived_plans,
    offline,
    ranges,
    reports,
    source_batches,
)
from metaservice.barriers.schemas import (
    MAX_SIGNED_64,
    BatchBarrier,
    BatchRequest,
    Carried,
    CarriedBatchBarrier,
    ClaimBatch,
    ClaimBatchResult,
    CommitBatch,
    CommitBatchResult,
    CommitReport,
    CommitResult,
    InputRange,
    NextBarrier,
    OfflineGrant,
    OfflineGrantRequest,
)
from metaservice.db import POLL, URGENT
from metaservice.deps import Services, caller, json_response, require, services, services_of
from metaservice.errors import Invalid, ServiceError, TooLarge
from metaservice.metrics import BARRIERS, COMMITS
from metaservice.schemas_common import error_responses

# How long a next-barrier long poll may wait, and how often it looks again meanwhile
# when nothing it waits on moved on this replica (jittered by up to a fifth).
MAX_NEXT_BARRIER_WAIT_MS = 30_000
NEXT_BARRIER_RECHECK_S = 0.5

router = APIRouter(tags=["barriers"], dependencies=[require(Role.READER)])
# The hot requests of running jobs (a batch's barrier, its report, next-barrier): the
# writer role only (it includes the reader's), async, the services taken from the
# request, and the answer serialised once by its own model. Each dependency FastAPI
# solves, a thread-pool hop through anyio and a validation of the returned model cost
# a running job's requests as much as their SQL (issue 13).
writes = APIRouter(tags=["barriers"], dependencies=[require(Role.WRITER)])


@writes.post(
    "/jobs/{job}/batches/{batch_id}/barrier",
    response_model=CarriedBatchBarrier,
    responses=error_responses(400, 404, 409),
)
async def batch_barrier(
    http: Request,
    job: str,
    batch_id: int = Path(ge=0, le=MAX_SIGNED_64),
    request: BatchRequest | None = Body(
        None,
        description="What the caller knows of the batch: the offsets Spark planned "
        "(derived jobs), the Spark query running it, or a barrier a source job holding "
        "an offline grant gave it while the MetaService was unreachable",
    ),
) -> Response:
    """The barrier of a Spark batch; asking again for the same batch gives the same answer.

    Source jobs get the current slot of the barrier clock. Derived jobs get the end
    the MetaService planned after the batch's start and, per input, the snapshot
    range (from, to] the batch reads; with `start`/`end`, a batch Spark planned
    otherwise is refused (409 `batch_plan_mismatch`, or `empty_range` for a batch
    with nothing to read). With `query_id`, a batch of another Spark query than the
    job's earlier batches is refused (409 `query_reset`). With `barrier`, a source
    job claims the barrier it chose offline (409 when the claim contradicts what is
    recorded).

    One request per batch: the request may carry the job's earlier commit `reports`
    (batch k's on batch k+1's request), its listener `progress` event and a source
    job's offline-grant promise (`floor`). Each is applied as its own request would
    apply it and answered on its own in `carried` (a refused part is named there with
    its error, and refuses nothing else); with a refused barrier, the error's body
    holds `carried` too.
    """
    s = services_of(http)
    claimed = request.barrier if request is not None else None
    if request is not None and request.carries():
        if claimed is not None:
            raise Invalid(
                "an offline claim carries nothing else: its outbox delivers the batch's "
                "reports after it (POST /commits/batch)",
                field="barrier",
                code="claim_carries",
            )
        return await _barrier_carrying(s, job, batch_id, request)
    if claimed is None:
        result = await s.db.write_async(
            lambda session: batches.batch_barrier(session, s.ctx, job, batch_id, request), URGENT
        )
    else:
        query_id = request.query_id if request is not None else None
        result = await s.db.write_async(
            lambda session: offline.claim(session, s.ctx, job, batch_id, claimed, query_id), URGENT
        )
    BARRIERS.inc()
    if result.start_barrier is None:
        s.changes.notify([job])  # a source's new batch may move its frontier
    return json_response(result)


async def _barrier_carrying(
    s: Services, job: str, batch_id: int, request: BatchRequest
) -> Response:
    """:func:`batch_barrier` of a request carrying parts (see ``barriers/carried.py``)."""
    try:
        result = await s.db.write_async(
            lambda session: carried.barrier_carrying(session, s.ctx, job, batch_id, request),
            URGENT,
        )
    except ServiceError as refusal:
        # The barrier is refused; its transaction rolled back. The other parts are
        # applied on their own, and answered beside the error.
        parts = await s.db.write_async(
            lambda session: carried.parts_only(session, s.ctx, job, request), URGENT
        )
        _count_carried(parts)
        if carried.moved(parts):
            s.changes.notify([job])
        body = {**refusal.to_dict(), "carried": parts.model_dump(mode="json")}
        return JSONResponse(body, status_code=refusal.status, headers=refusal.headers)
    BARRIERS.inc()
    assert result.carried is not None
    _count_carried(result.carried)
    if result.start_barrier is None or carried.moved(result.carried):
        s.changes.notify([job])  # a new batch, a completed one or a floor may move frontiers
    return json_response(result)


def _count_carried(parts: Carried) -> None:
    if parts.reports is not None:
        COMMITS.labels(result="recorded").inc(parts.reports.recorded)
        COMMITS.labels(result="duplicate").inc(parts.reports.duplicates)


@router.post(
    "/jobs/{job}/claims",
    response_model=ClaimBatchResult,
    responses=error_responses(400, 404, 409, 413),
    dependencies=[require(Role.WRITER)],
)
def claim_barriers(
    job: str,
    body: ClaimBatch = Body(description="Barriers the job gave its batches offline"),
    s: Services = Depends(services),
) -> ClaimBatchResult:
    """Claim the barriers a source job gave many batches while offline, in batch order,
    all or nothing: the same checks as a claim through `.../barrier`, one transaction."""
    _check_count(s, len(body.claims), "claims", field="claims")
    results = s.db.write(lambda session: offline.claim_many(session, s.ctx, job, body.claims))
    BARRIERS.inc(len(results))
    return ClaimBatchResult(results=results)


@writes.put(
    "/jobs/{job}/offline-grant",
    response_model=OfflineGrant,
    responses=error_responses(400, 404),
)
async def take_offline_grant(http: Request, job: str, body: OfflineGrantRequest) -> Response:
    """Take or renew a source job's offline grant (the job reporting in).

    The job promises never to give itself a barrier below `floor`; its frontier
    stays below the returned `floor` until it reports in again or releases the grant.
    """
    # Urgent: a renewal late by k seconds holds the job's frontier k slots behind the
    # clock (its floor is the slot the job promised when it sent it), and every
    # derived job reading its tables with it.
    s = services_of(http)
    grant = await s.db.write_async(
        lambda session: offline.grant(session, s.ctx, job, body.floor), URGENT
    )
    s.changes.notify([job])  # a new floor may move the job's frontier
    return json_response(grant)


@router.delete(
    "/jobs/{job}/offline-grant",
    status_code=204,
    responses=error_responses(404),
    dependencies=[require(Role.WRITER)],
)
def release_offline_grant(job: str, s: Services = Depends(services)) -> None:
    """Release a source job's offline grant (idempotent): its frontier follows the clock again.

    Only for a job that has stopped or reported every barrier it claimed: claims
    still on their way are refused afterwards.
    """
    s.db.write(lambda session: offline.release(session, s.ctx, job))
    s.changes.notify_threadsafe([job])


# A GET, but it fixes the job's next target: a writer's call.
@writes.get(
    "/jobs/{job}/next-barrier",
    response_model=NextBarrier,
    responses=error_responses(400, 404, 409),
)
async def next_barrier(
    http: Request,
    job: str,
    after: int | None = Query(
        None,
        ge=0,
        le=MAX_SIGNED_64,
        description="The batch's start offset (default: the job's frontier); the same "
        "start always gets the same end once one is ready",
    ),
    source: str | None = Query(
        None,
        min_length=1,
        max_length=400,
        description="The input table of the barrier source asking; keeps a 'not ready' "
        "answer until that source asks again, so the sources of one trigger agree",
    ),
    wait_ms: int = Query(
        0,
        ge=0,
        le=MAX_NEXT_BARRIER_WAIT_MS,
        description="Long poll: when no batch is ready, wait up to this long for one "
        "before answering 'not ready' (a 'not ready' held for the round is answered at once)",
    ),
) -> Response:
    """The end of a derived job's batch that starts after `after`: the offset every
    barrier source of the job reports as its latest."""
    s = services_of(http)
    if wait_ms == 0:
        answer, _ = await s.db.write_async(
            lambda session: derived_plans.next_barrier_round(session, s.ctx, job, after, source),
            POLL,
        )
        return json_response(answer)
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        # Look without locks first: a fixed plan is answered as it stands, and the
        # locking round runs only when it may find a target (or must record who asked).
        seen = s.changes.mark()
        look = await s.db.read_async(
            lambda session: derived_plans.next_barrier_readiness(
                session, s.ctx, job, after, source
            ),
            POLL,
        )
        if look.answer is not None:
            if look.stale:
                touch = partial(derived_plans.touch_job_id, ctx=s.ctx, job_id=look.job_id)
                await s.db.write_async(touch, POLL)
            return json_response(look.answer)
        left = deadline - time.monotonic()
        if look.worth_a_round or left <= 0:
            answer, held = await s.db.write_async(
                lambda session: derived_plans.next_barrier_round(
                    session, s.ctx, job, after, source
                ),
                POLL,
            )
            if answer.ready or held or left <= 0:
                return json_response(answer)
        # Wait for an input's writer to move on this replica (a report, a source's new
        # batch), without holding a thread or a connection; look again meanwhile for
        # what is not notified: other replicas, and the clock closing a slot, which
        # moves an idle source's frontier.
        pause = NEXT_BARRIER_RECHECK_S * (1 + random.random() / 5)
        if look.idle_sources:
            interval = s.ctx.interval
            pause = min(pause, (interval - s.ctx.now_ms() % interval + 5) / 1000)
        await s.changes.wait(look.writers, since=seen, timeout=min(left, pause))


@router.get(
    "/jobs/{job}/ranges",
    response_model=list[InputRange],
    responses=error_responses(400, 404, 409),
)
def input_ranges(
    job: str,
    after: int = Query(ge=0, le=MAX_SIGNED_64, description="Exclusive start barrier"),
    to: int = Query(ge=0, le=MAX_SIGNED_64, description="Inclusive end barrier"),
    s: Services = Depends(services),
) -> list[InputRange]:
    """What a derived batch (after, to] reads from each input: the snapshots at both
    barriers by the MetaService's mapping (409 `not_final` while `to` is beyond an
    input's frontier)."""
    return s.db.read(lambda session: ranges.input_ranges(session, s.ctx, job, after, to))


@router.post(
    "/jobs/{job}/batches/{batch_id}/abandon",
    response_model=BatchBarrier,
    responses=error_responses(400, 404, 409),
    dependencies=[require(Role.ADMIN)],
)
def abandon_batch(
    job: str,
    batch_id: int = Path(ge=0, le=MAX_SIGNED_64),
    s: Services = Depends(services),
) -> BatchBarrier:
    """Give up a dead source driver's open batch (admin; idempotent): the job's tables
    no longer wait for it, and its late commit reports are refused (409
    `batch_abandoned`). A restarted driver replaying the batch gets a new barrier."""
    return s.db.write(lambda session: source_batches.abandon_batch(session, s.ctx, job, batch_id))


@writes.post(
    "/commits",
    response_model=CommitResult,
    responses=error_responses(400, 404, 409, 413),
)
async def report_commit(
    http: Request, report: CommitReport, who: Caller = Depends(caller)
) -> Response:
    """Report that a job's batch committed a snapshot (idempotent; 409 on a conflicting report)."""
    check_job_scope(who, report.job)
    s = services_of(http)
    result = await s.db.write_async(
        lambda session: reports.report_commits(session, s.ctx, [report]), URGENT
    )
    COMMITS.labels(result=result.results[0].status).inc()
    if result.results[0].batch_committed:
        s.changes.notify([report.job])
    return json_response(result.results[0])


@writes.post(
    "/commits/batch",
    response_model=CommitBatchResult,
    responses=error_responses(400, 404, 409, 413),
)
async def report_commits(
    http: Request,
    body: CommitBatch = Body(description="Many reports; each is idempotent on its own"),
    who: Caller = Depends(caller),
) -> Response:
    """Report many commits at once, all or nothing: one bad report refuses the request."""
    s = services_of(http)
    _check_count(s, len(body.commits), "reports", field="commits")
    for i, report in enumerate(body.commits):
        check_job_scope(who, report.job, field=f"commits.{i}.job")
    result = await s.db.write_async(
        lambda session: reports.report_commits(
            session, s.ctx, body.commits, field_prefix="commits."
        ),
        URGENT,
    )
    COMMITS.labels(result="recorded").inc(result.recorded)
    COMMITS.labels(result="duplicate").inc(result.duplicates)
    s.changes.notify({r.job for r in result.results if r.batch_committed})
    return json_response(result)


def _check_count(s: Services, count: int, what: str, *, field: str) -> None:
    """Reports or claims in one request are bounded by one setting."""
    most = s.ctx.settings.max_commits_per_request
    if count > most:
        raise TooLarge(f"{count} {what} in one request; at most {most}", field=field)
