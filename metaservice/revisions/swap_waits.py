"""What a swapping revision waits for before its records can be swapped: the originals'
open batches reported, the mirrors caught up with their frozen originals, and no
consistent version going back at the swap. Read by the revision's view (its state) and
by the swap itself (``revisions.swap_records``)."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.context import Context
from metaservice.errors import Conflict, NotFound
from metaservice.models import DERIVED, Job, Table
from metaservice.revisions import repository as repo
from metaservice.revisions.names import revision_job_name
from metaservice.revisions.repository import Affected
from metaservice.versions import service as versions

log = logging.getLogger(__name__)


def swap_waits_for(
    session: Session,
    ctx: Context,
    revision_id: int,
    affected: list[Affected],
    originals: dict[str, Job],
    revised: dict[str, Job],
) -> str | None:
    """What a swapping revision waits for before its records can be swapped; None when
    nothing. ``originals`` and ``revised``: the original writers and their revision jobs,
    by original name."""
    still_open = sorted(
        j.name for j in originals.values() if barrier_repo.open_batch(session, j.id) is not None
    )
    if still_open:
        # their reports will raise the originals' frontiers
        return f"the batch open in original job(s) {', '.join(still_open)} to be reported"
    front = fr.frontiers(session, ctx, [*originals.values(), *revised.values()])
    behind = [
        f"{a.mirror} at {front[revised[a.writer].id]}, {a.table} at {front[originals[a.writer].id]}"
        for a in affected
        if front[revised[a.writer].id] < front[originals[a.writer].id]
    ]
    if behind:
        return "the mirrors to reach their frozen originals (" + "; ".join(behind) + ")"
    frozen = {a.table: front[originals[a.writer].id] for a in affected}
    return _version_going_back(session, ctx, revision_id, affected, frozen)


def _version_going_back(
    session: Session,
    ctx: Context,
    revision_id: int,
    affected: list[Affected],
    frozen: dict[str, int],
) -> str | None:
    """Why a consistent version would go back if the swap happened now; None when none
    would. ``frozen``: each original's frontier, which no longer moves (its writer is
    superseded and has no batch open), so every version handed out for a set holding an
    affected table is at or below it.

    1. The mirrors must be exact together at a barrier at or above every frozen frontier:
       then no set of affected tables goes back, nor any set with other tables that are
       exact there too.
    2. Any other table of the pipeline (one per writer) that is not exact there: a set of
       it with an affected table, or with all of them, must have a version after the swap
       at least as new as the one it has now. Otherwise the swap waits for that writer to
       commit a barrier the mirrors are exact at (or for the mirrors to reach one of its)."""
    mirrors = {a.table: a.mirror for a in affected}
    highest = max(frozen.values())
    together = _version_barrier(session, ctx, sorted(mirrors.values()))
    if together is None or together < highest:
        return (
            f"the mirrors are exact together at barrier {together} only, below {highest} "
            "(the frontier their originals stopped at): the revision jobs must commit a "
            "common barrier at or above it"
        )
    for other in _not_exact_at(
        session, ctx, _other_tables(session, ctx, revision_id, affected), together
    ):
        for chosen in [[t] for t in sorted(mirrors)] + [sorted(mirrors)]:
            before = _version_barrier(session, ctx, sorted([*chosen, other]))
            if before is None:
                continue
            renamed = sorted([*(mirrors[t] for t in chosen), other])
            after = _version_barrier(session, ctx, renamed)
            if after is None or after < before:
                return (
                    f"the consistent version of {', '.join(sorted([*chosen, other]))} is at "
                    f"barrier {before}; swapped now, it would be at {after}: waiting for "
                    f"'{other}' to be exact at a barrier the mirrors are exact at"
                )
    return None


def _version_barrier(session: Session, ctx: Context, names: list[str]) -> int | None:
    """The barrier of the tables' consistent version now; None when there is none."""
    try:
        return versions.consistent_version(session, ctx, names).barrier
    except (Conflict, NotFound):
        return None


def _other_tables(
    session: Session, ctx: Context, revision_id: int, affected: list[Affected]
) -> dict[str, tuple[Table, Job]]:
    """The tables a consistent version may pair with the affected ones, outside them, by
    name with their writers: every table of the topology that has a writer, not only
    those connected to the affected tables (a version may name any set of tables, the
    outputs of two pipelines read together). One table per writer stands for its tables
    (they share its frontier and the barriers it committed), and each table that keeps
    barriers of former writers stands for itself (its exactness is its own). Left out:
    the tables of writers that a revision supersedes (frozen, replaced: waiting for them
    would wait for good) and the mirrors of other active revisions."""
    own = {a.table for a in affected} | {a.mirror for a in affected}
    writers = {a.writer for a in affected} | {
        revision_job_name(a.writer, revision_id) for a in affected
    }
    superseded = repo.superseded_writers(session)
    mirrors = repo.active_mirrors(session)
    found: dict[tuple[str, str], tuple[Table, Job]] = {}
    for table, job in repo.written_tables(session):
        if table.name in own or table.name in mirrors:
            continue
        if job.name in writers or job.name in superseded:
            continue
        kept = job.kind == DERIVED and (
            table.handover_barrier is not None or table.source_until is not None
        )
        found.setdefault((job.name, table.name if kept else ""), (table, job))
    return {table.name: (table, job) for table, job in found.values()}


def _not_exact_at(
    session: Session, ctx: Context, tables: dict[str, tuple[Table, Job]], barrier: int
) -> list[str]:
    """Those of ``tables`` (by name, with their writers) that are not complete and exact
    at ``barrier``."""
    jobs = list({j.id: j for _, j in tables.values()}.values())
    front = fr.frontiers(session, ctx, jobs)
    derived = [t.id for t, j in tables.values() if j.kind == DERIVED]
    exact = barrier_repo.latest_exact_at_or_before(session, derived, barrier)
    return [
        name
        for name, (table, job) in sorted(tables.items())
        if front[job.id] < barrier or (job.kind == DERIVED and exact.get(table.id) != barrier)
    ]
