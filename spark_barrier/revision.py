"""Revision mode: running a job of a revision (``register(..., revision=ID)``).

A revision (``POST /api/v1/revisions``) mirrors a table and everything downstream of it
from a barrier, and registers for each affected writer a *revision job*
``<job>__rev<ID>`` that writes the mirrors and reads its affected inputs from their
mirrors (its other inputs from the originals). A driver runs that job by registering the
original job's name, inputs and outputs with ``revision=ID``: everything the job's code
names by the original tables (``job.source``, ``job.sink``, ``ctx.input``,
``ctx.read``) is then read from or written to the revision's tables, and the job's
barriers, exactness and exactly-once are those of any job, under the revision job's name.

Once the revision is swapped, the mirrors carry the originals' names and the revision
job is their writer: a driver registered with ``revision=ID`` then runs the revision job
on the tables by their own names. A driver running when the swap happens names the
mirrors still; it stops, and is restarted with the same code (and ``revision=ID``) from
its checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from metaservice.client import MetaServiceClient, NotFoundError

ACTIVE_STATES = ("planned", "running", "ready", "swapping")
SWAPPED = "swapped"


class RevisionModeError(ValueError):
    """The job cannot run in the revision asked for (see the message)."""


@dataclass(frozen=True)
class RevisionJob:
    """What a job runs as in a revision: its name there, and where its tables are."""

    revision: int
    job: str  # the revision job's name
    tables: Mapping[str, str]  # an original table -> the mirror the job uses instead

    def table(self, name: str) -> str:
        return self.tables.get(name, name)


def revision_job(client: MetaServiceClient, job: str, revision: int) -> RevisionJob:
    """The revision job that runs ``job`` in revision ``revision``."""
    try:
        found = client.get_revision(revision)
    except NotFoundError as exc:
        raise RevisionModeError(
            f"job '{job}' cannot run in revision {revision}: the MetaService knows no such "
            "revision (metaservice revision status lists them)"
        ) from exc
    if found.state not in (*ACTIVE_STATES, SWAPPED):
        raise RevisionModeError(
            f"job '{job}' cannot run in revision {revision}: the revision is {found.state}"
        )
    entry = next((r for r in found.must_run if r.job == job), None)
    if entry is None:
        runs = sorted(r.job for r in found.must_run)
        raise RevisionModeError(
            f"job '{job}' has no part in revision {revision} of {found.table} (its jobs: "
            f"{runs}); run it normally, or register one of those jobs"
        )
    if found.state == SWAPPED:
        # The mirrors carry the originals' names now, and the revision job writes them.
        return RevisionJob(revision, entry.revision_job, {})
    tables = {m.table: m.mirror for m in [*entry.outputs, *entry.mirror_inputs]}
    return RevisionJob(revision, entry.revision_job, tables)
