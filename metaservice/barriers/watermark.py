"""The watermark ``S``: why a consistent-version read never writes.

``S`` lives on the clock row (``clock.watermark``). It is raised once a slot, to the
raiser's last closed slot, and never lowered. Every transaction that gives a source
batch a barrier it chose (a new batch, the replay of an abandoned one) or that floors
an offline grant reads ``S`` *after* taking the watermark lock shared; the raiser takes
it exclusively. On PostgreSQL that lock is a transaction-level advisory lock
(``pg_advisory_xact_lock_shared`` / ``pg_advisory_xact_lock``) whose key is derived
from ``current_schema()``, so two deployments (or two test schemas) in one database
never contend; on SQLite writers are serialised, and no lock is needed.

**The invariant (W).** Once a raise to ``S`` has committed, every barrier given to a
source batch by a transaction that had not read ``S`` yet is above ``S``, and every
offline floor granted afterwards is above ``S``. Proof: a transaction that read the
old value held the lock shared, so the raise waited for it to commit (its batch or
floor is recorded before the raise is); one that reads after the raise reads the new
value, since it took the lock after the raiser released it at commit, and the
statement that reads ``S`` runs after the lock statement (a statement's snapshot is
taken when it starts). A source barrier is ``max(now slot, last issued, frontier +
interval, the job's newest barrier, S + interval)``: above ``S`` whatever the replica's
own clock says, so a replica whose clock is behind the raiser's still assigns above it.
An offline claim lies at or above its grant's floor.

**Frontier of a source job** (:func:`~metaservice.barriers.frontiers.frontiers`), a
function of recorded state read in ONE statement (``S`` with the job's row and its
oldest open barrier):

    min(max(sealed, S if idle else min(oldest open - interval, S)), floor - interval)

(``floor``: the offline grant's floor, when the job holds one). Every barrier at or
below it is complete: below the sealed frontier by the seal's own argument (written
under the job's row lock, which barrier assignment holds); at or below ``S`` by (W);
below the oldest open barrier since a job's batches never go back; below the floor by
the grant.

**G1: versions are consistent and never go back.** A version's barrier is at most
every member's frontier, and a derived job's frontier is its last committed barrier;
so consistency is the argument above plus the exactness of derived jobs
(``versions/service.py``). It never goes back: each term only grows with recorded
state, and the formula does as state changes.

- ``S`` and ``sealed`` only grow; the floor only grows while a grant stands, and a
  release removes the cap.
- A batch opening on an idle job at ``b``: ``b >= S + interval`` for the ``S`` the
  reader sees with the open batch, or an older one (W), so ``min(b - interval, S) = S``.
  A batch opening while others are open leaves the oldest open barrier as it was.
- A batch completing moves the oldest open barrier up, or makes the job idle (and
  ``S >= min(b - interval, S)``); the commit that empties it also seals the job under
  its row lock, which only raises ``sealed``.
- An abandon is a completion for the frontier (and seals too).
- A first grant floors at ``max(now slot, sealed + interval, S + interval)`` read under
  the lock, so the cap ``floor - interval`` is at least the frontier a reader saw
  before it; renewals never lower the floor.

Every term is shared state, never a replica's clock: two replicas whose clocks differ
give the same frontier for the same committed state, so a version read from one and
then from the other never goes back. (The old frontier capped an open batch's
``oldest open - interval`` at the reader's closed slot: a replica whose clock was
behind could answer less than one ahead had.)

**G2: the bound.** ``S`` trails the last closed slot by at most the time between two
raises: the advancer (``barriers/advancer.py``) raises it as each slot starts, so an
idle source's frontier is the last closed slot once the tick ran, and one slot below
it at worst before (a tick late by more than a slot, e.g. a stalled leader, adds the
delay). Idle derived jobs are advanced by the same tick, after the raise, not by
readers: a derived job that became idle-advanceable just after a tick (an input that
committed) is advanced at the next one. So a consistent version trails what the
reader's own write step used to give (today's bound, see ``frontiers.aligned_target``)
by at most one slot plus the tick's duration.
"""

