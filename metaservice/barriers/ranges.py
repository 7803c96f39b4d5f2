"""What a derived batch reads: each input's snapshot range between two barriers, by
the MetaService's own barrier-to-snapshot mapping, and a batch as answered with them.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as repo
from metaservice.barriers.schemas import BatchBarrier, InputRange
from metaservice.context import Context
from metaservice.errors import Conflict, Invalid
from metaservice.models import Batch, Job, Table
from metaservice.topology import repository as topo


def input_ranges(
    session: Session, ctx: Context, job_name: str, after: int, to: int
) -> list[InputRange]:
    """What a derived batch (after, to] reads from each input, by the MetaService's own
    barrier-to-snapshot mapping; 409 while ``to`` is beyond an input's frontier."""
    job = topo.require_job(session, job_name)
    if to < after:
        raise Invalid(f"to ({to}) is before after ({after})", field="to")
    inputs = topo.input_tables(session, job.id)
    writers = topo.jobs_by_ids(session, [t.writer_id for t in inputs if t.writer_id])
    fronts = fr.frontiers(session, ctx, list(writers.values()))
    for table in inputs:
        if table.writer_id is None or fronts[table.writer_id] < to:
            raise Conflict(
                f"input '{table.name}' of job '{job.name}' is not final at barrier {to} yet",
                field="to",
                code="not_final",
            )
    return ranges_of(session, inputs, after, to)


def ranges_of(session: Session, inputs: Sequence[Table], after: int, to: int) -> list[InputRange]:
    ids = [table.id for table in inputs]
    starts, ends = repo.snapshots_at_barriers(session, ids, [after, to])
    return [
        InputRange(
            table=table.name,
            from_barrier=after,
            to_barrier=to,
            from_snapshot=starts[table.id],
            to_snapshot=ends[table.id],
        )
        for table in inputs
    ]


def batch_view(
    session: Session, job: Job, batch: Batch, inputs: Sequence[Table] | None = None
) -> BatchBarrier:
    """The batch as answered; ``inputs``, when the caller just read them, saves the
    lookup of the batch's recorded inputs."""
    ranges: list[InputRange] = []
    if batch.start_barrier is not None:
        if inputs is None:
            inputs = repo.batch_input_tables(session, job.id, batch.batch_id) or topo.input_tables(
                session, job.id
            )
        ranges = ranges_of(session, inputs, batch.start_barrier, batch.barrier)
    return BatchBarrier(
        job=job.name,
        batch_id=batch.batch_id,
        barrier=batch.barrier,
        start_barrier=batch.start_barrier,
        committed=batch.committed,
        inputs=ranges,
    )
