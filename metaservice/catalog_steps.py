"""Changing a catalog outside the MetaService's database in steps, since no transaction
spans the two. Two shapes, for two kinds of change:

- **All or nothing** (:class:`UndoLog`): each step done is remembered with its undo; when
  a later step, or the record that follows, fails, the steps done are undone newest
  first. Making a revision's mirrors is one (``revisions.mirrors``)::

      undo = UndoLog()
      try:
          for m in mirrors:
              undo.run(lambda m=m: create(m), lambda made, m=m: drop(m, made))
          record()
      except Exception:
          undo.undo_all()
          raise

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
