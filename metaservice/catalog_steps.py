"""Changing a catalog outside the MetaService's database in steps, since no transaction
spans the two. Two shapes, for two kinds of change:

- **All or nothing** (:func:`all_or_nothing`, on an :class:`UndoLog`): each step done is
  remembered with its undo; when a later step, or the record that follows, fails, the
  steps done are undone newest first and the record made before them is forgotten.
  Making a revision's mirrors (``revisions.mirrors``) and publishing a tag
  (``versions.tags.publish``) are two::

      all_or_nothing(
          "making the mirrors",
          [(partial(create, m), partial(drop, m)) for m in mirrors],
          finish=mark_planned,
          forget=forget_the_record,
      )

- **Forward to the end** (:func:`resume`): a change the MetaService has committed to
  already (its records changed) cannot be undone; its steps are journaled in that same
  commit and are finished, however often it takes. Each step asks the catalog whether it
  is done before it acts (so a step whose reply was lost is not done twice), and is
  recorded done once the catalog shows it is. The swap of a revision is one
  (``revisions.swap``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class UndoLog:
    """The steps done so far, each with its undo."""

    def __init__(self) -> None:
        self._undos: list[Callable[[], None]] = []

    def run(self, do: Callable[[], T], undo: Callable[[T], Any]) -> T:
        """Do a step; ``undo`` is given what ``do`` returned, should it be undone."""
        done = do()
        self._undos.append(lambda: undo(done))
        return done

    def undo_all(self) -> None:
        """Undo every step done, newest first. Every undo is tried; the first failure is
        raised after them all (what could not be undone is logged)."""
        failed: Exception | None = None
        while self._undos:
            try:
                self._undos.pop()()
            except Exception as exc:
                log.warning("undoing a catalog step failed", exc_info=exc)
                failed = failed or exc
        if failed is not None:
            raise failed


class UndoFailed(Exception):
    """A change failed (``cause``), and undoing it failed too (``error``): what was done
    may be left, with the record that names it."""

    def __init__(self, cause: Exception, error: Exception) -> None:
        super().__init__(f"undoing after {type(cause).__name__} failed: {error}")
        self.cause = cause
        self.error = error


def all_or_nothing(
    what: str,
    steps: Iterable[tuple[Callable[[], Any], Callable[[Any], Any]]],
    *,
    finish: Callable[[], R],
    forget: Callable[[], object],
) -> R:
    """Do each step (``(do, undo)``, ``undo`` given what ``do`` returned), then ``finish``
    (the record that says it is done), and return what that returns. Should any of them
    fail, the steps done are undone newest first, then ``forget`` drops the record made
    before the steps, and what failed is raised: nothing is left. Should the undo fail
    too, :class:`UndoFailed` is raised (``what`` names the change in the log)."""
    undo = UndoLog()
    try:
        for do, undo_step in steps:
            undo.run(do, undo_step)
        return finish()
    except Exception as exc:
        log.warning("%s failed (%s); undoing it", what, exc)
        try:
            undo.undo_all()
            forget()
        except Exception as failed:
            log.exception("undoing %s failed", what)
            raise UndoFailed(exc, failed) from failed
        raise


class StepBlocked(Exception):
    """The catalog is in a state the step cannot move on from (neither done nor doable):
    someone changed it outside the MetaService. Its message says what to fix."""


@dataclass(frozen=True)
class Step:
    """One journaled step. ``done``: does the catalog show it done already (raises
    :class:`StepBlocked` when it can be neither done nor found done)? ``act``: do it."""

    position: int
    what: str
    done: Callable[[], bool]
    act: Callable[[], object]


def resume(steps: Iterable[Step], record_done: Callable[[Step], None]) -> list[Step]:
    """Finish the steps not recorded done, in order, recording each once the catalog shows
    it done; returns the steps this call acted on. Raises what a step raised, with the
    journal where it stopped: calling again carries on from there."""
    acted = []
    for step in steps:
        if not step.done():
            step.act()
            acted.append(step)
            if not step.done():
                raise StepBlocked(f"{step.what}: the catalog does not show it done after it")
        record_done(step)
    return acted
