"""Rules for handing out barriers and recording commits (the model's core).

Every function runs inside one write transaction and starts by locking the
job's row, which serialises all changes to one job's progress across threads
and replicas.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from graphlib import TopologicalSorter
from typing import NamedTuple

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as repo
from metaservice.barriers.schemas import (
    BatchBarrier,
    BatchRequest,
    CommitBatchResult,
    CommitReport,
    CommitResult,
    InputRange,
    NextBarrier,
)
from metaservice.context import Context
from metaservice.errors import Conflict, Invalid, NotFound
from metaservice.models import DERIVED, SOURCE, Batch, BatchPlan, Job, Table
from metaservice.revisions import repository as revision_repo
from metaservice.topology import repository as topo

log = logging.getLogger("metaservice.barriers")


# A claimed or reported barrier may lie this far ahead of the service's clock (clock
# skew between a job's machine and the service's, after the job's offset correction).
MAX_CLAIM_AHEAD_MS = 60_000


def batch_barrier(
    session: Session,
    ctx: Context,
    job_name: str,
    batch_id: int,
    request: BatchRequest | None = None,
) -> BatchBarrier:
    """The barrier of a batch; the same answer for a replayed batch."""
    request = request or BatchRequest()
    job = lock_job_named(session, job_name)
    batch, newest = repo.batch_and_newest(session, job.id, batch_id)
    if batch is None:
        check_query_of(job, batch_id, request.query_id, newest)
        facts = repo.new_batch_facts(session, job)
        refuse_superseded(job, facts.superseded_by)
        check_batch_order(job, batch_id, newest)
        if job.kind == SOURCE:
            return batch_view(
                session, job, _new_source_batch(session, ctx, job, batch_id, request, newest, facts)
            )
        batch, inputs = _new_derived_batch(session, ctx, job, batch_id, request, newest, facts)
        repo.touch_job(session, job, ctx.now_ms())
        return batch_view(session, job, batch, inputs)
    else:
        check_query_of(job, batch_id, request.query_id, batch)
        if batch.abandoned:
            _reopen_abandoned(session, ctx, job, batch, newest)
        elif job.kind == DERIVED:
            _check_planned(job, batch, request)
    repo.touch_job(session, job, ctx.now_ms())
    return batch_view(session, job, batch)


def lock_job_named(session: Session, name: str) -> Job:
    """The job's row by name, locked (see ``repo.lock_job``), in one statement; 404 for
    an unknown job."""
    job = repo.lock_jobs_by_name(session, [name]).get(name)
    if job is None:
        raise topo.unknown_job(name)
    return job


def check_superseded(session: Session, job: Job) -> None:
    """409 ``superseded`` for a new batch of a job a revision replaces (swapping or
    swapped): its tables are, or are about to be, the revision's. A batch it opened
    before is still answered and its reports are still recorded."""
    refuse_superseded(job, revision_repo.superseding(session, job.name))


def refuse_superseded(job: Job, revision_id: int | None) -> None:
    """:func:`check_superseded` with the superseding revision already read."""
    if revision_id is None:
        return
    raise Conflict(
        f"job '{job.name}' is superseded by revision {revision_id}: its job "
        f"'{job.name}__rev{revision_id}' writes the job's tables from now on, so no new batch "
        f"of '{job.name}' is started. Stop this query; run '{job.name}__rev{revision_id}' "
        "instead",
        field="job",
        code="superseded",
    )


def check_batch_order(job: Job, batch_id: int, newest: Batch | None) -> None:
    """Refuse a new batch below the job's newest (Spark) batch."""
    last = newest.batch_id if newest is not None else None
    if last is not None and batch_id < last:
        raise Conflict(
            f"job '{job.name}' already has batch {last}; batch ids must increase "
            f"(was the Spark checkpoint deleted? register the job under a new name)",
            field="batch_id",
            code="batch_out_of_order",
        )


