"""A swap's part in the log store: the swapped tables' logs drop the replaced lineage.

A swapped-in table's history restarts at the revision's barrier: its snapshots after
that are the revision job's, and its batch ids too. What a log service holds of the
original (rows of batches the swap replaced, persisted marks of the old writer's batch
ids) must not reach a reader again. So, once the swap has committed (which un-published
those logs: ``swap_records.finish_swap``), each log service that held the original or the
mirror (each of them, for a log spread over several) is told to reset the table with no
batch kept (``POST /v1/tables/{t}/reset``
``{"after_batch_id": null}``): it drops every entry, forgets the persisted marks (the
next writer's batch ids are taken whatever they are) and holds nothing in full until
that writer's own reset; its epoch moves on, so a reader following it gets
``log_reset`` and re-reads the table's snapshots, now the swapped-in table's.

Best effort: the swap is committed, and a log service that cannot be reached does not
fail it. One warning names what could not be dropped. Readers made by
``LogReader.from_metaservice`` still never follow the old rows: the table has no log
published, and they check where its log is (on every reset, while the log is down, and
every ``check_log_seconds``), so they leave that log service and read the table's
snapshots until a writer publishes a log again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from metaservice.logstore import proof, wire
from metaservice.logstore.client import LogApiError, LogWriter
from metaservice.logstore.probe import signed_credential
from metaservice.revisions.swap_records import ReplacedLog

log = logging.getLogger(__name__)

# How long asking one log service may take (to connect, then to answer): the swap has
# committed and its answer waits for this.
LOG_RESET_TIMEOUT_S = 2.0


def drop_replaced(
    revision_id: int,
    logs: list[ReplacedLog],
    verify: Callable[[int, str, str], str | None] | None = None,
) -> None:
    """Reset each log with no batch kept; never raises (one warning for what failed).
    ``verify`` (auth on): a log service that checks tokens is sent a credential signed
    under its own token, once it proved it holds one (:mod:`metaservice.logstore.proof`)."""
    failed: list[str] = []
    unreachable: set[str] = set()  # asked once per swap: each table would wait again
    for replaced in logs:
        # A log spread over several services: each holds a part of the table's rows.
        for address in replaced.address.split():
            where = f"{replaced.table} at {address}"
            if address in unreachable:
                failed.append(f"{where}: not asked, unreachable")
                continue
            try:
                credential = (
                    signed_credential(address, proof.RESET, replaced.table, verify)
                    if verify is not None
                    else None
                )
                with LogWriter(address, timeout=LOG_RESET_TIMEOUT_S, token=credential) as writer:
                    epoch = writer.reset(replaced.table, after_batch_id=None)
            except LogApiError as exc:
                if exc.code == wire.TABLE_UNKNOWN_CODE:
                    continue  # it holds nothing of the table (a restarted log service)
                failed.append(f"{where}: {exc}")
            except Exception as exc:  # the swap is committed: nothing here may fail it
                unreachable.add(address)
                failed.append(f"{where}: {exc}")
            else:
                log.info(
                    "revision %d: the log of %s dropped the replaced rows (epoch %d)",
                    revision_id, where, epoch,
                )  # fmt: skip
    if failed:
        log.warning(
            "revision %d is swapped, but these logs could not drop the replaced tables' "
            "rows: %s. The tables' logs are un-published, so readers made by "
            "LogReader.from_metaservice read the tables' snapshots until a writer "
            "publishes a log again; a reader given one of these addresses itself may "
            "still read old rows there until that log service restarts",
            revision_id,
            "; ".join(failed),
        )
