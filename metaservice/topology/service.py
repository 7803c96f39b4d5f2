"""Registering jobs (the topology stays a DAG with one writer per table) and viewing them."""

from __future__ import annotations

import json

import networkx as nx
from sqlalchemy import delete
from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.context import Context
from metaservice.contract import slot_of
from metaservice.errors import Conflict, Invalid
from metaservice.models import DERIVED, SOURCE, Job, JobInput, Table
from metaservice.names import check_job_name, check_table_name
from metaservice.revisions import repository as revision_repo
from metaservice.topology import repository as repo
from metaservice.topology.graph import job_node, table_node, topology_version
from metaservice.topology.schemas import (
    JobEvent,
    JobSpec,
    JobView,
    TableLogSpec,
    TableView,
)
from metaservice.topology.views import get_table, job_view


def put_job(session: Session, ctx: Context, name: str, spec: JobSpec) -> tuple[JobView, bool]:
    """Register or update a job. Returns the job and whether it was created."""
    check_job_name(name)
    inputs = _unique_tables(spec.inputs, "inputs")
    outputs = _unique_tables(spec.outputs, "outputs")
    both = sorted(set(inputs) & set(outputs))
    if both:
        raise Conflict(
            f"job '{name}' would read and write {both[0]}: a job may not feed itself",
            field="inputs",
            code="cycle",
        )
    existing = repo.job_by_name(session, name)
    current_inputs: list[str] = []
    if existing is not None:
        barrier_repo.lock_job(session, existing.id)
        current_inputs = _check_identity(session, existing, inputs, outputs)
    repo.bump_topology_version(session)  # serialises topology changes from here on
    _check_writers(session, name, outputs)
    _check_acyclic(session, ctx, name, inputs, outputs)
    _check_revisions(session, existing, inputs, outputs)
    kind = DERIVED if inputs else SOURCE  # unchanged for a job that has run
    floor = _check_takeover(session, ctx, existing, name, kind, outputs)
    job = existing or _create_job(session, ctx, name)
    if existing is not None and (kind != job.kind or set(inputs) != set(current_inputs)):
        # A job that never ran (_check_identity): its plans were made for the old
        # inputs, and would end its first batch where those inputs allowed.
        repo.drop_plans(session, job.id)
        job.pending_target = None
    job.description = spec.description
    job.updated_ms = ctx.now_ms()
    _set_edges(session, ctx, job, inputs, outputs)  # hands released outputs over as of old
    job.kind = kind
    if floor is not None:
        _take_over(session, job, floor)
    session.flush()
    return job_view(session, ctx, job), existing is None


def delete_job(session: Session, ctx: Context, name: str) -> None:
    """Remove a job that no other job depends on: its edges, its barrier history, and
    the writer link of its output tables (the tables stay, writerless, for a new writer)."""
    job = repo.require_job(session, name)
    barrier_repo.lock_job(session, job.id)
    repo.bump_topology_version(session)  # serialises topology changes from here on
    outputs = repo.output_tables(session, job.id)
    readers = repo.readers_of_tables(session, [t.id for t in outputs])
    for table in outputs:
        if readers.get(table.id):
            raise Conflict(
                f"job '{name}' cannot be deleted: its output '{table.name}' is read by "
                f"{', '.join(repr(r) for r in readers[table.id])}; delete or re-register "
                "those jobs first",
                field="job",
                code="has_readers",
            )
    _refuse_during_revision(
        session, outputs, f"job '{name}', its writer, cannot be deleted", "delete it", "job"
    )
    _hand_over(session, ctx, job, outputs)
    repo.delete_job(session, job.id)


def _check_identity(session: Session, job: Job, inputs: list[str], outputs: list[str]) -> list[str]:
    """Job changes (DESIGN.md): once a job has run, its kind and inputs are what its
    outputs mean, so they cannot change in place; an output can be added, and removed
    only while no batch is open (the batch would wait for it for good). Returns the
    job's current inputs."""
    current_inputs, current_outputs = (
        edges.get(job.id, []) for edges in repo.edges_of_jobs(session, [job.id])
    )
    kind = DERIVED if inputs else SOURCE
    if (kind != job.kind or set(inputs) != set(current_inputs)) and barrier_repo.has_batches(
        session, job.id
    ):
        change = (
            f"from a {job.kind} job to a {kind} job"
            if kind != job.kind
            else f"inputs from {sorted(current_inputs)} to {sorted(inputs)}"
        )
        raise Conflict(
            f"job '{job.name}' has run, so its kind and inputs are fixed; it cannot change "
            f"{change}. Run the new logic as a new job (a new name, writing new tables), "
            f"revise its tables from a barrier, or delete the job (DELETE "
            f"/api/v1/jobs/{job.name}: its tables keep their history, and the job registered "
            "again starts above it) and register it again. Nothing was changed",
            field="inputs",
            code="job_identity_changed",
        )
    removed = sorted(set(current_outputs) - set(outputs))
    still_open = barrier_repo.open_batch(session, job.id) if removed else None
    if still_open is not None:
        raise Conflict(
            f"job '{job.name}' cannot stop writing {removed} while its batch "
            f"{still_open.batch_id} (barrier {still_open.barrier}) is open: the batch would "
            "wait for those outputs for good. Let it commit (or abandon it: POST "
            f"/api/v1/jobs/{job.name}/batches/{still_open.batch_id}/abandon), then retry. "
            "Nothing was changed",
            field="outputs",
            code="batch_open",
        )
    return current_inputs


