"""The job a batch request names, locked, and the refusals batch requests share.

Every rule of the barriers package runs inside one write transaction and starts by
locking the job's row (:func:`lock_job_named`), which serialises all changes to one
job's progress across threads and replicas. Then, for a new batch: not of a job a
revision supersedes, not below the job's newest batch, not of another Spark query.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from metaservice.barriers import repository as repo
from metaservice.errors import Conflict
from metaservice.models import Batch, Job
from metaservice.revisions import repository as revision_repo
from metaservice.topology import repository as topo


def lock_job_named(session: Session, name: str) -> Job:
    """The job's row by name, locked (see ``repo.lock_job``), in one statement; 404 for
    an unknown job."""
    job = repo.lock_jobs_by_name(session, [name]).get(name)
    if job is None:
        raise topo.unknown_job(name)
    return job


def check_superseded(session: Session, job: Job) -> None:
    """409 ``superseded`` for a new batch of a job a revision replaces (swapping or
    swapped): its tables are, or are about to be, the revision's. A batch it opened
    before is still answered and its reports are still recorded."""
    refuse_superseded(job, revision_repo.superseding(session, job.name))


def refuse_superseded(job: Job, revision_id: int | None) -> None:
    """:func:`check_superseded` with the superseding revision already read."""
    if revision_id is None:
        return
    raise Conflict(
        f"job '{job.name}' is superseded by revision {revision_id}: its job "
        f"'{job.name}__rev{revision_id}' writes the job's tables from now on, so no new batch "
        f"of '{job.name}' is started. Stop this query; run '{job.name}__rev{revision_id}' "
        "instead",
        field="job",
        code="superseded",
    )


def check_batch_order(job: Job, batch_id: int, newest: Batch | None) -> None:
    """Refuse a new batch below the job's newest (Spark) batch."""
    last = newest.batch_id if newest is not None else None
    if last is not None and batch_id < last:
        raise Conflict(
            f"job '{job.name}' already has batch {last}; batch ids must increase "
            f"(was the Spark checkpoint deleted? register the job under a new name)",
            field="batch_id",
            code="batch_out_of_order",
        )


def check_query(
    session: Session, job: Job, batch_id: int, query_id: str | None, batch: Batch | None
) -> None:
    """Refuse a batch of another Spark query than the one the job's batches came from.

    Spark numbers batches per checkpoint: a reset checkpoint or a query re-created
    under the job's name starts again at 0, and its batches must not be taken for
    replays of the old ones (skipped as committed, or stamped with old barriers).
    """
    if query_id is None:
        return
    check_query_of(job, batch_id, query_id, batch or repo.newest_batch(session, job.id))


def check_query_of(job: Job, batch_id: int, query_id: str | None, known: Batch | None) -> None:
    """:func:`check_query` against a batch already read: the batch itself, or for a new
    batch the job's newest."""
    if query_id is None:
        return
    if known is None or known.query_id is None or known.query_id == query_id:
        return
    raise Conflict(
        f"job '{job.name}' ran batches up to {known.batch_id} in Spark query {known.query_id}, "
        f"but batch {batch_id} comes from query {query_id}: its checkpoint was reset, or a "
        f"new query was started under the job's name. Restart it from its old checkpoint, "
        f"or run the new query as a new job (a new name, writing new tables), or delete the "
        f"job (DELETE /api/v1/jobs/{job.name}) to start its history again",
        field="query_id",
        code="query_reset",
    )
