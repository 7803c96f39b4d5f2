"""Frontiers, exactness and the alignment of derived jobs' targets.

A table's frontier is its writer job's frontier. A source job's frontier is a
function of recorded state, so a reader computes it without writing:

    min(max(sealed, S if idle else min(oldest open - interval, S)), floor - interval)

with ``S`` the watermark on the clock row (raised once a slot; every barrier given to
a source batch afterwards is above it: the proof, and G1/G2 with it, is in
:mod:`metaservice.barriers.watermark`), ``sealed`` the frontier written on the job's
row under its lock (when its last open batch completes, or is abandoned, and by a
derived job's own next-barrier round) and ``floor`` the offline grant's floor
(``barriers/offline.py``: while the job holds a grant it may give its own batches
barriers at or above it without asking, so its frontier stays below it).
A derived job's frontier is the last barrier it committed.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from metaservice.barriers import repository as repo
from metaservice.context import Context
from metaservice.models import SOURCE, Job


def frontiers(
    session: Session, ctx: Context, jobs: Sequence[Job], *, sealed_only: bool = True
) -> dict[int, int]:
    """Frontier of each job (see the module docstring).

    ``sealed_only=False``: the frontiers as a seal by this replica would make them
    (source jobs count up to its last closed slot where the watermark has not got
    there yet), for a job's own round deciding whether its write step may move
    anything; never for deciding that a barrier is complete (see
    :func:`shown_frontiers` for what the API shows).
    """
    return frontiers_and_watermark(session, ctx, jobs, sealed_only=sealed_only)[0]


def shown_frontiers(session: Session, ctx: Context, jobs: Sequence[Job]) -> dict[int, int]:
    """The frontiers the API shows and revisions and handovers go by: the watermark's,
    which every replica shares (a replica's own closed slot could be ahead of another's,
    and a frontier shown by one then by the other would go back); where readers catch
    up (no advancer: a single process on a ManualClock), as a seal would make them, as
    a read would right after."""
    return frontiers(session, ctx, jobs, sealed_only=not ctx.readers_catch_up)


def frontiers_and_watermark(
    session: Session, ctx: Context, jobs: Sequence[Job], *, sealed_only: bool = True
) -> tuple[dict[int, int], int | None]:
    """:func:`frontiers`, and the watermark S they were computed with (None when no job
    is a source: then none was read)."""
    progress = repo.source_progress(session, [j.id for j in jobs if j.kind == SOURCE])
    result: dict[int, int] = {}
    watermark: int | None = None
    for job in jobs:
        if job.kind != SOURCE:
            result[job.id] = job.frontier
            continue
        p = progress[job.id]
        watermark = p.watermark
        upto = p.watermark if sealed_only else max(p.watermark, ctx.closed_slot())
        if p.oldest_open is not None:
            # Never past S: a batch open at a barrier of the job's own clock, ahead of
            # the service's (an offline claim, and the online batches that follow it),
            # says nothing about the slots in between; and S, not a replica's clock, so
            # two replicas answer alike.
            front = max(p.sealed, min(p.oldest_open - ctx.interval, upto))
        else:
            front = max(p.sealed, upto)
        result[job.id] = _below_floor(ctx, front, p.offline_floor)
    return result, watermark


def _below_floor(ctx: Context, slot: int, offline_floor: int | None) -> int:
    return slot if offline_floor is None else min(slot, offline_floor - ctx.interval)


def sealable_slot(ctx: Context, job: Job) -> int:
    """How far an idle source job's frontier may move: the last closed slot, kept
    below the job's offline floor while it holds an offline grant."""
    return _below_floor(ctx, ctx.closed_slot(), job.offline_floor)


def seal_sources(session: Session, ctx: Context, jobs: Sequence[Job]) -> None:
    """Move idle source jobs' sealed frontiers to their sealable slot (in this write
    transaction, under their row locks): a derived job's own next-barrier round does,
    to plan up to this replica's closed slot before the watermark gets there. Readers
    never do (they read the watermark)."""
    closed = ctx.closed_slot()
    ids = repo.seal_candidates(
        session, [j.id for j in jobs if j.kind == SOURCE], closed, ctx.interval
    )
    if ids:
        sealed = repo.seal(session, ids, closed, ctx.interval)
        for job in jobs:
            if job.id in sealed:
                # the row's value as written, without marking the job changed
                set_committed_value(job, "frontier", sealed[job.id])