def _refuse_during_revision(
    session: Session, tables: list[Table], refused: str, action: str, field: str
) -> None:
    """Revision (DESIGN.md): the affected set is the downstream closure at the swap. A
    reader or output added while a revision runs would be left on the replaced table,
    so the edit waits for the swap (or the revision's cancel)."""
    revised = revision_repo.active_overlapping(session, [t.id for t in tables])
    if not revised:
        return
    revision, table = revised[0]
    raise Conflict(
        f"'{table}' is being revised (revision {revision}), so {refused}: at the swap "
        "the edit would be left on the replaced table. Wait for the swap (POST "
        f"/api/v1/revisions/{revision}/swap) or cancel the revision (DELETE "
        f"/api/v1/revisions/{revision}), then {action}. Nothing was changed",
        field=field,
        code="revision_running",
    )


def _check_revisions(
    session: Session, job: Job | None, inputs: list[str], outputs: list[str]
) -> None:
    """While a revision runs, no job starts reading one of its affected tables, and no
    affected table's writer gains or loses an output (nor does an affected table change
    writer)."""
    current_inputs: list[str] = []
    current_outputs: list[str] = []
    if job is not None:
        current_inputs, current_outputs = (
            edges.get(job.id, []) for edges in repo.edges_of_jobs(session, [job.id])
        )
    new_inputs = sorted(set(inputs) - set(current_inputs))
    found = repo.tables_by_names(session, new_inputs)
    _refuse_during_revision(
        session,
        [found[n] for n in new_inputs if n in found],
        "no job may start reading it",
        "register the job",
        "inputs",
    )
    if set(outputs) != set(current_outputs):
        both = sorted(set(outputs) | set(current_outputs))
        found = repo.tables_by_names(session, both)
        _refuse_during_revision(
            session,
            [found[n] for n in both if n in found],
            "the outputs of its writer may not change",
            "change them",
            "outputs",
        )


def _check_takeover(
    session: Session, ctx: Context, job: Job | None, name: str, kind: str, outputs: list[str]
) -> int | None:
    """Moving an output to another job (or deleting a job and registering another
    writer) keeps the table's history and frontier (DESIGN.md). Returns the barrier
    the new writer must start above, or None when no output it takes on has a history;
    refused when the new writer could not keep the table's exact barriers."""
    tables = [t for t in repo.tables_by_names(session, outputs).values() if t.writer_id is None]
    stamped = repo.last_commit_barriers(session, [t.id for t in tables])
    taken = {t.name: t for t in tables if t.handover_barrier is not None or t.id in stamped}
    if not taken:
        return None
    table = taken[min(taken)]
    reaches = {n: max(t.handover_barrier or 0, stamped.get(t.id, 0)) for n, t in taken.items()}
    floor = max(reaches.values())
    keep = f"Nothing was changed; '{table.name}' keeps its history either way"
    if job is not None and barrier_repo.open_batch(session, job.id) is not None:
        raise Conflict(
            f"job '{name}' cannot take on '{table.name}', which has a history up to "
            f"barrier {floor}, while a batch of it is open: its frontier, held below that "
            f"batch, would take the table's back. Let the batch commit, then retry. {keep}",
            field="outputs",
            code="batch_open",
        )
    current_slot = slot_of(ctx.now_ms(), ctx.interval)
    if floor > current_slot:
        # The history reaches a slot not yet over (an offline claim ahead of the clock):
        # the new writer would have to start ahead of the clock, so one job's skew would
        # move another's barriers.
        raise Conflict(
            f"job '{name}' cannot take on '{table.name}' yet: its history reaches barrier "
            f"{floor}, a slot of the MetaService's clock still to come (now "
            f"{current_slot}). Retry once that slot has passed. {keep}",
            field="outputs",
            code="history_ahead",
        )
    grant = job.offline_floor if job is not None else None
    if grant is not None and grant <= floor:
        # Its driver may give itself barriers from the grant's floor on while the
        # MetaService is unreachable: at or below the table's history.
        raise Conflict(
            f"job '{name}' holds an offline grant from barrier {grant}, at or below the "
            f"history of '{table.name}' (up to barrier {floor}): a batch it gives itself "
            "offline could stamp the table there. Retry once the job has reported in past "
            f"that barrier (its grant renews every slot), or release the grant first. {keep}",
            field="outputs",
            code="offline_grant",
        )
    if kind == SOURCE and any(t.handover_kind != SOURCE for t in taken.values()):
        raise Conflict(
            f"source job '{name}' cannot take on '{table.name}': its history up to "
            f"barrier {floor} was written by a {table.handover_kind or 'derived'} job, so "
            "it is exact only at the barriers that job committed, while a source's table "
            "counts as exact at every barrier. Write it from a derived job that has not run "
            f"yet, or write a new table. {keep}",
            field="outputs",
            code="history_kind",
        )
    if kind == DERIVED and job is not None and barrier_repo.has_batches(session, job.id):
        raise Conflict(
            f"derived job '{name}' has run, so it is exact at barriers of its own, and "
            f"taking on '{table.name}' (history up to barrier {floor}) would name the "
            "table at them: versions already handed out for it would change. Write it "
            f"from a new derived job (one that has not run), or write a new table. {keep}",
            field="outputs",
            code="history_kind",
        )
    if kind == DERIVED:
        _check_one_start(job, name, outputs, reaches, floor, keep)
    return floor


