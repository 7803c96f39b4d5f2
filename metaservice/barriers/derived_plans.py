"""Where a derived job's next batch is planned: next-barrier (the end every barrier
source of the job agrees on), its long poll's read-only look, and a new derived batch
checked against the plan the MetaService handed out.

A plan (``BatchPlan``) is fixed once ready: the same start always gets the same end.
Choosing its end advances idle upstream jobs first (:mod:`~metaservice.barriers.idle`)
and aligns it to the barriers the derived writers committed at
(:mod:`~metaservice.barriers.frontiers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as repo
from metaservice.barriers.batch_checks import check_superseded, lock_job_named
from metaservice.barriers.idle import advance_idle_many, could_advance
from metaservice.barriers.schemas import BatchRequest, NextBarrier
from metaservice.context import Context
from metaservice.errors import Conflict, Invalid
from metaservice.models import DERIVED, SOURCE, Batch, BatchPlan, Job, Table
from metaservice.topology import repository as topo


def _derived_start(job: Job, newest: Batch | None) -> int:
    """Where a derived job's next batch starts: the end of its newest batch when that
    batch's report is still on its way (committed to Iceberg, reported from the
    outbox), else the job's frontier."""
    if newest is not None and not newest.committed:
        return max(job.frontier, newest.barrier)
    return job.frontier


def new_derived_batch(
    session: Session,
    ctx: Context,
    job: Job,
    batch_id: int,
    request: BatchRequest,
    newest: Batch | None,
    facts: repo.NewBatchFacts,
) -> tuple[Batch, list[Table]]:
    """The new batch and the inputs it reads."""
    if request.end is None:
        # A caller that does not say what it planned gets the plan after the frontier.
        still_open = repo.open_batch(session, job.id)
        if still_open is not None:
            raise Conflict(
                f"batch {still_open.batch_id} of job '{job.name}' (barrier "
                f"{still_open.barrier}) is not committed yet; report its commit before "
                f"starting batch {batch_id}",
                field="batch_id",
                code="batch_still_open",
            )
        plan, _ = _plan(session, ctx, job, job.frontier, source=None)
        if plan.barrier is None:
            raise Conflict(
                f"no new barrier for job '{job.name}': its inputs have not advanced past "
                f"barrier {job.frontier}",
                code="no_barrier_ready",
            )
    else:
        plan = _planned(session, job, batch_id, request, newest)
    assert plan.barrier is not None
    batch = Batch(
        job_id=job.id,
        batch_id=batch_id,
        barrier=plan.barrier,
        start_barrier=plan.after,
        committed=False,
        created_ms=ctx.now_ms(),
        outputs=facts.outputs,
        query_id=request.query_id,
    )
    repo.insert_batch(session, batch)
    inputs = topo.input_tables(session, job.id)
    repo.add_batch_inputs(session, job.id, batch_id, [t.id for t in inputs])
    return batch, inputs


def _planned(
    session: Session, job: Job, batch_id: int, request: BatchRequest, newest: Batch | None
) -> BatchPlan:
    """The plan of the batch Spark says it planned, (start, end]; 409 when it is not one
    the MetaService handed out."""
    end = request.end
    assert end is not None
    start = _derived_start(job, newest)
    if (request.start is not None and request.start == end) or (
        request.start is None and end == start
    ):
        raise Conflict(
            f"batch {batch_id} of job '{job.name}' ends where it starts ({end}): nothing to "
            "run, skip it",
            field="end",
            code="empty_range",
        )
    if end <= job.frontier:
        # The MetaService advanced the idle job past this planned batch: its inputs
        # did not change there, and a snapshot stamped at or below the frontier would
        # change versions already handed out.
        raise Conflict(
            f"batch {batch_id} of job '{job.name}' ends at {end}, which the MetaService "
            f"already advanced the job past (frontier {job.frontier}): none of its inputs "
            "changed there, nothing to run, skip it",
            field="end",
            code="empty_range",
        )
    planned_start = start if request.start is None else request.start
    if newest is not None and not newest.committed and newest.barrier != planned_start:
        raise Conflict(
            f"batch {newest.batch_id} of job '{job.name}' (barrier {newest.barrier}) is not "
            f"committed yet and batch {batch_id} does not start where it ends",
            field="batch_id",
            code="batch_still_open",
        )
    # A batch never starts before the end of the job's newest batch.
    earliest = newest.barrier if newest is not None else 0
    if request.start is not None:
        plan = repo.get_plan(session, job.id, request.start)
        ok = plan is not None and plan.barrier == end and request.start >= earliest
    else:
        plan = repo.plan_ending_at(session, job.id, end, earliest)
        ok = plan is not None
    if not ok or plan is None:
        raise Conflict(
            f"Spark planned batch {batch_id} of job '{job.name}' as ({request.start}, {end}], "
            f"but the MetaService handed out no such batch (the job's batches start at "
            f"{start}). Its barrier sources disagree with the MetaService: was the "
            f"checkpoint restored from an older copy, or does another query run the job?",
            field="end",
            code="batch_plan_mismatch",
        )
    return plan


