"""The expiry plan (G5): a snapshot is in use while it is the current snapshot, kept by
the retention policy, inside a live lease, or the start position of a derived job
reading the table. Only snapshots older than the oldest in-use one are expirable.

Every registered reader counts, running or not: a stopped job restarts from its
start position, and expiring that would break it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from metaservice.barriers import repository as barrier_repo
from metaservice.context import Context
from metaservice.lifecycle.schemas import ExpiryPlan, PlannedSnapshot
from metaservice.models import DERIVED, Commit
from metaservice.names import check_table_name
from metaservice.topology import repository as topo
from metaservice.versions import repository as lease_repo


class Reported(NamedTuple):
    """A reported snapshot of the table (batches that wrote no rows have none)."""

    snapshot_id: int
    barrier: int
    batch_id: int
    created_ms: int


def expiry_plan(session: Session, ctx: Context, table: str) -> ExpiryPlan:
    check_table_name(table)
    t = topo.require_table(session, table)
    snapshots = [
        Reported(snapshot_id or 0, barrier, batch_id, created_ms)  # filtered: never null
        for snapshot_id, barrier, batch_id, created_ms in session.execute(
            select(Commit.snapshot_id, Commit.barrier, Commit.batch_id, Commit.created_ms)
            .where(Commit.table_id == t.id, Commit.snapshot_id.is_not(None))
            .order_by(Commit.barrier, Commit.batch_id)
        )
    ]
    if not snapshots:
        return ExpiryPlan(table=table, oldest_in_use=None, expirable=[], kept=[])
    reasons = _in_use(session, ctx, t.id, snapshots)
    position = {c.snapshot_id: i for i, c in enumerate(snapshots)}
    oldest = min(position[s] for s in reasons)
    plan = [
        PlannedSnapshot(
            snapshot_id=c.snapshot_id,
            barrier=c.barrier,
            batch_id=c.batch_id,
            reasons=reasons.get(c.snapshot_id, [])
            or (["newer than the oldest snapshot in use"] if i > oldest else []),
        )
        for i, c in enumerate(snapshots)
    ]
    return ExpiryPlan(
        table=table,
        oldest_in_use=snapshots[oldest].snapshot_id,
        expirable=plan[:oldest],
        kept=plan[oldest:],
    )


def _in_use(
    session: Session, ctx: Context, table_id: int, snapshots: list[Reported]
) -> dict[int, list[str]]:
    reasons: dict[int, list[str]] = defaultdict(list)
    now = ctx.now_ms()
    reasons[snapshots[-1].snapshot_id].append("current snapshot")
    keep_last = ctx.settings.retain_last_snapshots
    for c in snapshots[-keep_last:]:
        reasons[c.snapshot_id].append(f"retention: one of the newest {keep_last}")
    if ctx.settings.retain_seconds:
        horizon = now - ctx.settings.retain_seconds * 1000
        for c in snapshots:
            if c.created_ms >= horizon:
                reasons[c.snapshot_id].append(
                    f"retention: younger than {ctx.settings.retain_seconds} s"
                )
    for lease_id, expires, snapshot in lease_repo.live_lease_snapshots(session, table_id, now):
        if snapshot is not None:
            reasons[snapshot].append(f"lease {lease_id} until {expires}")
    for reader in topo.reader_jobs(session, table_id):
        if reader.kind != DERIVED:
            continue
        start = barrier_repo.snapshot_at(session, table_id, reader.frontier)
        # No snapshot at the reader's start: it reads from the very first snapshot.
        pinned = start if start is not None else snapshots[0].snapshot_id
        reasons[pinned].append(
            f"start position of job '{reader.name}' (committed up to barrier {reader.frontier})"
        )
    return reasons