def _check_one_start(
    job: Job | None,
    name: str,
    outputs: list[str],
    reaches: dict[str, int],
    floor: int,
    keep: str,
) -> None:
    """A derived job writes every output from one frontier, which taking on a table
    moves up to its history: each of its outputs must have a history that far. An
    output that has none (the job's own, new, or one with a shorter history) would miss
    its inputs' changes up to there (G1), and starting lower would write them a second
    time into the table that has them. ``reaches``: the barrier each table taken on has
    a history up to."""
    start = job.frontier if job is not None else 0
    if floor <= start:
        return
    behind = sorted(n for n in outputs if reaches.get(n, start) < floor)
    if behind:
        table = max(reaches, key=lambda n: (reaches[n], n))
        raise Conflict(
            f"derived job '{name}' cannot take on '{table}', which has a history up to "
            f"barrier {floor}, beside {', '.join(repr(n) for n in behind)}, which "
            f"{'has' if len(behind) == 1 else 'have'} none that far: the job writes every "
            "output from one frontier, so its first batch would skip its inputs' changes "
            f"up to barrier {floor} for {'that table' if len(behind) == 1 else 'those'}, "
            f"or write them into '{table}' a second time. Take the table on from a "
            "derived job of its own (one whose outputs all have that history), or write "
            f"a new table. {keep}",
            field="outputs",
            code="history_gap",
        )


def _take_over(session: Session, job: Job, floor: int) -> None:
    """The new writer starts above the history of the tables it took on: a source's
    batches get barriers above its frontier, and a derived job's first batch starts
    after it, so neither stamps a table at or below a barrier it already holds data for."""
    if floor > job.frontier:
        job.frontier = floor
    if job.kind == DERIVED:
        repo.drop_plans(session, job.id)  # made for a first batch starting lower
        job.pending_target = None


def _hand_over(session: Session, ctx: Context, job: Job, tables: list[Table]) -> None:
    """The tables lose their writer: each keeps how far that writer answered for it, and
    its kind, for the next writer (see :func:`_check_takeover`), and where that writer
    made it exact, since versions handed out named it there: every barrier up to its
    frontier for a source job, the barriers it committed for a derived one (its batches
    stop being the table's, or go with the job)."""
    if not tables:
        return
    frontier = fr.shown_frontiers(session, ctx, [job])[job.id]
    for table in tables:
        if job.kind == SOURCE:
            table.source_until = max(table.source_until or 0, frontier)
        else:
            above = max(table.handover_barrier or 0, table.source_until or 0)
            barrier_repo.keep_exact_barriers(session, job.id, [table.id], above, frontier)
        table.handover_barrier = max(table.handover_barrier or 0, frontier)
        table.handover_kind = job.kind


def _unique_tables(names: list[str], field: str) -> list[str]:
    for i, name in enumerate(names):
        check_table_name(name, field=f"{field}.{i}")
    if len(set(names)) != len(names):
        raise Invalid(f"{field} lists a table twice", field=field)
    return names


