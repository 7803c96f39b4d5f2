"""The expiry plan, its reservation (G5), and retention policies.

A snapshot is in use while it is the current snapshot, kept by the table's retention
policy (its own, else the service's default), inside a live lease, the start
position of a derived job reading the table, the start of an active revision's mirror
(which reads the files it reaches), or named by a tag that has not ended.
Only snapshots older than the oldest in-use one may be expired, tagged ones excepted:
a tag keeps its own snapshot and holds no other back (as an Iceberg tag does). Snapshots an expiry removed (see ``lifecycle.expiry``) are
recorded and no longer part of any plan.

Every registered reader counts, running or not: a stopped job restarts from its
start position, and expiring that would break it.

The plan (:func:`expiry_plan`) is a read: it lists what is not in use as it reads,
and a lease taken a moment later may pin one of those snapshots again. So an
executor reserves first (:func:`reserve_expiry`): under the table's row lock, which
every lease grant takes too, the plan is recomputed and the table's expiry horizon
raised to the barrier of the oldest snapshot in use. From then on no consistent
version or lease is handed out on a snapshot below the horizon (see
``versions.service``), so what the reservation returns stays unused until the
executor has expired it. A lease committed before the reservation is in the
recomputed plan; one asked for after it waits for the lock and sees the horizon.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from sqlalchemy.orm import Session

from metaservice.context import Context
from metaservice.errors import Invalid, NotFound
from metaservice.lifecycle import repository as repo
from metaservice.lifecycle.repository import Reported
from metaservice.lifecycle.schemas import ExpiryPlan, PlannedSnapshot, Retention, RetentionUpdate
from metaservice.models import DERIVED, Table
from metaservice.names import check_table_name
from metaservice.revisions import service as revisions
from metaservice.revisions import swap
from metaservice.topology import repository as topo
from metaservice.versions import repository as lease_repo
from metaservice.versions.tags import service as tags


def expiry_plan(
    session: Session, ctx: Context, table: str, *, for_expiry: bool = False
) -> ExpiryPlan:
    """What may be expired now, and why each other snapshot is kept (a read: see
    :func:`reserve_expiry` for what an executor may act on). ``for_expiry``: an expiry
    asks, and the mirror of an active revision is refused (409 ``revision_pending``)."""
    check_table_name(table)
    if for_expiry:
        revisions.refuse_pending_mirror(session, table)
        swap.refuse_unfinished_swap(session, [table], "expiring")
    return _plan(session, ctx, topo.require_table(session, table))


def reserve_expiry(session: Session, ctx: Context, table: str) -> ExpiryPlan:
    """Reserve the table's expirable snapshots for an executor (a write transaction).

    Returns the plan recomputed under the table's lock, with ``expirable`` exactly the
    snapshots the executor may now expire; the horizon it raised keeps any version or
    lease from naming them again::

        plan = db.write(lambda session: reserve_expiry(session, ctx, "ods.orders"))
        expire_snapshots(plan.expirable)  # still not in use, whatever runs meanwhile
    """
    check_table_name(table)
    revisions.refuse_pending_mirror(session, table)
    swap.refuse_unfinished_swap(session, [table], "expiring")
    found = topo.require_table(session, table)
    lease_repo.hold_pins_lock(session, exclusive=True)  # leases of all tables
    locked = lease_repo.lock_tables(session, [found.id], exclusive=True)
    if not locked:
        raise NotFound(f"table '{table}' was deleted while this request ran", field="table")
    t = locked[0]
    plan = _plan(session, ctx, t)
    if plan.kept:
        # The oldest snapshot in use, not a tagged one below it: a tag keeps only its own
        # snapshot, and no version is handed out on the snapshots expired around it.
        horizon = next(k.barrier for k in plan.kept if k.snapshot_id == plan.oldest_in_use)
        if t.expiry_horizon is None or t.expiry_horizon < horizon:
            repo.raise_expiry_horizon(session, t.id, horizon)
            plan.expiry_horizon = horizon
    return plan


def _plan(session: Session, ctx: Context, t: Table) -> ExpiryPlan:
    snapshots = repo.reported_snapshots(session, t.id)
    if not snapshots:
        return ExpiryPlan(
            table=t.name,
            oldest_in_use=None,
            expiry_horizon=t.expiry_horizon,
            expirable=[],
            kept=[],
        )
    reasons = _in_use(session, ctx, t, snapshots)
    oldest = min(reasons)
    # Added after the oldest is found: a tag keeps its own snapshot and holds no other
    # one back, as Iceberg's expiry keeps a tagged snapshot and nothing around it.
    for i, why in _tagged(session, ctx, t, snapshots).items():
        reasons[i].extend(why)
    plan = [
        PlannedSnapshot(
            snapshot_id=c.snapshot_id,
            barrier=c.barrier,
            batch_id=c.batch_id,
            reasons=reasons.get(i, [])
            or (["newer than the oldest snapshot in use"] if i > oldest else []),
        )
        for i, c in enumerate(snapshots)
    ]
    return ExpiryPlan(
        table=t.name,
        oldest_in_use=snapshots[oldest].snapshot_id,
        expiry_horizon=t.expiry_horizon,
        expirable=[p for p in plan[:oldest] if not p.reasons],
        kept=[p for i, p in enumerate(plan) if i >= oldest or p.reasons],
    )


def _tagged(
    session: Session, ctx: Context, t: Table, snapshots: list[Reported]
) -> dict[int, list[str]]:
    """Why each tagged snapshot is kept, by its position in ``snapshots``. A tagged
    snapshot no longer among them (its writer was deleted) is no concern of the plan:
    its Iceberg tag keeps it in the table, and an expiry never removes a ref's head."""
    position = {c.snapshot_id: i for i, c in enumerate(snapshots)}
    reasons: dict[int, list[str]] = defaultdict(list)
    for tagged in tags.live_on_table(session, ctx, t.id):
        if tagged.snapshot_id in position:
            until = "" if tagged.expires_ms is None else f" until {tagged.expires_ms}"
            reasons[position[tagged.snapshot_id]].append(f"tag {tagged.name}{until}")
    return reasons


