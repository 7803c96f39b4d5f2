"""Where a source job's barrier is decided: its new batches (the barrier clock), the
replay of an abandoned batch, and an operator abandoning a dead driver's batch.

A source barrier is the service's current slot, never below the last barrier issued,
a sealed frontier or the job's own newest batch, and above the watermark S
(:func:`_source_barrier`; S is read under the watermark lock held shared,
:mod:`~metaservice.barriers.watermark`). Offline
claims (:mod:`~metaservice.barriers.offline`) open batches through
:func:`open_source_batch` and :func:`reopen_abandoned` too.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as repo
from metaservice.barriers import watermark
from metaservice.barriers.batch_checks import lock_job_named
from metaservice.barriers.ranges import batch_view
from metaservice.barriers.schemas import BatchBarrier, BatchRequest
from metaservice.context import Context
from metaservice.errors import Conflict, NotFound
from metaservice.models import SOURCE, Batch, ClockState, Job
from metaservice.topology import repository as topo

log = logging.getLogger("metaservice.barriers")


def _next_source_barrier(session: Session, ctx: Context, job: Job, newest: Batch | None) -> int:
    watermark.hold_shared(session)  # before S is read (by the next statement)
    clock = session.execute(
        select(ClockState.last_issued, ClockState.watermark).where(ClockState.id == 1)
    ).one()
    s = watermark.held(session, clock.watermark)  # read under the lock: kept
    return _source_barrier(ctx, job, newest, clock.last_issued, s)


def _source_barrier(
    ctx: Context, job: Job, newest: Batch | None, last_issued: int, watermark_s: int
) -> int:
    # Never below the last issued barrier (clock stepped back after a restart), never
    # at or below a sealed frontier or the watermark S (a reader may already have
    # taken that slot as complete: this replica's clock may be behind the one that
    # raised S) and never below the job's own newest batch (which an offline claim
    # may have put ahead of the service's clock: only this job's barriers follow it).
    own = newest.barrier if newest is not None else 0
    return max(
        ctx.now_slot(),
        last_issued,
        job.frontier + ctx.interval,
        watermark_s + ctx.interval,
        own,
    )


def new_source_batch(
    session: Session,
    ctx: Context,
    job: Job,
    batch_id: int,
    request: BatchRequest,
    newest: Batch | None,
    facts: repo.NewBatchFacts,
) -> Batch:
    """:func:`open_source_batch` for a batch asking for its barrier: the clock and the
    output count come from ``facts``, and the batch and the job's row are written as two
    plain statements. The batch returned is not in the session."""
    barrier = _source_barrier(ctx, job, newest, facts.last_issued, facts.watermark)
    raised = min(barrier, ctx.now_slot())  # see open_source_batch
    if raised > facts.last_issued:  # else the UPDATE would change nothing
        repo.raise_clock(session, raised)
    now = ctx.now_ms()
    batch = Batch(
        job_id=job.id,
        batch_id=batch_id,
        barrier=barrier,
        committed=False,
        created_ms=now,
        outputs=facts.outputs,
        query_id=request.query_id,
    )
    repo.insert_open_batch(session, job, batch, now)
    return batch


def open_source_batch(
    session: Session,
    ctx: Context,
    job: Job,
    batch_id: int,
    barrier: int,
    query_id: str | None = None,
) -> Batch:
    """A new open batch of a source job at ``barrier`` (it holds the job's frontier below
    it); written with the transaction's other changes (one flush)."""
    # A claim ahead of the service's clock moves no other job's barriers.
    repo.raise_last_issued(session, min(barrier, ctx.now_slot()))
    batch = Batch(
        job_id=job.id,
        batch_id=batch_id,
        barrier=barrier,
        committed=False,
        created_ms=ctx.now_ms(),
        outputs=topo.count_outputs(session, job.id),
        query_id=query_id,
    )
    session.add(batch)
    job.open_batches += 1
    return batch


def replay_abandoned(
    session: Session, ctx: Context, job: Job, batch: Batch, newest: Batch | None
) -> None:
    """A source driver replays a batch an operator abandoned: it gets a new barrier, past
    every slot readers took as complete meanwhile (see :func:`reopen_abandoned`)."""
    if job.kind != SOURCE:
        raise Conflict(
            f"batch {batch.batch_id} of job '{job.name}' was abandoned",
            field="batch_id",
            code="batch_abandoned",
        )
    reopen_abandoned(session, ctx, job, batch, _next_source_barrier(session, ctx, job, newest))


def reopen_abandoned(session: Session, ctx: Context, job: Job, batch: Batch, barrier: int) -> None:
    """The abandoned batch runs again at ``barrier`` (a replay asking for its barrier, or
    an offline claim): it holds the frontier again and reports the outputs it was opened
    with. The abandon stays final for the barrier the batch held, at or below what readers
    took as complete: nothing is ever recorded there (:func:`.reports.fence`); 409
    ``batch_abandoned`` when ``barrier`` is not above the job's frontier."""
    if barrier <= job.frontier:
        raise Conflict(
            f"batch {batch.batch_id} of job '{job.name}' was abandoned at barrier "
            f"{batch.barrier}, and barrier {barrier} is not past the job's frontier "
            f"{job.frontier}: readers took it as complete, so the batch cannot run there. "
            f"Replay it with a new barrier (POST /api/v1/jobs/{job.name}/batches/"
            f"{batch.batch_id}/barrier)",
            field="barrier",
            code="batch_abandoned",
        )
    log.info(
        "job %s batch %d was abandoned at barrier %d; replayed at %d",
        job.name, batch.batch_id, batch.barrier, barrier,
    )  # fmt: skip
    repo.raise_last_issued(session, min(barrier, ctx.now_slot()))  # see open_source_batch
    batch.barrier = barrier
    batch.abandoned = False
    batch.outputs = repo.count_outputs_of_batch(session, job.id, batch.batch_id)
    job.open_batches += 1
    session.flush()


def abandon_batch(session: Session, ctx: Context, job_name: str, batch_id: int) -> BatchBarrier:
    """An operator gives up a dead source driver's open batch (idempotent).

    The job's frontier no longer waits for it; what the batch reported for some of
    its outputs is forgotten (no version ever named it: the frontier stayed below
    it), and its late commit reports are refused. A replay of the batch by a
    restarted driver gets a new barrier.
    """
    job = lock_job_named(session, job_name)
    batch = repo.get_batch(session, job.id, batch_id)
    if batch is None:
        raise NotFound(
            f"job '{job.name}' has no batch {batch_id}", field="batch_id", code="unknown_batch"
        )
    if job.kind != SOURCE:
        raise Conflict(
            f"job '{job.name}' is a derived job: an open batch of it holds back only its own "
            "outputs, and its replay reads the same inputs again. Restart the job, or delete "
            f"it (DELETE /api/v1/jobs/{job.name}) if it will never run again",
            field="job",
            code="not_source",
        )
    if batch.committed:
        raise Conflict(
            f"batch {batch_id} of job '{job.name}' is committed; only an open batch can be "
            "abandoned",
            field="batch_id",
            code="batch_committed",
        )
    if not batch.abandoned:
        batch.abandoned = True
        repo.delete_batch_commits(session, job.id, batch_id)
        job.open_batches -= 1
        if job.open_batches == 0:
            job.frontier = max(job.frontier, fr.sealable_slot(ctx, job))
        log.warning("job %s batch %d (barrier %d) abandoned", job.name, batch_id, batch.barrier)
    session.flush()
    return batch_view(session, job, batch)