from __future__ import annotations

from sqlalchemy import bindparam, select, text, update
from sqlalchemy.orm import Session

from metaservice.context import Context
from metaservice.models import ClockState

# Advisory lock class ids (the first key of the two-key form); the second key is
# hashtext(current_schema()), so each schema has its own locks.
WATERMARK_LOCK = 7_246_032  # barrier assignment and grants shared, the raiser exclusive
ADVANCER_LOCK = 7_246_033  # the idle advancer's leader (session-level) and its ticks
PINS_LOCK = 7_246_034  # leases of all tables shared, expiry reservations exclusive
_SHARED = text("SELECT pg_advisory_xact_lock_shared(:k, hashtext(current_schema()))")
_EXCLUSIVE = text("SELECT pg_advisory_xact_lock(:k, hashtext(current_schema()))")
_READ = select(ClockState.watermark).where(ClockState.id == 1)
_RAISE = (
    update(ClockState)
    .where(ClockState.id == 1, ClockState.watermark < bindparam("slot"))
    .values(watermark=bindparam("slot"))
    .execution_options(synchronize_session=False)
)


_HELD_SHARED = "metaservice.watermark_held_shared"  # session.info: the transaction holding it
# session.info: (transaction, S) as read under the lock held shared by that transaction
_READ_HELD = "metaservice.watermark_read_held"


def on_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def hold_xact_lock(session: Session, class_id: int, *, exclusive: bool) -> None:
    """Take advisory lock ``class_id`` of this schema to the end of the transaction
    (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers)."""
    if on_postgres(session):
        session.execute(_EXCLUSIVE if exclusive else _SHARED, {"k": class_id})


def hold_shared(session: Session) -> None:
    """Take the watermark lock shared, to the end of the transaction, before ``S`` is
    read (by a later statement) to choose a source barrier or an offline floor. Taken
    once per transaction: a barrier request that carries an offline-grant promise needs
    it for both."""
    if not on_postgres(session):
        return
    transaction = session.get_transaction()
    if transaction is not None and session.info.get(_HELD_SHARED) is transaction:
        return
    hold_xact_lock(session, WATERMARK_LOCK, exclusive=False)
    session.info[_HELD_SHARED] = transaction


def read(session: Session) -> int:
    """``S`` as the transaction sees it now."""
    return session.execute(_READ).scalar_one()


def held(session: Session, value: int) -> int:
    """Keep ``S`` as a statement of this write transaction read it after
    :func:`hold_shared`; answers it."""
    session.info[_READ_HELD] = (session.get_transaction(), value)
    return value


def read_held(session: Session) -> int:
    """``S`` for a write transaction that took the lock shared (:func:`hold_shared`),
    read once: until it commits no raise can, since the raiser takes the lock
    exclusively (on SQLite writers are serialised), so a second read would answer the
    same. A barrier request carrying an offline-grant promise reads it for both."""
    kept = session.info.get(_READ_HELD)
    if kept is not None and kept[0] is session.get_transaction():
        return int(kept[1])
    return held(session, read(session))


def raise_to_closed_slot(session: Session, ctx: Context) -> int | None:
    """Raise ``S`` to the last closed slot of this replica's clock (in this write
    transaction, under the watermark lock held exclusively); the new value, or None
    when it was there already (nothing written, no lock taken)."""
    slot = ctx.closed_slot()
    if read(session) >= slot:
        return None
    hold_xact_lock(session, WATERMARK_LOCK, exclusive=True)
    raised = session.execute(_RAISE, {"slot": slot}).rowcount  # type: ignore[attr-defined]
    session.info.pop(_READ_HELD, None)  # this transaction moved it
    return slot if raised else None


def is_stale(ctx: Context, watermark: int) -> bool:
    """Whether ``S`` is below this replica's last closed slot (a raise would move it)."""
    return watermark < ctx.closed_slot()