def _in_use(
    session: Session, ctx: Context, t: Table, snapshots: list[Reported]
) -> dict[int, list[str]]:
    """Why each snapshot in use is, by its position in ``snapshots`` (never empty)."""
    table_id = t.id
    reasons: dict[int, list[str]] = defaultdict(list)
    position = {c.snapshot_id: i for i, c in enumerate(snapshots)}
    now = ctx.now_ms()
    last = len(snapshots) - 1
    reasons[last].append("current snapshot")
    policy = _retention(session, ctx, t)
    for i in range(max(0, len(snapshots) - policy.keep_last), len(snapshots)):
        reasons[i].append(f"retention: one of the newest {policy.keep_last}")
    if policy.keep_for_seconds:
        young = now - policy.keep_for_seconds * 1000
        for i, c in enumerate(snapshots):
            if c.created_ms >= young:
                reasons[i].append(f"retention: younger than {policy.keep_for_seconds} s")
    for lease_id, expires, snapshot in lease_repo.live_lease_snapshots(session, table_id, now):
        if snapshot is None:
            continue
        if snapshot in position:
            reasons[position[snapshot]].append(f"lease {lease_id} until {expires}")
        else:
            # Its report went with its deleted writer, so where it stands among these is
            # unknown: keep them all rather than guess.
            reasons[0].append(
                f"lease {lease_id} until {expires} pins snapshot {snapshot}, which is no "
                "longer among the reported snapshots (its writer was deleted): all are kept "
                "while it lasts"
            )
    for kept in revisions.kept_snapshots(session, table_id):
        if kept.snapshot_id in position:
            reasons[position[kept.snapshot_id]].append(f"revision {kept.revision_id}")
        else:
            reasons[0].append(
                f"revision {kept.revision_id} starts a mirror at snapshot {kept.snapshot_id}, "
                "which is no longer among the reported snapshots (its writer was deleted): "
                "all are kept while it is active"
            )
    barriers = [c.barrier for c in snapshots]
    for reader in topo.reader_jobs(session, table_id):
        if reader.kind != DERIVED:
            continue
        # The latest snapshot at or below the reader's frontier; none there: it reads
        # from the very first snapshot.
        start = max(0, bisect_right(barriers, reader.frontier) - 1)
        reasons[start].append(
            f"start position of job '{reader.name}' (committed up to barrier {reader.frontier})"
        )
    return reasons


def record_expired(
    session: Session, ctx: Context, table: str, snapshots: list[PlannedSnapshot]
) -> None:
    """Record that an expiry removed ``snapshots`` of ``table`` (a write transaction):
    no plan lists them again."""
    t = topo.require_table(session, table)
    removed = [Reported(s.snapshot_id, s.barrier, s.batch_id, 0) for s in snapshots]
    repo.record_expired(session, t.id, removed, ctx.now_ms())


def tables_to_expire(session: Session) -> list[str]:
    """The tables an expiry round looks at: those with reported snapshots."""
    return repo.tables_with_snapshots(session)


# -- retention ------------------------------------------------------------------------------


def get_retention(session: Session, ctx: Context, table: str) -> Retention:
    check_table_name(table)
    return _retention(session, ctx, topo.require_table(session, table))


def put_retention(session: Session, ctx: Context, table: str, body: RetentionUpdate) -> Retention:
    """Set the table's whole policy (a field left out follows the default)."""
    check_table_name(table)
    if body.keep_last is None and body.keep_for_seconds is None:
        raise Invalid(
            'give keep_last, keep_for_seconds or both, e.g. {"keep_last": 10}; to go back '
            "to the service's defaults, DELETE the table's retention",
            field="body",
        )
    t = topo.require_table(session, table)
    repo.set_retention(session, t.id, body.keep_last, body.keep_for_seconds, ctx.now_ms())
    return _retention(session, ctx, t)


def delete_retention(session: Session, ctx: Context, table: str) -> Retention:
    """Drop the table's own policy: the service's defaults apply again."""
    check_table_name(table)
    t = topo.require_table(session, table)
    repo.delete_retention(session, t.id)
    return _retention(session, ctx, t)


def _retention(session: Session, ctx: Context, t: Table) -> Retention:
    own = repo.retention(session, t.id)
    keep_last = own.keep_last if own else None
    keep_for = own.keep_for_seconds if own else None
    return Retention(
        table=t.name,
        keep_last=ctx.settings.retention_keep_last if keep_last is None else keep_last,
        keep_for_seconds=(
            ctx.settings.retention_keep_for_seconds if keep_for is None else keep_for
        ),
        keep_last_is_default=keep_last is None,
        keep_for_seconds_is_default=keep_for is None,
    )
