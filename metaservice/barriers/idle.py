"""Idle advance: the MetaService moves a derived job none of whose inputs changed
past its frontier, recording committed batches of its own (G2: an idle job never
holds readers back), and :func:`could_advance`, the read that decides whether a
job's round (or a reader, where readers catch up: ``Context.readers_catch_up``)
takes that write step first. The per-slot advancer (``barriers/advancer.py``) runs
it for every derived job, so readers never write.
"""

from __future__ import annotations

from collections.abc import Sequence
from graphlib import TopologicalSorter
from typing import Any

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as repo
from metaservice.context import Context
from metaservice.models import DERIVED, SOURCE, Job
from metaservice.topology import repository as topo


def advance_idle_many(
    session: Session, ctx: Context, jobs: Sequence[Job], *, seal: bool = True
) -> int:
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

    ``seal``: seal the idle sources below first (a derived job's own round does, to
    plan up to this replica's closed slot); the per-slot advancer, which has just
    raised the watermark to it, does not need to. Answers how many batches it recorded.
    """
    wanted = sorted({j.id for j in jobs if j.kind == DERIVED})
    if not wanted:
        return 0
    locked = repo.try_lock_jobs(session, repo.derived_upstream(session, wanted))
    busy = repo.jobs_with_open_batches(session, list(locked))
    inputs = topo.input_writers_of_jobs(session, sorted(set(locked) - busy))
    writer_ids = {w for ws in inputs.values() for w in ws if w is not None}
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
        input_writers = inputs.get(job_id, [])
        if not input_writers or any(w is None or w not in writers for w in input_writers):
            continue  # an input nobody writes has no frontier yet
        ids = sorted({w for w in input_writers if w is not None})
        movable[job_id] = ids
        stack.extend(w for w in ids if writers[w].kind == DERIVED)
    if not movable:
        return 0
    sources = [writers[w] for w in sorted({w for ids in movable.values() for w in ids})]
    sources = [w for w in sources if w.kind == SOURCE]
    if seal:
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
    batches: list[dict[str, Any]] = []
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
            batches.append(repo.advanced_batch(job.id, at, target, now))
            at = target
            committed.setdefault(job_id, set()).add(target)  # a candidate for its readers
        front[job_id] = at
        if at != job.frontier:
            moved[job] = at
    repo.write_advances(session, batches, moved)
    return len(batches)


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
        inputs = topo.input_writers_of_jobs(session, [j.id for j in layer if j.id not in busy])
        writers = topo.jobs_by_ids(
            session, sorted({w for ws in inputs.values() for w in ws if w is not None})
        )
        fronts = fr.frontiers(session, ctx, list(writers.values()), sealed_only=False)
        upstream: list[Job] = []
        for job in layer:
            wanted = [writers.get(w) if w is not None else None for w in inputs.get(job.id, [])]
            found = [w for w in wanted if w is not None]
            if job.id in busy or not found or len(found) < len(wanted):
                continue  # an input nobody writes: nothing to advance to
            if min(fronts[w.id] for w in found) > job.frontier:
                return True
            upstream.extend(w for w in found if w.kind == DERIVED)
        layer = upstream
    return False