def check_planned(job: Job, batch: Batch, request: BatchRequest) -> None:
    """A replayed derived batch must be the batch the MetaService recorded."""
    if request.end is None:
        return
    if batch.barrier != request.end or (
        request.start is not None and batch.start_barrier != request.start
    ):
        raise Conflict(
            f"batch {batch.batch_id} of job '{job.name}' is recorded as "
            f"({batch.start_barrier}, {batch.barrier}], but Spark planned it as "
            f"({request.start}, {request.end}]",
            field="end",
            code="batch_plan_mismatch",
        )


def next_barrier(
    session: Session,
    ctx: Context,
    job_name: str,
    after: int | None = None,
    source: str | None = None,
) -> NextBarrier:
    """The end of the derived batch that starts after ``after`` (default: the job's
    frontier), which every barrier source of the job reports as its latest offset.

    Once ready, the same start always gets the same end, whatever reports land in
    between. "Not ready" is kept for the rest of the round: until a ``source`` that
    was told so asks again (Spark's next trigger), so the barrier sources of one
    trigger never disagree.
    """
    return next_barrier_round(session, ctx, job_name, after, source)[0]


def next_barrier_round(
    session: Session,
    ctx: Context,
    job_name: str,
    after: int | None = None,
    source: str | None = None,
) -> tuple[NextBarrier, bool]:
    """:func:`next_barrier`, and whether a "not ready" answer was held from an earlier
    call of the same round (asking again in this round cannot change it)."""
    job = lock_job_named(session, job_name)
    start = _checked_start(session, job, after)
    plan, held = _plan(session, ctx, job, start, source)
    target = plan.barrier
    answer = NextBarrier(
        job=job.name,
        barrier=target if target is not None else start,
        start_barrier=start,
        ready=target is not None and target > start,
    )
    repo.touch_job(session, job, ctx.now_ms())  # last: written with the plan's changes
    return answer, held


class Readiness(NamedTuple):
    """What a read-only look at a derived job's next batch found (see
    :func:`next_barrier_readiness`)."""

    answer: NextBarrier | None  # the plan is fixed: the answer, read without a lock
    job_id: int
    stale: bool  # the job's last-seen time is more than an interval old
    writers: tuple[str, ...]  # the jobs writing its inputs: what a long poll waits on
    worth_a_round: bool  # the locking round may fix a target now, or must record the source
    idle_sources: bool  # an input writer is a source with no open batch (moves with the clock)


def next_barrier_readiness(
    session: Session,
    ctx: Context,
    job_name: str,
    after: int | None = None,
    source: str | None = None,
) -> Readiness:
    """:func:`next_barrier_round` as a read: the answer when the plan for the start is
    already fixed (the same as the round gives, with the same refusals), else whether
    running the round now could answer anything but "not ready".

    A long poll asks this first and takes the round's row locks only when it is worth
    it: hundreds of polls re-running the round kept the pool's connections queued on
    the locks of the rows that sources' barriers and reports need (issue 13). A "no"
    here is only an estimate: frontiers move with the clock and other replicas' writes,
    so the poll looks again, and runs the round before it answers "not ready".
    """
    job = topo.require_job(session, job_name)
    start = _checked_start(session, job, after)
    plan = repo.get_plan(session, job.id, start)  # read by _checked_start: no statement
    seen = job.last_seen_ms
    stale = seen is None or seen < ctx.now_ms() - ctx.interval
    if plan is not None and plan.barrier is not None:
        answer = NextBarrier(
            job=job.name, barrier=plan.barrier, start_barrier=start, ready=plan.barrier > start
        )
        return Readiness(answer, job.id, stale, (), False, False)
    inputs = topo.input_tables(session, job.id)
    writers = topo.jobs_by_ids(session, sorted({t.writer_id for t in inputs if t.writer_id}))
    names = tuple(sorted(w.name for w in writers.values()))
    idle = any(w.kind == SOURCE and w.open_batches == 0 for w in writers.values())
    worth = _worth_a_round(session, ctx, job, start, plan, source, inputs, writers)
    return Readiness(None, job.id, stale, names, worth, idle)