def check_query(
    session: Session, job: Job, batch_id: int, query_id: str | None, batch: Batch | None
) -> None:
    """Refuse a batch of another Spark query than the one the job's batches came from.

    Spark numbers batches per checkpoint: a reset checkpoint or a query re-created
    under the job's name starts again at 0, and its batches must not be taken for
    replays of the old ones (skipped as committed, or stamped with old barriers).
    """
    if query_id is None:
        return
    check_query_of(job, batch_id, query_id, batch or repo.newest_batch(session, job.id))


def check_query_of(job: Job, batch_id: int, query_id: str | None, known: Batch | None) -> None:
    """:func:`check_query` against a batch already read: the batch itself, or for a new
    batch the job's newest."""
    if query_id is None:
        return
    if known is None or known.query_id is None or known.query_id == query_id:
        return
    raise Conflict(
        f"job '{job.name}' ran batches up to {known.batch_id} in Spark query {known.query_id}, "
        f"but batch {batch_id} comes from query {query_id}: its checkpoint was reset, or a "
        f"new query was started under the job's name. Restart it from its old checkpoint, "
        f"or run the new query as a new job (a new name, writing new tables), or delete the "
        f"job (DELETE /api/v1/jobs/{job.name}) to start its history again",
        field="query_id",
        code="query_reset",
    )


def _next_source_barrier(session: Session, ctx: Context, job: Job, newest: Batch | None) -> int:
    return _source_barrier(ctx, job, newest, repo.clock(session).last_issued)


def _source_barrier(ctx: Context, job: Job, newest: Batch | None, last_issued: int) -> int:
    # Never below the last issued barrier (clock stepped back after a restart), never
    # at or below a sealed frontier (a reader already took that slot as complete) and
    # never below the job's own newest batch (which an offline claim may have put
    # ahead of the service's clock: only this job's barriers follow it).
    own = newest.barrier if newest is not None else 0
    return max(ctx.now_slot(), last_issued, job.frontier + ctx.interval, own)


