"""Frontiers, exactness and the alignment of derived jobs' targets.

A table's frontier is its writer job's frontier. A source job's frontier is one
slot below its oldest open batch or, when it has none, its sealed slot; sealing
moves an idle source job's frontier up to the last closed slot under the job's
row lock, so that a batch asking for a barrier afterwards is pushed past it.
A derived job's frontier is the last barrier it committed.

While a source job holds an offline grant (``barriers/offline.py``) it may give
its own batches barriers at or above its offline floor without asking, so its
frontier stays below that floor until the job reports in again.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from metaservice.barriers import repository as repo
from metaservice.context import Context
from metaservice.models import SOURCE, Job


def frontiers(
    session: Session, ctx: Context, jobs: Sequence[Job], *, sealed_only: bool = True
) -> dict[int, int]:
    """Frontier of each job.

    ``sealed_only=False`` lets idle source jobs count up to the last closed slot
    without sealing: good enough for display, but a decision that a barrier is
    complete must seal first (see :func:`seal_sources`) and use the sealed value.
    """
    progress = repo.source_progress(session, [j.id for j in jobs if j.kind == SOURCE])
    result: dict[int, int] = {}
    for job in jobs:
        if job.kind != SOURCE:
            result[job.id] = job.frontier
            continue
        p = progress[job.id]
        if p.oldest_open is not None:
            front = max(p.sealed, p.oldest_open - ctx.interval)
        elif sealed_only:
            front = p.sealed
        else:
            front = max(p.sealed, ctx.closed_slot())
        result[job.id] = _below_floor(ctx, front, p.offline_floor)
    return result


def _below_floor(ctx: Context, slot: int, offline_floor: int | None) -> int:
    return slot if offline_floor is None else min(slot, offline_floor - ctx.interval)


def sealable_slot(ctx: Context, job: Job) -> int:
    """How far an idle source job's frontier may move: the last closed slot, kept
    below the job's offline floor while it holds an offline grant."""
    return _below_floor(ctx, ctx.closed_slot(), job.offline_floor)


def seal_sources(session: Session, ctx: Context, jobs: Sequence[Job]) -> None:
    """Move idle source jobs' frontiers to their sealable slot (in this write transaction)."""
    closed = ctx.closed_slot()
    ids = repo.seal_candidates(
        session, [j.id for j in jobs if j.kind == SOURCE], closed, ctx.interval
    )
    if ids:
        repo.seal(session, ids, closed, ctx.interval)
        for job in jobs:
            if job.id in ids:
                session.refresh(job)


def needs_seal(ctx: Context, jobs: Sequence[Job]) -> bool:
    return any(
        j.kind == SOURCE and j.open_batches == 0 and j.frontier < sealable_slot(ctx, j)
        for j in jobs
    )


def two_adic_valuation(n: int) -> int:
    """How many times 2 divides n (n > 0)."""
    return (n & -n).bit_length() - 1


def aligned_target(
    start: int,
    limit: int,
    interval: int,
    window_slots: int,
    candidates: Sequence[int] | None = None,
) -> int | None:
    """The barrier a derived job's next batch should end at, in (start, limit].

    Catch-up batches end on the most aligned barrier available (the one whose
    slot number is divisible by the highest power of two), looking no further
    back than ``window_slots`` when it can. Jobs lagging by similar amounts thus
    pick the same barriers, so coalescing batches still leaves tables with
    common exact barriers (G2); a job that keeps up takes every slot.
    ``candidates`` limits the choice to barriers where every input is exact
    (None: every barrier on the grid qualifies).
    """
    if limit <= start:
        return None
    low = max(start, limit - window_slots * interval)
    if candidates is None:
        for power in range(62, -1, -1):
            step = interval << power
            target = limit - limit % step
            if target > low:
                return target
        return None
    in_window = [c for c in candidates if low < c <= limit]
    pool = in_window or [c for c in candidates if start < c <= limit]
    if not pool:
        return None
    return max(pool, key=lambda c: (two_adic_valuation(c // interval or 1), c))
