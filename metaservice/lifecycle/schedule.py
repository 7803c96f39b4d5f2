"""The opt-in expiry schedule: a background thread of the service that expires every
table's unused snapshots on a period (``expire_every_seconds``, ``metaservice start
--expire-every 10m``).

One table's failure (its catalog entry missing, storage unreachable) is logged and the
round goes on with the next table; the next round tries it again. Every process runs its
own schedule (``--workers N``, replicas): rounds may overlap, and an expiry is safe to
run twice at once (each reserves under the table's lock; a snapshot or file another run
removed first is skipped).
"""

from __future__ import annotations

import logging
import threading

from metaservice.context import Context
from metaservice.db import Database
from metaservice.lifecycle import service
from metaservice.lifecycle.expiry import CatalogLoader, expire_table
from metaservice.lifecycle.schemas import ExpiryResult

log = logging.getLogger(__name__)


def expire_all(
    db: Database, ctx: Context, load_catalog: CatalogLoader | None = None
) -> dict[str, ExpiryResult | Exception]:
    """One round: expire every table with reported snapshots, each on its own; a
    table's failure is logged and returned, never raised."""
    outcome: dict[str, ExpiryResult | Exception] = {}
    for table in db.read(service.tables_to_expire):
        try:
            outcome[table] = expire_table(db, ctx, table, load_catalog=load_catalog)
        except Exception as exc:
            log.warning("scheduled expiry of %s failed: %s", table, exc, exc_info=exc)
            outcome[table] = exc
    removed = sum(r.snapshots_removed for r in outcome.values() if isinstance(r, ExpiryResult))
    failed = sorted(t for t, r in outcome.items() if isinstance(r, Exception))
    log.info(
        "expiry round: %d tables, %d snapshots expired%s",
        len(outcome),
        removed,
        f", failed: {', '.join(failed)}" if failed else "",
    )
    return outcome


class ExpirySchedule:
    """Runs :func:`expire_all` every ``period`` seconds on a daemon thread until stopped."""

    def __init__(
        self,
        db: Database,
        ctx: Context,
        period: float,
        load_catalog: CatalogLoader | None = None,
    ) -> None:
        self.db, self.ctx, self.period = db, ctx, period
        self.load_catalog = load_catalog
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metaservice-expiry", daemon=True)

    def start(self) -> ExpirySchedule:
        log.info("expiring unused snapshots every %g s", self.period)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60) -> None:
        """Stop after the round under way, if any (waits up to ``timeout`` for it)."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the expiry round under way did not finish within %g s", timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                expire_all(self.db, self.ctx, self.load_catalog)
            except Exception:  # the table list itself (database unreachable): next round
                log.exception("expiry round failed; the next one is in %g s", self.period)
            self.rounds += 1


def start_schedule(db: Database, ctx: Context) -> ExpirySchedule | None:
    """The schedule the settings ask for, started; None when it is off."""
    period = ctx.settings.expire_every_seconds
    if not period:
        return None
    return ExpirySchedule(db, ctx, period).start()
