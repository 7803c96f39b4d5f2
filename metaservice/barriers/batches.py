"""A batch asking for its barrier (``POST /api/v1/jobs/{job}/batches/{id}/barrier``).

The one entry for both kinds of job: a new batch is checked
(:mod:`~metaservice.barriers.batch_checks`) and then decided by its kind, a source's
barrier in :mod:`~metaservice.barriers.source_batches`, a derived batch's plan in
:mod:`~metaservice.barriers.derived_plans`; a replayed batch gets the same answer.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from metaservice.barriers import repository as repo
from metaservice.barriers import watermark
from metaservice.barriers.batch_checks import (
    check_batch_order,
    check_query_of,
    lock_job_named,
    refuse_superseded,
)
from metaservice.barriers.derived_plans import check_planned, new_derived_batch
from metaservice.barriers.ranges import batch_view
from metaservice.barriers.schemas import BatchBarrier, BatchRequest
from metaservice.barriers.source_batches import new_source_batch, replay_abandoned
from metaservice.context import Context
from metaservice.models import DERIVED, SOURCE, Job


def batch_barrier(
    session: Session,
    ctx: Context,
    job_name: str,
    batch_id: int,
    request: BatchRequest | None = None,
) -> BatchBarrier:
    """The barrier of a batch; the same answer for a replayed batch."""
    return batch_barrier_of(session, ctx, lock_job_named(session, job_name), batch_id, request)


def batch_barrier_of(
    session: Session,
    ctx: Context,
    job: Job,
    batch_id: int,
    request: BatchRequest | None = None,
) -> BatchBarrier:
    """:func:`batch_barrier` of a job this transaction has just locked
    (``lock_job_named``); the job's row in the session stays as written."""
    request = request or BatchRequest()
    batch, newest = repo.batch_and_newest(session, job.id, batch_id)
    if batch is None:
        check_query_of(job, batch_id, request.query_id, newest)
        if job.kind == SOURCE:
            watermark.hold_shared(session)  # before the facts read S
        facts = repo.new_batch_facts(session, job)
        if job.kind == SOURCE:
            watermark.held(session, facts.watermark)  # read under the lock: kept
        refuse_superseded(job, facts.superseded_by)
        check_batch_order(job, batch_id, newest)
        if job.kind == SOURCE:
            return batch_view(
                session, job, new_source_batch(session, ctx, job, batch_id, request, newest, facts)
            )
        batch, inputs = new_derived_batch(session, ctx, job, batch_id, request, newest, facts)
        repo.touch_job(session, job, ctx.now_ms())
        return batch_view(session, job, batch, inputs)
    else:
        check_query_of(job, batch_id, request.query_id, batch)
        if batch.abandoned:
            replay_abandoned(session, ctx, job, batch, newest)
        elif job.kind == DERIVED:
            check_planned(job, batch, request)
    repo.touch_job(session, job, ctx.now_ms())
    return batch_view(session, job, batch)
