"""Views of the topology: jobs and tables as the API shows them (edges, frontiers, log
store status), and a table's barrier-to-snapshot history. Read only; registering and
editing jobs is ``topology.service``."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from metaservice.barriers import frontiers as fr
from metaservice.barriers import repository as barrier_repo
from metaservice.context import Context
from metaservice.errors import Invalid, NotFound
from metaservice.logstore.probe import LogProbe, ProbeAnswer
from metaservice.models import Commit, Job, Table
from metaservice.schemas_common import Page
from metaservice.topology import repository as repo
from metaservice.topology.schemas import (
    JobView,
    LogServiceStatus,
    LogStatus,
    SnapshotView,
    TableLogStatus,
    TableLogView,
    TableView,
)


def job_view(session: Session, ctx: Context, job: Job) -> JobView:
    return job_views(session, ctx, [job])[0]


def job_views(session: Session, ctx: Context, jobs: list[Job]) -> list[JobView]:
    ids = [j.id for j in jobs]
    inputs, outputs = repo.edges_of_jobs(session, ids)
    fronts = fr.shown_frontiers(session, ctx, jobs)
    return [
        JobView(
            name=j.name,
            description=j.description,
            kind=j.kind,
            inputs=inputs.get(j.id, []),
            outputs=outputs.get(j.id, []),
            status=j.status,
            frontier=fronts[j.id],
            last_barrier=j.last_barrier,
            last_batch_id=j.last_batch_id,
            pending_target=j.pending_target,
            last_seen_ms=j.last_seen_ms,
            offline_floor=j.offline_floor,
        )
        for j in jobs
    ]


def list_jobs(session: Session, ctx: Context, limit: int, offset: int) -> Page[JobView]:
    total = session.execute(select(func.count()).select_from(Job)).scalar_one()
    jobs = list(
        session.execute(select(Job).order_by(Job.name).limit(limit).offset(offset)).scalars()
    )
    return Page(items=job_views(session, ctx, jobs), total=total, limit=limit, offset=offset)


def get_job(session: Session, ctx: Context, name: str) -> JobView:
    return job_view(session, ctx, repo.require_job(session, name))


def table_views(session: Session, ctx: Context, tables: list[Table]) -> list[TableView]:
    writers = repo.jobs_by_ids(session, [t.writer_id for t in tables if t.writer_id is not None])
    fronts = fr.shown_frontiers(session, ctx, list(writers.values()))
    readers = repo.readers_of_tables(session, [t.id for t in tables])
    # One statement for the page: a query per table made 1,000 tables cost 1,000 round trips.
    newest = barrier_repo.latest_snapshots(session, [t.id for t in tables])
    now = ctx.now_ms()
    views = []
    for t in tables:
        latest = newest.get(t.id)
        frontier = fronts.get(t.writer_id) if t.writer_id is not None else None
        if frontier is not None and frontier <= 0:
            frontier = None  # a derived writer that never committed: no data yet
        views.append(
            TableView(
                name=t.name,
                writer=writers[t.writer_id].name if t.writer_id in writers else None,
                readers=readers.get(t.id, []),
                frontier=frontier,
                latest_snapshot=latest.snapshot_id if latest else None,
                latest_barrier=latest.barrier if latest else None,
                delay_ms=now - frontier if frontier is not None else None,
                log=_log_view(t),
            )
        )
    return views


def _log_view(table: Table) -> TableLogView | None:
    if table.log_mode is None or table.log_address is None or table.log_updated_ms is None:
        return None
    return TableLogView(
        mode=table.log_mode,
        address=table.log_address,
        addresses=table.log_address.split(),
        updated_ms=table.log_updated_ms,
    )


def list_tables(session: Session, ctx: Context, limit: int, offset: int) -> Page[TableView]:
    total = session.execute(select(func.count()).select_from(Table)).scalar_one()
    tables = list(
        session.execute(select(Table).order_by(Table.name).limit(limit).offset(offset)).scalars()
    )
    return Page(items=table_views(session, ctx, tables), total=total, limit=limit, offset=offset)


def get_table(session: Session, ctx: Context, name: str) -> TableView:
    return table_views(session, ctx, [repo.require_table(session, name)])[0]


def table_log(session: Session, name: str) -> TableLogView:
    """Where the table's log runs, as its writer published it; 404 ``no_log`` when it has
    none, saying how to give it one."""
    view = _log_view(repo.require_table(session, name))
    if view is None:
        raise NotFound(
            f"table '{name}' has no log. Enable it in the job that writes it: "
            'register(..., log="embedded") runs one in its driver; or run '
            '`metaservice log start --port P` and register(..., log="external", '
            'log_url="http://host:P")',
            field="table",
            code="no_log",
        )
    return view


async def table_log_status(name: str, log: TableLogView, probe: LogProbe) -> TableLogStatus:
    """What the table's log services hold now, asked at once within the probe's one
    deadline (:mod:`metaservice.logstore.probe`: only services that prove who they are,
    bounded answers, no foreign body echoed). Called outside any database session."""
    answers = await probe.status(name, log.addresses)
    services = [_service_status(answer) for answer in answers]
    failed = [s for s in services if s.error is not None]
    return TableLogStatus(
        **log.model_dump(),
        table=name,
        reachable=all(s.reachable for s in services),
        status=services[0].status if len(services) == 1 else None,
        error=failed[0].error if failed else None,
        services=services,
    )


def _service_status(answer: ProbeAnswer) -> LogServiceStatus:
    status, error = None, answer.error
    if answer.status is not None:
        try:
            status = LogStatus.model_validate(answer.status)
        except ValueError:
            error = f"{answer.address} did not answer with a log status"
    return LogServiceStatus(
        address=answer.address, reachable=answer.reachable, status=status, error=error
    )


def table_snapshots(
    session: Session,
    name: str,
    from_barrier: int | None,
    to_barrier: int | None,
    limit: int,
    offset: int,
) -> Page[SnapshotView]:
    table = repo.require_table(session, name)
    if from_barrier is not None and to_barrier is not None and from_barrier > to_barrier:
        raise Invalid("from_barrier is after to_barrier", field="from_barrier")
    conditions = [Commit.table_id == table.id]
    if from_barrier is not None:
        conditions.append(Commit.barrier >= from_barrier)
    if to_barrier is not None:
        conditions.append(Commit.barrier <= to_barrier)
    total = session.execute(select(func.count()).where(*conditions)).scalar_one()
    rows = session.execute(
        select(Commit, Job.name)
        .outerjoin(Job, Job.id == Commit.job_id)  # a deleted writer's commits stay
        .where(*conditions)
        .order_by(Commit.barrier, Commit.batch_id)
        .limit(limit)
        .offset(offset)
    )
    items = [
        SnapshotView(
            snapshot_id=c.snapshot_id,
            barrier=c.barrier,
            job=job_name,
            batch_id=c.batch_id,
            reported_ms=c.created_ms,
        )
        for c, job_name in rows
    ]
    return Page(items=items, total=total, limit=limit, offset=offset)
