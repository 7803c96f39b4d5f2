"""Offline grants: a source job keeps committing while the MetaService is unreachable.

A source job's batch normally asks the MetaService for its barrier. To go on without
it (guarantee G4), the job holds an *offline grant*: each time it reports in
(``PUT /jobs/{job}/offline-grant``) it promises a floor ``F``, the lowest barrier it
will ever give itself, and the MetaService records ``offline_floor``, never above F
nor above the slot a new batch of the job would get (its current slot, raised past
the sealed frontier and the watermark S: see ``barriers/watermark.py``). While the
grant stands, the job's frontier stays
below ``offline_floor`` (``frontiers.sealable_slot``), so no reader ever treats a
slot as complete that the job could still give to a batch of its own.

Offline, the job gives its batches barriers ``>= F`` from its clock (corrected by
the offset the grants taught it), writes the claim to its outbox before committing,
and reports in again only once every claim has been delivered
(``POST .../batches/{batch_id}/barrier`` with ``{"barrier": b}``). A claim below the
floor, off the grid, far in the future or behind an earlier batch is refused.

A claim for a batch an operator abandoned is the batch run again by its driver: at a
new barrier (the claim's checks all pass) the batch is replayed there, as a replay
asking for its barrier online would be, so what the driver committed is recorded; at
the barrier it was abandoned at, which readers have taken as complete, the claim is
refused (409 ``batch_abandoned``), as the batch's commit there is.

Releasing the grant (``DELETE``, a clean shutdown of the job) lets the frontier
follow the clock again. A job that dies while holding one holds its tables' frontier
until it comes back or an operator releases the grant.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy.orm import Session

from metaservice.barriers import repository as repo
from metaservice.barriers import watermark
from metaservice.barriers.batch_checks import check_query_of, lock_job_named
from metaservice.barriers.ranges import batch_view
from metaservice.barriers.schemas import BatchBarrier, ClaimedBarrier, OfflineGrant
from metaservice.barriers.source_batches import reopen_abandoned
from metaservice.context import Context
from metaservice.contract import on_grid, slot_of
from metaservice.errors import Conflict, Invalid, ServiceError
from metaservice.models import SOURCE, Batch, Job
from metaservice.topology import repository as topo

log = logging.getLogger("metaservice.offline")

# A claimed or reported barrier may lie this far ahead of the service's clock (clock
# skew between a job's machine and the service's, after the job's offset correction).
MAX_CLAIM_AHEAD_MS = 60_000


def _source_job(session: Session, job_name: str) -> Job:
    return _as_source(lock_job_named(session, job_name))


def _as_source(job: Job) -> Job:
    if job.kind != SOURCE:
        raise Invalid(
            f"job '{job.name}' reads tables; only source jobs can give their batches "
            "barriers offline (derived jobs wait for the MetaService)",
            field="job",
            code="not_source",
        )
    return job


def grant(
    session: Session, ctx: Context, job_name: str, promised_floor: int, locked: Job | None = None
) -> OfflineGrant:
    """Take or renew the job's offline grant; see the module docstring. ``locked``: the
    job's row as this transaction locked it already (a barrier request carrying the
    promise), not read again."""
    job = _as_source(locked) if locked is not None else _source_job(session, job_name)
    # Never below the sealed frontier nor the watermark S (read under its lock, held
    # shared, so that no raise lands between the read and this grant's commit): the
    # frontier, capped below the floor, must not step back (barriers/watermark.py).
    watermark.hold_shared(session)
    s = watermark.read_held(session)  # the barrier's read, when this request carries one
    slot = max(ctx.now_slot(), job.frontier + ctx.interval, s + ctx.interval)
    promised = slot_of(promised_floor, ctx.interval)
    # A first grant floors at the slot: the job learns it from this answer before it
    # claims anything. A renewal takes min(promise, slot): an answer lost on the way
    # back leaves the job knowing only its own promise.
    floor = slot if job.offline_floor is None else max(job.offline_floor, min(promised, slot))
    job.offline_floor = floor
    job.last_seen_ms = ctx.now_ms()
    return OfflineGrant(
        job=job.name, floor=floor, barrier=slot, now_ms=ctx.now_ms(), interval_ms=ctx.interval
    )


def release(session: Session, ctx: Context, job_name: str) -> None:
    """Give up the grant (idempotent): the job's frontier follows the clock again."""
    job = lock_job_named(session, job_name)
    job.offline_floor = None
    job.last_seen_ms = ctx.now_ms()


def claim(
    session: Session,
    ctx: Context,
    job_name: str,
    batch_id: int,
    barrier: int,
    query_id: str | None = None,
) -> BatchBarrier:
    """Record the barrier a source job gave its batch while offline (idempotent)."""
    item = ClaimedBarrier(batch_id=batch_id, barrier=barrier)
    return claim_many(session, ctx, job_name, [item], field_prefix="", query_id=query_id)[0]


def claim_many(
    session: Session,
    ctx: Context,
    job_name: str,
    claims: Sequence[ClaimedBarrier],
    *,
    field_prefix: str = "claims.",
    query_id: str | None = None,
) -> list[BatchBarrier]:
    """Record claims of one job in order, all or nothing. The job is locked and its
    batches read once per request, and the batches it opens are written together (one
    output count, one raise of the clock, one INSERT), so a backlog drains at many
    claims per statement."""
    job = _source_job(session, job_name)
    known = repo.batches_by_id(session, job.id, [c.batch_id for c in claims])
    newest = repo.newest_batch(session, job.id)
    batches = []
    opened: list[Batch] = []  # new batches, not in the session, written by _open_all
    for index, item in enumerate(claims):
        try:
            query = item.query_id or query_id
            check_query_of(job, item.batch_id, query, known.get(item.batch_id) or newest)
            batch = _claim_one(
                session, ctx, job, item, known.get(item.batch_id), newest, query, opened
            )
            if batch.query_id is None:
                batch.query_id = query
        except ServiceError as exc:
            if field_prefix:
                exc.field = f"{field_prefix}{index}.{exc.field or 'barrier'}"
            raise
        known[batch.batch_id] = batch
        if newest is None or batch.batch_id > newest.batch_id:
            newest = batch
        batches.append(batch)
    _open_all(session, ctx, job, opened)
    job.last_seen_ms = ctx.now_ms()
    session.flush()
    return [batch_view(session, job, batch) for batch in batches]