def _new_source_batch(
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
    barrier = _source_barrier(ctx, job, newest, facts.last_issued)
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


def _reopen_abandoned(
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
    took as complete: nothing is ever recorded there (:func:`fence`); 409
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


def _derived_start(job: Job, newest: Batch | None) -> int:
    """Where a derived job's next batch starts: the end of its newest batch when that
    batch's report is still on its way (committed to Iceberg, reported from the
    outbox), else the job's frontier."""
    if newest is not None and not newest.committed:
        return max(job.frontier, newest.barrier)
    return job.frontier


def _new_derived_batch(
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


def _check_planned(job: Job, batch: Batch, request: BatchRequest) -> None:
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


def advance_idle_many(session: Session, ctx: Context, jobs: Sequence[Job]) -> None:
    """Advance idle derived jobs among these, and their idle derived upstream: when none
    of a job's inputs changed between its frontier and its next target, its outputs are
    already exact there (G2: an idle job never holds readers back). Each advance is
    recorded as a committed batch of the MetaService's own.

    Not while a batch is open: it may commit a snapshot stamped at or below the new
    frontier, which would change a version already handed out. A batch only planned
    (a driver that stopped before running it) does not hold the advance back: asked
    for later, a planned batch that ends at or below the frontier is refused as an
    empty range, so it never commits. The upstream of a job is looked past only when
    the job itself might move (it is locked, has no open batch and every input has a
    writer).

    A job whose row another transaction holds locked (its own batch, report or round,
    or another reader advancing it) is left as it is: its frontier as committed is a
    lower bound, and the next call tries again. Waiting for it made every downstream
    round queue behind its upstream's requests (issue 13). Rows are only ever taken
    with ``SKIP LOCKED`` here (derived jobs, then the sources sealed under them), so
    this never waits for a lock and cannot deadlock.

    Set-based: the upstream closure, its locks, open batches, inputs, writers, the
    sources' seal, the inputs' first changes and the committed barriers the targets
    are aligned to are a statement each for the whole closure; the jobs are then
    advanced in memory, upstream first, each once, as far as it can go (several
    aligned steps for a job far behind), and written together. Walking the upstream
    job by job cost about 12 statements per job and visited a job once per path to
    it: about 1,100 statements for 50 tables of the 1,000-table bench topology.
    """
    wanted = sorted({j.id for j in jobs if j.kind == DERIVED})
    if not wanted:
        return
    locked = repo.try_lock_jobs(session, repo.derived_upstream(session, wanted))
    busy = repo.jobs_with_open_batches(session, list(locked))
    inputs = topo.input_tables_of_jobs(session, sorted(set(locked) - busy))
    writer_ids = {t.writer_id for ts in inputs.values() for t in ts if t.writer_id is not None}
    writers: dict[int, Job] = {
        **topo.jobs_by_ids(session, sorted(writer_ids - set(locked))),
        **locked,
    }
    # The jobs that might move: from the wanted ones up through jobs that might move
    # themselves, as a job's own target request looks at its upstream.
    movable: dict[int, list[int]] = {}  # job id -> ids of its input tables' writers
    stack = [j for j in wanted if j in locked]
    while stack:
        job_id = stack.pop()
        if job_id in movable or job_id in busy or job_id not in locked:
            continue
        tables = inputs.get(job_id, [])
        if not tables or any(t.writer_id is None or t.writer_id not in writers for t in tables):
            continue  # an input nobody writes has no frontier yet
        ids = sorted({t.writer_id for t in tables if t.writer_id is not None})
        movable[job_id] = ids
        stack.extend(w for w in ids if writers[w].kind == DERIVED)
    if not movable:
        return
    sources = [writers[w] for w in sorted({w for ids in movable.values() for w in ids})]
    sources = [w for w in sources if w.kind == SOURCE]
    fr.seal_sources(session, ctx, sources)
    front = fr.frontiers(session, ctx, sources)  # then each derived writer's, as it moves
    front.update(
        (w, writers[w].frontier) for ids in movable.values() for w in ids if w not in front
    )
    first = repo.first_changes(session, sorted(movable))
    # A reader's target lies in (its frontier, its first change): only those of its
    # derived writers' committed barriers can be candidates.
    ranges: dict[tuple[int, int | None], set[int]] = {}
    for job_id, ids in movable.items():
        key = (locked[job_id].frontier, first.get(job_id))
        ranges.setdefault(key, set()).update(w for w in ids if writers[w].kind == DERIVED)
    committed = repo.committed_in_ranges(session, ranges)
    order = TopologicalSorter({j: [w for w in ids if w in movable] for j, ids in movable.items()})
    now = ctx.now_ms()
    batches: list[Batch] = []
    moved: dict[Job, int] = {}
    for job_id in order.static_order():
        job = locked[job_id]
        ids = movable[job_id]
        limit = min(front[w] for w in ids)
        derived = [committed[w] for w in ids if writers[w].kind == DERIVED]
        changed = first.get(job_id)
        at = job.frontier
        while True:
            candidates = sorted(set.intersection(*derived)) if derived else None
            target = fr.aligned_target(at, limit, ctx.interval, candidates)
            if target is None or (changed is not None and changed <= target):
                break
            batches.append(
                Batch(
                    job_id=job.id,
                    batch_id=-target,
                    barrier=target,
                    start_barrier=at,
                    committed=True,
                    abandoned=False,
                    advanced=True,
                    created_ms=now,
                    committed_ms=now,
                )
            )
            at = target
            committed.setdefault(job_id, set()).add(target)  # a candidate for its readers
        front[job_id] = at
        if at != job.frontier:
            moved[job] = at
    repo.write_advances(session, batches, moved)


def could_advance(session: Session, ctx: Context, jobs: Sequence[Job]) -> bool:
    """Whether :func:`advance_idle` might move one of these jobs or their upstream (a read:
    decides whether a consistent-version read takes the write step first).

    A derived job might move when it has no open batch, every input has a writer, and
    its inputs' frontiers have all passed its own; the upstream of such a job is looked
    at too (a job with an open batch, or an input nobody writes, is not looked past).
    Walked a layer of the upstream at a time, with a few statements per layer rather
    than per job: a 50-table version sent about 120."""
    seen: set[int] = set()
    layer = [j for j in jobs if j.kind == DERIVED]
    while layer:
        layer = [j for j in {j.id: j for j in layer}.values() if j.id not in seen]
        seen.update(j.id for j in layer)
        if not layer:
            return False
        busy = repo.jobs_with_open_batches(session, [j.id for j in layer])
        inputs = topo.input_tables_of_jobs(session, [j.id for j in layer if j.id not in busy])
        writers = topo.jobs_by_ids(
            session, sorted({t.writer_id for ts in inputs.values() for t in ts if t.writer_id})
        )
        fronts = fr.frontiers(session, ctx, list(writers.values()), sealed_only=False)
        upstream: list[Job] = []
        for job in layer:
            wanted = [
                writers.get(t.writer_id) if t.writer_id is not None else None
                for t in inputs.get(job.id, [])
            ]
            found = [w for w in wanted if w is not None]
            if job.id in busy or not found or len(found) < len(wanted):
                continue  # an input nobody writes: nothing to advance to
            if min(fronts[w.id] for w in found) > job.frontier:
                return True
            upstream.extend(w for w in found if w.kind == DERIVED)
        layer = upstream
    return False


def input_ranges(
    session: Session, ctx: Context, job_name: str, after: int, to: int
) -> list[InputRange]:
    """What a derived batch (after, to] reads from each input, by the MetaService's own
    barrier-to-snapshot mapping; 409 while ``to`` is beyond an input's frontier."""
    job = topo.require_job(session, job_name)
    if to < after:
        raise Invalid(f"to ({to}) is before after ({after})", field="to")
    inputs = topo.input_tables(session, job.id)
    writers = topo.jobs_by_ids(session, [t.writer_id for t in inputs if t.writer_id])
    fronts = fr.frontiers(session, ctx, list(writers.values()))
    for table in inputs:
        if table.writer_id is None or fronts[table.writer_id] < to:
            raise Conflict(
                f"input '{table.name}' of job '{job.name}' is not final at barrier {to} yet",
                field="to",
                code="not_final",
            )
    return _ranges(session, inputs, after, to)


def _ranges(session: Session, inputs: Sequence[Table], after: int, to: int) -> list[InputRange]:
    ids = [table.id for table in inputs]
    starts, ends = repo.snapshots_at_barriers(session, ids, [after, to])
    return [
        InputRange(
            table=table.name,
            from_barrier=after,
            to_barrier=to,
            from_snapshot=starts[table.id],
            to_snapshot=ends[table.id],
        )
        for table in inputs
    ]


def batch_view(
    session: Session, job: Job, batch: Batch, inputs: Sequence[Table] | None = None
) -> BatchBarrier:
    """The batch as answered; ``inputs``, when the caller just read them, saves the
    lookup of the batch's recorded inputs."""
    ranges: list[InputRange] = []
    if batch.start_barrier is not None:
        if inputs is None:
            inputs = repo.batch_input_tables(session, job.id, batch.batch_id) or topo.input_tables(
                session, job.id
            )
        ranges = _ranges(session, inputs, batch.start_barrier, batch.barrier)
    return BatchBarrier(
        job=job.name,
        batch_id=batch.batch_id,
        barrier=batch.barrier,
        start_barrier=batch.start_barrier,
        committed=batch.committed,
        inputs=ranges,
    )


class _ReportScope:
    """What a report request needs, read up front in a few set-based statements, then
    kept up to date in memory as its reports are recorded in order (a report may be a
    duplicate or a conflict of an earlier one in the same request).

    Jobs are locked in name order, so two requests touching the same jobs never
    deadlock. The statements do not grow with the number of reports. Batches and
    commits are plain rows (``repo.BatchRow``, ``repo.CommitRow``), not ORM objects,
    and a job's row moves once per request however many of its batches complete.
    """

    def __init__(
        self,
        session: Session,
        ctx: Context,
        reports: Sequence[CommitReport],
        field_prefix: str = "",
    ) -> None:
        self.session = session
        self.ctx = ctx
        named = sorted({r.table for r in reports})
        self.tables = topo.tables_by_names(session, named)
        # A revision job's report queued before its swap names the mirror's old name.
        self.tables.update(
            revision_repo.swapped_mirrors(session, [n for n in named if n not in self.tables])
        )
        self.jobs = repo.lock_jobs_by_name(session, [r.job for r in reports])
        self.jobs_by_id = {job.id: job for job in self.jobs.values()}
        first: dict[str, int] = {}  # job -> index of its first report, for the error field
        for index, r in enumerate(reports):
            first.setdefault(r.job, index)
        for name in sorted(first):
            if name not in self.jobs:
                field = f"{field_prefix}{first[name]}.job" if field_prefix else "job"
                raise topo.unknown_job(name, field)
        keys = {(self.jobs[r.job].id, r.batch_id) for r in reports}
        self.batches, of_batches, self.by_snapshot = repo.report_rows(
            session,
            keys,
            {
                (self.tables[r.table].id, r.snapshot_id)
                for r in reports
                if r.snapshot_id is not None and r.table in self.tables
            },
        )
        self.commits: dict[tuple[int, int, int], repo.CommitRow] = {}
        self.counts: dict[tuple[int, int], int] = {}
        for c in of_batches:
            self.commits[(c.job_id, c.batch_id, c.table_id)] = c
            self.counts[(c.job_id, c.batch_id)] = self.counts.get((c.job_id, c.batch_id), 0) + 1
        self._outputs: dict[tuple[int, int], int] = {}  # by (job id, batch id)
        self._newest: int | None = None
        self.added: list[repo.CommitRow] = []
        self.completed: dict[int, list[repo.BatchRow]] = {}  # by job id

    def table(self, name: str, field: str) -> Table:
        if name not in self.tables:
            topo.require_table(self.session, name, field=field)  # raises NotFound
        return self.tables[name]

    def outputs(self, job: Job, batch: repo.BatchRow) -> int:
        """The outputs the batch reports, for batches from before each batch recorded
        its own count."""
        key = (job.id, batch.batch_id)
        if key not in self._outputs:
            self._outputs[key] = repo.count_outputs_of_batch(self.session, *key)
        return self._outputs[key]

    def newest(self) -> int:
        """The newest barrier handed out (read only when a report's barrier lies ahead)."""
        if self._newest is None:
            self._newest = max(self.ctx.now_slot(), repo.clock(self.session).last_issued)
        return self._newest

    def add(self, commit: repo.CommitRow) -> None:
        self.added.append(commit)
        self.commits[(commit.job_id, commit.batch_id, commit.table_id)] = commit
        if commit.snapshot_id is not None:
            self.by_snapshot[(commit.table_id, commit.snapshot_id)] = commit
        key = (commit.job_id, commit.batch_id)
        self.counts[key] = self.counts.get(key, 0) + 1

    def complete(self, batch: repo.BatchRow) -> None:
        """Mark the batch committed; its job's row moves once per request, in :meth:`flush`."""
        batch.committed = True
        batch.committed_ms = self.ctx.now_ms()
        self.completed.setdefault(batch.job_id, []).append(batch)

    def flush(self) -> None:
        """Write what the request recorded: new commits, then batches, jobs and plans."""
        plans_upto: dict[int, int] = {}  # derived job id -> plans to drop
        for job_id, batches in self.completed.items():
            drop = _progress(self.ctx, self.jobs_by_id[job_id], batches)
            if drop is not None:
                plans_upto[job_id] = drop
        completed = [b for batches in self.completed.values() for b in batches]
        jobs = [self.jobs_by_id[job_id] for job_id in self.completed]
        repo.write_reports(self.session, self.added, completed, jobs)
        repo.drop_plans_upto_many(self.session, plans_upto)


def report_commits(
    session: Session, ctx: Context, reports: Sequence[CommitReport], *, field_prefix: str = ""
) -> CommitBatchResult:
    """Record commit reports, all or nothing: one bad report refuses the whole request."""
    scope = _ReportScope(session, ctx, reports, field_prefix)
    results = []
    for index, report in enumerate(reports):
        prefix = f"{field_prefix}{index}." if field_prefix else ""
        results.append(_record(scope, report, prefix))
    scope.flush()
    recorded = sum(1 for r in results if r.status == "recorded")
    return CommitBatchResult(results=results, recorded=recorded, duplicates=len(results) - recorded)


def _record(scope: _ReportScope, report: CommitReport, prefix: str) -> CommitResult:
    ctx = scope.ctx
    job = scope.jobs[report.job]
    table = scope.table(report.table, field=f"{prefix}table")
    batch = scope.batches.get((job.id, report.batch_id))
    existing = scope.commits.get((job.id, report.batch_id, table.id))
    if _same_commit(existing, report) and batch is not None and not batch.abandoned:
        # Recorded before (an outbox retry whose answer was lost, or a Spark replay):
        # the same answer, even if the job has stopped writing the table since.
        return _result(report, "duplicate", batch.committed)
    if table.writer_id != job.id:
        raise Conflict(
            f"job '{job.name}' does not write table '{table.name}'",
            field=f"{prefix}table",
            code="not_writer",
        )
    # A source job's own offline claim may lie ahead of the service's clock.
    own = batch.barrier if batch is not None else 0
    if report.barrier > max(ctx.now_slot(), own) and report.barrier > max(scope.newest(), own):
        raise Invalid(
            f"barrier {report.barrier} is in the future: the barrier clock is at {scope.newest()}",
            field=f"{prefix}barrier",
            code="barrier_from_future",
        )
    if batch is None:
        raise Conflict(
            f"batch {report.batch_id} of job '{job.name}' was never given a barrier; "
            f"ask POST /api/v1/jobs/{job.name}/batches/{report.batch_id}/barrier first",
            field=f"{prefix}batch_id",
            code="unknown_batch",
        )
    if batch.barrier != report.barrier:
        raise Conflict(
            f"batch {report.batch_id} of job '{job.name}' has barrier {batch.barrier}, "
            f"not {report.barrier}",
            field=f"{prefix}barrier",
            code="barrier_mismatch",
        )
    if existing is not None:
        raise Conflict(
            f"batch {report.batch_id} of job '{job.name}' was already reported for "
            f"'{table.name}' with snapshot {existing.snapshot_id}, not {report.snapshot_id}",
            field=f"{prefix}snapshot_id",
            code="conflicting_report",
        )
    if report.snapshot_id is not None:
        other = scope.by_snapshot.get((table.id, report.snapshot_id))
        if other is not None:
            raise Conflict(
                f"snapshot {report.snapshot_id} of '{table.name}' was already reported "
                f"for batch {other.batch_id}",
                field=f"{prefix}snapshot_id",
                code="conflicting_report",
            )
    fence(job, table, batch.batch_id, batch, field_prefix=prefix)
    scope.add(
        repo.CommitRow(
            job.id, report.batch_id, table.id, report.barrier, report.snapshot_id, ctx.now_ms()
        )
    )
    # A batch completes once, when the outputs it was opened with are all reported.
    needed = batch.outputs if batch.outputs is not None else scope.outputs(job, batch)
    complete = scope.counts[(job.id, report.batch_id)] >= needed
    if complete and not batch.committed:
        scope.complete(batch)
    return _result(report, "recorded", batch.committed)


def fence(
    job: Job,
    table: Table,
    batch_id: int,
    batch: Batch | repo.BatchRow | None,
    *,
    field_prefix: str = "",
) -> None:
    """The one check every path that would record a new commit meets last: a report, its
    redelivery from an outbox or a zombie driver, and `metaservice reconcile` (``batch``
    None: a batch the service never heard of). A version already handed out rests on a
    batch's commits, so they never change once the batch could have been read: 409

    - ``batch_abandoned``: an operator abandoned the batch; the frontier went past its
      barrier (a replay of the batch runs at a new one, :func:`reopen_abandoned`);
    - ``output_added_after_batch``: the table became the job's output after the batch
      was opened, so the batch completes without it (at a barrier the table's frontier
      then passes); the table is recorded from the job's next batch on;
    - ``batch_complete``: the batch completed without this table.

    Nothing to retry in any of them: the report is final, and a deliverer drops it.
    """
    field = f"{field_prefix}batch_id"
    if batch is not None and batch.abandoned:
        raise Conflict(
            f"batch {batch_id} of job '{job.name}' was abandoned by an operator at barrier "
            f"{batch.barrier}, and readers have moved past it: its commit is not recorded "
            f"(a version already handed out would change). Nothing to retry; a replay of the "
            f"batch asks for a new barrier (POST /api/v1/jobs/{job.name}/batches/{batch_id}"
            "/barrier)",
            field=field,
            code="batch_abandoned",
        )
    if not reports_table(table, batch_id):
        first = table.writer_first_batch
        raise Conflict(
            f"table '{table.name}' became an output of job '{job.name}' after its batch "
            f"{batch_id} was opened: that batch completes without it, so its report for the "
            f"table is not recorded (a version already handed out would change). Nothing to "
            f"retry: '{table.name}' is recorded from the job's batch {first} on, whose "
            "snapshot is the table's whole state, this batch's rows included",
            field=f"{field_prefix}table",
            code="output_added_after_batch",
        )
    if batch is not None and batch.committed:
        raise Conflict(
            f"batch {batch_id} of job '{job.name}' completed without a report for "
            f"'{table.name}': its commits are final (a version may name them). Nothing to "
            "retry",
            field=f"{field_prefix}table",
            code="batch_complete",
        )


def reports_table(table: Table, batch_id: int) -> bool:
    """Whether the writer's batch ``batch_id`` was opened with the table among its outputs
    (it took the table on at ``writer_first_batch``; None: with its first batch)."""
    first = table.writer_first_batch
    return first is None or batch_id >= first


def _same_commit(existing: repo.CommitRow | None, report: CommitReport) -> bool:
    return (
        existing is not None
        and existing.snapshot_id == report.snapshot_id
        and existing.barrier == report.barrier
    )


def complete_batch(session: Session, ctx: Context, job: Job, batch: Batch) -> None:
    """Mark a batch committed once every output is recorded and move the job's progress
    (also used by reconciliation, so both paths complete a batch the same way). Only an
    open batch completes: a committed or abandoned one was already taken off the job's
    count, and counting it again would move its frontier wrongly for good."""
    if batch.committed or batch.abandoned:
        raise AssertionError(
            f"batch {batch.batch_id} of job '{job.name}' is not open: it cannot complete"
        )
    drop = mark_complete(ctx, job, batch)
    if drop is not None:
        repo.drop_plans_upto(session, job.id, drop)


def mark_complete(ctx: Context, job: Job, batch: Batch) -> int | None:
    """:func:`complete_batch` on the rows in memory; answers where the job's plans may
    be dropped up to (a derived batch's start: its plan is used), or None."""
    batch.committed = True
    batch.committed_ms = ctx.now_ms()
    return _progress(ctx, job, [batch])


def _progress(ctx: Context, job: Job, batches: Sequence[Batch | repo.BatchRow]) -> int | None:
    """What completing these batches of the job moves on its row, set once per column
    (a report request may complete hundreds of one job's batches); where its plans may
    be dropped up to, or None (see :func:`mark_complete`)."""
    barrier = max(b.barrier for b in batches)
    job.last_barrier = max(job.last_barrier or 0, barrier)
    job.last_batch_id = max(job.last_batch_id or 0, max(b.batch_id for b in batches))
    job.last_seen_ms = ctx.now_ms()
    if job.kind == SOURCE:
        before = job.open_batches
        job.open_batches = before - len(batches)
        if 0 < before <= len(batches):  # its open batches reached 0
            # Under the row lock no batch can be given a barrier <= the closed slot any more.
            job.frontier = max(job.frontier, fr.sealable_slot(ctx, job))
        return None
    job.frontier = max(job.frontier, barrier)
    if job.pending_target is not None and job.pending_target <= barrier:
        job.pending_target = None
    starts = [b.start_barrier for b in batches if b.start_barrier is not None]
    return max(starts) if starts else None


def _result(report: CommitReport, status: str, committed: bool) -> CommitResult:
    return CommitResult(
        job=report.job,
        batch_id=report.batch_id,
        table=report.table,
        barrier=report.barrier,
        snapshot_id=report.snapshot_id,
        status=status,
        batch_committed=committed,
    )