def _worth_a_round(
    session: Session,
    ctx: Context,
    job: Job,
    start: int,
    plan: BatchPlan | None,
    source: str | None,
    inputs: Sequence[Table],
    writers: dict[int, Job],
) -> bool:
    """Whether :func:`_plan` may answer other than a plain "not ready" now: the read-only
    twin of its decision (frontiers as sealing would make them; an upstream derived job
    that might be advanced counts as a maybe)."""
    if plan is not None and source is not None and source not in plan.asked.split("\n"):
        return True  # held for the round: the round records who asked
    base = max(start, job.frontier)
    if base > start:
        return True
    if not inputs or any(t.writer_id is None for t in inputs):
        return False
    found = list(writers.values())
    derived = [w for w in found if w.kind == DERIVED]
    if derived and could_advance(session, ctx, derived):
        return True
    limit = min(fr.frontiers(session, ctx, found, sealed_only=False).values())
    return _aligned_target(session, ctx, derived, base, limit) is not None


def touch_job_id(session: Session, ctx: Context, job_id: int) -> None:
    """The job was seen now (a long poll answered from a fixed plan, without the round)."""
    repo.touch_job_id(session, job_id, ctx.now_ms())


def _checked_start(session: Session, job: Job, after: int | None) -> int:
    """The start of the batch a next-barrier call asks about, with its refusals: not a
    derived job (422), superseded (409), a start the job never had (409)."""
    if job.kind != DERIVED:
        raise Invalid(
            f"job '{job.name}' has no table inputs; a source job's batches get their "
            f"barriers from POST /api/v1/jobs/{job.name}/batches/{{batch_id}}/barrier",
            field="job",
            code="not_derived",
        )
    check_superseded(session, job)
    if after is None:
        return job.frontier
    _check_start(session, job, after)
    return after


def _check_start(session: Session, job: Job, after: int) -> None:
    if repo.get_plan(session, job.id, after) is not None:
        return
    newest = repo.newest_batch(session, job.id)
    known = max(job.frontier, newest.barrier if newest is not None else 0)
    earliest = newest.barrier if newest is not None else 0
    if after > known or after < earliest:
        raise Conflict(
            f"job '{job.name}' has no batch ending at {after}: its batches end at {earliest} "
            f"and its frontier is {job.frontier}. Was its Spark checkpoint restored from an "
            "older copy, or does another query run the job?",
            field="after",
            code="unknown_start",
        )


def _plan(
    session: Session, ctx: Context, job: Job, after: int, source: str | None
) -> tuple[BatchPlan, bool]:
    """The job's plan for the batch after ``after``: fixed once ready (see next_barrier),
    and whether its "not ready" was held for the round rather than decided now."""
    plan = repo.get_plan(session, job.id, after)
    if plan is not None and plan.barrier is not None:
        return plan, False
    asked = set(plan.asked.split("\n")) - {""} if plan is not None else set()
    if plan is not None and source is not None and source not in asked:
        plan.asked = "\n".join(sorted(asked | {source}))
        return plan, True  # the same round: still not ready
    # Spark behind the frontier of an idle job the MetaService advanced reads the
    # (empty) rest of the way up to it.
    base = max(after, job.frontier)
    target = _choose_target(session, ctx, job, base)
    if target is None and base > after:
        target = base
    if plan is None:
        plan = BatchPlan(job_id=job.id, after=after, created_ms=ctx.now_ms())
        session.add(plan)
    plan.barrier = target
    plan.asked = source or ""
    if after == job.frontier:
        job.pending_target = target
    return plan, False


def _choose_target(session: Session, ctx: Context, job: Job, start: int) -> int | None:
    inputs = topo.input_tables(session, job.id)
    if any(t.writer_id is None for t in inputs):
        return None  # an input nobody writes has no frontier yet
    writers = list(topo.jobs_by_ids(session, [t.writer_id for t in inputs if t.writer_id]).values())
    derived = [w for w in writers if w.kind == DERIVED]
    advance_idle_many(session, ctx, derived)  # locks upstream jobs before sources
    fr.seal_sources(session, ctx, writers)
    limit = min(fr.frontiers(session, ctx, writers).values())
    return _aligned_target(session, ctx, derived, start, limit)


def _aligned_target(
    session: Session, ctx: Context, derived: Sequence[Job], start: int, limit: int
) -> int | None:
    """The end of the batch after ``start`` (:func:`fr.aligned_target`), among the
    barriers every derived writer committed at in ``(start, limit]``."""
    candidates = None
    if derived:
        sets = [set(repo.committed_barriers(session, w.id, start, limit)) for w in derived]
        candidates = sorted(set.intersection(*sets))
    return fr.aligned_target(start, limit, ctx.interval, candidates)