def _open_all(session: Session, ctx: Context, job: Job, opened: list[Batch]) -> None:
    """Write the batches a request's claims opened, as :func:`open_source_batch` does one
    by one: each holds the job's frontier below it, counted on the job's row."""
    if not opened:
        return
    # A claim ahead of the service's clock moves no other job's barriers.
    repo.raise_last_issued(session, min(max(b.barrier for b in opened), ctx.now_slot()))
    outputs = topo.count_outputs(session, job.id)
    for batch in opened:
        batch.outputs = outputs
    repo.insert_batches(session, opened)
    job.open_batches += len(opened)
    opened.clear()


def _claim_one(
    session: Session,
    ctx: Context,
    job: Job,
    item: ClaimedBarrier,
    batch: Batch | None,
    newest: Batch | None,
    query_id: str | None,
    opened: list[Batch],
) -> Batch:
    if batch is not None and batch.barrier == item.barrier:
        if batch.abandoned:
            raise Conflict(
                f"batch {item.batch_id} of job '{job.name}' was abandoned by an operator at "
                f"barrier {item.barrier}, and readers have moved past it: the claim, and the "
                "batch's commit there, are not recorded. Nothing to retry; a replay of the "
                "batch gets a new barrier",
                field="barrier",
                code="batch_abandoned",
            )
        return batch  # delivered before
    _check_claim(ctx, job, item.barrier)
    if newest is not None and newest.batch_id > item.batch_id:
        raise Conflict(
            f"job '{job.name}' already has batch {newest.batch_id}; a claim for batch "
            f"{item.batch_id} comes too late",
            field="batch_id",
            code="batch_out_of_order",
        )
    if batch is None:
        _check_not_behind(job, newest, item)
        new = Batch(
            job_id=job.id,
            batch_id=item.batch_id,
            barrier=item.barrier,
            committed=False,
            abandoned=False,
            advanced=False,
            created_ms=ctx.now_ms(),
            query_id=query_id,
        )
        opened.append(new)
        return new
    if batch.committed:
        raise Conflict(
            f"batch {item.batch_id} of job '{job.name}' committed at barrier {batch.barrier}, "
            f"not {item.barrier}",
            field="barrier",
            code="barrier_mismatch",
        )
    # The job asked, the answer was lost, and it went on offline: its claim wins.
    # Safe: the frontier stayed below the floor, which the claim is not below.
    previous = repo.previous_batch(session, job.id, item.batch_id)
    # Batches this request opened are not written yet (see _open_all).
    earlier = [b for b in opened if b.batch_id < item.batch_id]
    if earlier:
        previous = max([*earlier, *([previous] if previous else [])], key=lambda b: b.batch_id)
    _check_not_behind(job, previous, item)
    if batch.abandoned:
        # Run offline by its restarted driver (or one that was only cut off): replayed at
        # the claimed barrier, past the frontier, as a replay asking for its barrier would
        # be, so that what the driver committed there is not lost.
        reopen_abandoned(session, ctx, job, batch, item.barrier)
        return batch
    log.info(
        "job %s batch %d: claimed barrier %d replaces %d",
        job.name, item.batch_id, item.barrier, batch.barrier,
    )  # fmt: skip
    batch.barrier = item.barrier  # a batch in ``opened`` is written with it
    repo.raise_last_issued(session, min(item.barrier, ctx.now_slot()))
    return batch


def _check_not_behind(job: Job, previous: Batch | None, item: ClaimedBarrier) -> None:
    if previous is not None and previous.barrier > item.barrier:
        raise Conflict(
            f"batch {previous.batch_id} of job '{job.name}' has barrier {previous.barrier}; "
            f"batch {item.batch_id} cannot have the earlier barrier {item.barrier}",
            field="barrier",
            code="barrier_went_back",
        )


def _check_claim(ctx: Context, job: Job, barrier: int) -> None:
    if not on_grid(barrier, ctx.interval):
        raise Invalid(
            f"barrier {barrier} is not on the barrier grid (multiples of {ctx.interval} ms)",
            field="barrier",
            code="off_grid",
        )
    if barrier > ctx.now_ms() + MAX_CLAIM_AHEAD_MS:
        raise Invalid(
            f"barrier {barrier} is more than {MAX_CLAIM_AHEAD_MS} ms ahead of the "
            f"MetaService's clock ({ctx.now_ms()}); check the job machine's clock",
            field="barrier",
            code="barrier_from_future",
        )
    if job.offline_floor is None:
        raise Conflict(
            f"job '{job.name}' holds no offline grant, so it cannot claim barriers; "
            f"take one with PUT /api/v1/jobs/{job.name}/offline-grant",
            field="barrier",
            code="no_offline_grant",
        )
    if barrier < job.offline_floor:
        raise Conflict(
            f"barrier {barrier} is below job '{job.name}''s offline floor "
            f"{job.offline_floor}: readers may already treat it as complete",
            field="barrier",
            code="claim_below_floor",
        )