def two_adic_valuation(n: int) -> int:
    """How many times 2 divides n (n != 0): the alignment of slot number n."""
    if n == 0:
        raise ValueError("0 is divisible by every power of two")
    return (n & -n).bit_length() - 1


def aligned_target(
    start: int,
    limit: int,
    interval: int,
    candidates: Sequence[int] | None = None,
) -> int | None:
    """The barrier a derived job's next batch ends at: in ``(start, limit]``, or None.

    **Rule.** A job's first batch (``start <= 0``: no frontier yet) takes everything
    available: ``limit``, or the newest candidate. Every later batch ends on the most
    aligned barrier available in ``(start, limit]``: the one whose slot number
    (``barrier // interval``) is divisible by the highest power of two, the newest
    among equals. ``candidates`` restricts "available" to the barriers where every
    derived input is exact (those they all committed); None means every grid barrier
    qualifies (source inputs are exact everywhere). There is no window: the whole of
    ``(start, limit]`` counts, however far the job lags. A job that keeps up
    (``limit`` one slot past ``start``) takes every slot. A job far behind may first
    take a short batch onto a highly aligned barrier; from there each batch jumps by
    the largest power of two that fits.

    Below, barriers are slot numbers, a batch (a, b] spans b - a slots and P is a
    power of two.

    **Lemma.** If a batch (a, b] chosen by this rule has a < M <= b for a multiple M
    of P available to it, and spans at most P slots, then b = M. Proof: M is
    available in (a, b], inside (a, limit], so b is at least as aligned as M; both
    are multiples of P, and (a, b] holds at most one multiple of P. So a batch that
    passes over a multiple of P without ending on it spans more than P slots.

    **Bound (G2).** Take a set S of derived jobs; let U be S with every derived job
    upstream of a member, F the least frontier in S and M the largest multiple of P
    with M <= F. If M lies past the first batch of every job in U and no job in U has
    a batch of more than P slots ending after F - P, every job of S committed M: S's
    consistent version is at least M, so it trails F by less than P slots. Proof, by
    induction along U in topological order: a job of U reached M (members because
    F >= M, upstream jobs because a reader never passes its inputs' frontiers), so
    one of its batches (a, b], not its first, has a < M <= b. It ends at or after M,
    after F - P, so it spans at most P slots. M was available to it: source inputs
    are exact everywhere, and its derived inputs are jobs of U that, by induction,
    had committed M when it planned (its limit, at least b >= M, is at most their
    frontiers). By the lemma, b = M. Batches the MetaService advances for idle jobs
    follow the same rule and count as batches.

    In words: the consistent version of a set of jobs trails the least frontier by
    less than the longest recent batch among the members and their derived upstream,
    rounded up to a power of two slots (less than twice that batch). In steady state
    (one slot per batch) P = 1 and the version is the least frontier.

    No rule can bound it by the batches of the member with the least frontier alone:
    if that member takes every slot while another member commits every 100 slots, the
    newest common barrier is the other member's last one, up to 99 slots below the
    least frontier.
    """
    if limit <= start:
        return None
    if candidates is None:
        low, high = start // interval, limit // interval  # slots: target in (low, high]
        if high <= low:
            return None
        if start <= 0:
            return high * interval
        # All slots in (low, high] share the bits above the highest bit where low and
        # high differ (k); the slot with those bits, bit k set and nothing below is in
        # the range and is the only one divisible by 2**k.
        k = (low ^ high).bit_length() - 1
        return (high >> k << k) * interval
    pool = [c for c in candidates if start < c <= limit]
    if not pool:
        return None
    if start <= 0:
        return max(pool)
    # (`or 1`: an off-grid candidate below one interval is aligned like slot 1, not an error)
    return max(pool, key=lambda c: (two_adic_valuation(c // interval or 1), c))
