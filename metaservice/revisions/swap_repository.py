"""Queries of a swap's journal: the catalog steps of a swap through a catalog outside the
MetaService's database (``revisions.swap``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from metaservice.models import RevisionSwapStep

MOVES_ORIGINAL = "original"
MOVES_MIRROR = "mirror"


class Journaled(NamedTuple):
    """One step of a swap's journal: rename ``source`` to ``target`` in the catalog."""

    position: int
    source: str
    target: str
    moves: str  # MOVES_ORIGINAL or MOVES_MIRROR
    done: bool


def add_steps(session: Session, revision_id: int, steps: Sequence[Journaled]) -> None:
    session.add_all(
        RevisionSwapStep(
            revision_id=revision_id,
            position=s.position,
            source=s.source,
            target=s.target,
            moves=s.moves,
            done_ms=None,
        )
        for s in steps
    )
    session.flush()


def steps_of(session: Session, revision_id: int) -> list[Journaled]:
    """The revision's journal in order (empty: no swap through an outside catalog)."""
    rows = session.execute(
        select(
            RevisionSwapStep.position,
            RevisionSwapStep.source,
            RevisionSwapStep.target,
            RevisionSwapStep.moves,
            RevisionSwapStep.done_ms,
        )
        .where(RevisionSwapStep.revision_id == revision_id)
        .order_by(RevisionSwapStep.position)
    )
    return [Journaled(p, s, t, m, done is not None) for p, s, t, m, done in rows]


def mark_done(session: Session, revision_id: int, position: int, now_ms: int) -> None:
    session.execute(
        update(RevisionSwapStep)
        .where(
            RevisionSwapStep.revision_id == revision_id,
            RevisionSwapStep.position == position,
            RevisionSwapStep.done_ms.is_(None),
        )
        .values(done_ms=now_ms)
        .execution_options(synchronize_session=False)
    )


def unfinished_naming(session: Session, tables: Sequence[str]) -> dict[str, int]:
    """Those of ``tables`` that a step of an unfinished journal (one with a step not yet
    done) renames from or to, with the revision whose swap it is."""
    if not tables:
        return {}
    unfinished = select(RevisionSwapStep.revision_id).where(RevisionSwapStep.done_ms.is_(None))
    rows = session.execute(
        select(RevisionSwapStep.revision_id, RevisionSwapStep.source, RevisionSwapStep.target)
        .where(
            RevisionSwapStep.revision_id.in_(unfinished),
            or_(RevisionSwapStep.source.in_(tables), RevisionSwapStep.target.in_(tables)),
        )
        .order_by(RevisionSwapStep.revision_id, RevisionSwapStep.position)
    )
    wanted = set(tables)
    found: dict[str, int] = {}
    for revision_id, source, target in rows:
        for name in (source, target):
            if name in wanted:
                found.setdefault(name, revision_id)
    return found