def _check_writers(session: Session, job_name: str, outputs: list[str]) -> None:
    for table in repo.tables_by_names(session, outputs).values():
        if table.writer_id is None:
            continue
        writer = session.get(Job, table.writer_id)
        if writer is not None and writer.name != job_name:
            raise Conflict(
                f"table '{table.name}' is already written by job '{writer.name}'; "
                "a table has exactly one writer",
                field="outputs",
                code="second_writer",
            )


def _check_acyclic(
    session: Session, ctx: Context, job_name: str, inputs: list[str], outputs: list[str]
) -> None:
    """A cycle would appear iff an input is reachable from an output without this job."""
    # Called after this transaction bumped the version and before it changed any
    # edge, so the session sees exactly the graph of the previous version.
    graph = ctx.graph.get(session, version=topology_version(session) - 1)
    view = nx.restricted_view(graph, [job_node(job_name)], [])
    wanted = {table_node(t) for t in inputs}
    for out in outputs:
        node = table_node(out)
        if node not in view:
            continue
        reached = wanted & (nx.descendants(view, node) | {node})
        if reached:
            first = sorted(reached)[0].removeprefix("table:")
            raise Conflict(
                f"job '{job_name}' would close a cycle: '{first}' is downstream of its "
                f"output '{out}'",
                field="inputs",
                code="cycle",
            )


def _create_job(session: Session, ctx: Context, name: str) -> Job:
    now = ctx.now_ms()
    job = Job(
        name=name,
        description="",
        kind=SOURCE,
        frontier=0,
        open_batches=0,
        status="registered",
        created_ms=now,
        updated_ms=now,
    )
    session.add(job)
    session.flush()
    return job


def _ensure_tables(session: Session, ctx: Context, names: list[str]) -> dict[str, Table]:
    tables = repo.tables_by_names(session, names)
    for name in names:
        if name not in tables:
            tables[name] = Table(name=name, created_ms=ctx.now_ms())
            session.add(tables[name])
    session.flush()
    return tables


def _set_edges(
    session: Session, ctx: Context, job: Job, inputs: list[str], outputs: list[str]
) -> None:
    tables = _ensure_tables(session, ctx, inputs + outputs)
    session.execute(delete(JobInput).where(JobInput.job_id == job.id))
    for name in inputs:
        session.add(JobInput(job_id=job.id, table_id=tables[name].id))
    released = [t for t in repo.output_tables(session, job.id) if t.name not in outputs]
    _hand_over(session, ctx, job, released)
    for table in released:
        table.writer_id = None
    for name in outputs:
        if tables[name].writer_id != job.id:
            # Taken on from the job's next batch: one opened before was opened without it.
            tables[name].writer_first_batch = barrier_repo.next_batch_id(session, job.id)
        tables[name].writer_id = job.id


def put_table_log(session: Session, ctx: Context, name: str, spec: TableLogSpec) -> TableView:
    """Publish where the table's log service runs, or its services (its writer, on
    start). Several addresses share the column, separated by spaces (they hold none)."""
    if (spec.address is None) == (spec.addresses is None):
        raise Invalid(
            "give address (one log service) or addresses (several), not both",
            field="address",
            code="invalid_request",  # as the request schema's own refusals
        )
    table = repo.require_table(session, name)
    table.log_mode, table.log_address = spec.mode, " ".join(spec.all_addresses())
    table.log_updated_ms = ctx.now_ms()
    session.flush()
    return get_table(session, ctx, name)


def delete_table_log(session: Session, ctx: Context, name: str) -> TableView:
    """The table has no log any more (its writer stopped its embedded one, say)."""
    table = repo.require_table(session, name)
    table.log_mode = table.log_address = table.log_updated_ms = None
    session.flush()
    return get_table(session, ctx, name)


def record_event(
    session: Session, ctx: Context, name: str, event: JobEvent, job: Job | None = None
) -> Job:
    """Liveness from the Spark listener: status, last progress, last seen. Returns the
    job's row; its view (:func:`job_view`: edges, frontier) costs more statements than
    recording the event, so the endpoint builds it only for callers that want it.
    ``job``: its row already read in this transaction (a barrier request carrying the
    event), not read again."""
    job = job if job is not None else repo.require_job(session, name)
    job.status = {"started": "running", "progress": "running"}.get(event.event, event.event)
    # Through the ORM, not a plain UPDATE: the OpenLineage emitter sees a listener event
    # in the flush (metaservice/openlineage/emit.py). Flushed with the transaction's other
    # changes to the row (a carried offline-grant promise): one UPDATE.
    job.last_event = json.dumps(event.model_dump(exclude_none=True))
    job.last_seen_ms = ctx.now_ms()
    return job
