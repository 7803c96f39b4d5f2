"""Frontiers, exactness and the alignment of derived jobs' targets.

A table's frontier is its writer job's frontier. A source job's frontier is one
slot below its oldest open batch or, when it has none, its sealed slot; sealing
moves an idle source job's frontier up to the last closed slot under the job's
row lock, so that a batch asking for a barrier afterwards is pushed past it.
A derived job's frontier is the last barrier it committed.
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
    closed = ctx.closed_slot()
    result: dict[int, int] = {}
    for job in jobs:
        if job.kind != SOURCE:
            result[job.id] = job.frontier
            continue
        sealed, oldest = progress[job.id]
        if oldest is not None:
            result[job.id] = max(sealed, oldest - ctx.interval)
        elif sealed_only:
            result[job.id] = sealed
        else:
            result[job.id] = max(sealed, closed)
    return result


def seal_sources(session: Session, ctx: Context, jobs: Sequence[Job]) -> None:
    """Move idle source jobs' frontiers to the last closed slot (in this write transaction)."""
    closed = ctx.closed_slot()
    ids = repo.seal_candidates(session, [j.id for j in jobs if j.kind == SOURCE], closed)
    if ids:
        repo.seal(session, ids, closed)
        for job in jobs:
            if job.id in ids:
                session.refresh(job)


def needs_seal(ctx: Context, jobs: Sequence[Job]) -> bool:
    closed = ctx.closed_slot()
    return any(j.kind == SOURCE and j.open_batches == 0 and j.frontier < closed for j in jobs)


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
