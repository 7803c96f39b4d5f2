from __future__ import annotations

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response

from metaservice.auth.schemas import Role
from metaservice.auth.whoami import log_probe
from metaservice.barriers.schemas import MAX_SIGNED_64
from metaservice.deps import Paging, Services, json_response, paging, require, services, services_of
from metaservice.errors import Invalid
from metaservice.names import JOB_PATTERN
from metaservice.schemas_common import Page, error_responses
from metaservice.topology import service, views
from metaservice.topology.schemas import (
    JobEvent,
    JobSpec,
    JobView,
    SnapshotView,
    TableLogSpec,
    TableLogStatus,
    TableView,
)

router = APIRouter(tags=["topology"], dependencies=[require(Role.READER)])
# Listener events: after a batch's barrier and report, the most frequent request of a
# running job. As the hot barrier routes: the writer role only, async, the answer
# serialised by its own model (issue 13).
events = APIRouter(tags=["topology"], dependencies=[require(Role.WRITER)])
JobName = Path(description="Job name", pattern=JOB_PATTERN)

# RFC 7240's preference for an answer without a representation.
RETURN_MINIMAL = "return=minimal"


def wants_minimal(prefer: str | None) -> bool:
    """Whether a ``Prefer`` header asks for ``return=minimal`` (RFC 7240: preferences
    separated by commas, each with optional ``;`` parameters; names case-insensitive)."""
    if not prefer:
        return False
    for preference in prefer.split(","):
        token, _, value = preference.split(";", 1)[0].partition("=")
        if token.strip().lower() == "return" and value.strip().strip('"').lower() == "minimal":
            return True
    return False


@router.put(
    "/jobs/{job}",
    response_model=JobView,
    status_code=200,
    responses={201: {"model": JobView}, **error_responses(400, 409, 413)},
    dependencies=[require(Role.WRITER)],
)
def put_job(
    spec: JobSpec, response: Response, job: str = JobName, s: Services = Depends(services)
) -> JobView:
    """Register or update a job. Refuses a cycle or a second writer for a table (409)."""
    view, created = s.db.write(lambda session: service.put_job(session, s.ctx, job, spec))
    if created:
        response.status_code = 201
    return view


@router.get("/jobs", response_model=Page[JobView], responses=error_responses(413))
def list_jobs(page: Paging = Depends(paging), s: Services = Depends(services)) -> Page[JobView]:
    return s.db.read(lambda session: views.list_jobs(session, s.ctx, page.limit, page.offset))


@router.get("/jobs/{job}", response_model=JobView, responses=error_responses(404))
def get_job(job: str, s: Services = Depends(services)) -> JobView:
    return s.db.read(lambda session: views.get_job(session, s.ctx, job))


@events.post(
    "/jobs/{job}/events",
    response_model=JobView,
    responses={
        204: {
            "description": "Recorded, without the job's view: the answer to "
            "`Prefer: return=minimal`",
            "headers": {
                "Preference-Applied": {
                    "description": "`return=minimal`",
                    "schema": {"type": "string"},
                }
            },
        },
        **error_responses(400, 404, 413),
    },
)
async def job_event(
    http: Request,
    job: str,
    event: JobEvent,
    prefer: str | None = Header(
        None,
        description="`return=minimal` (RFC 7240): answer 204 with no body instead of the "
        "job's view, which costs the service more than recording the event. The Spark "
        "listener sends it; without it the answer is 200 with the view",
        examples=[RETURN_MINIMAL],
    ),
) -> Response:
    """Liveness and progress of a job's streaming query (sent by the Spark listener).

    Answers the job's view (200), or with `Prefer: return=minimal` nothing (204, with
    `Preference-Applied: return=minimal`).
    """
    s = services_of(http)
    if wants_minimal(prefer):
        await s.db.write_async(lambda session: service.record_event(session, s.ctx, job, event))
        return Response(status_code=204, headers={"Preference-Applied": RETURN_MINIMAL})
    view = await s.db.write_async(
        lambda session: views.job_view(
            session, s.ctx, service.record_event(session, s.ctx, job, event)
        )
    )
    return json_response(view)


@router.delete(
    "/jobs/{job}",
    status_code=204,
    responses=error_responses(404, 409),
    dependencies=[require(Role.ADMIN)],
)
def delete_job(job: str, s: Services = Depends(services)) -> Response:
    """Remove a job, its edges and its barrier history; its output tables lose their writer.

    Refused with 409 while another job reads one of its outputs.
    """
    s.db.write(lambda session: service.delete_job(session, s.ctx, job))
    return Response(status_code=204)


@router.get("/tables", response_model=Page[TableView], responses=error_responses(413))
def list_tables(page: Paging = Depends(paging), s: Services = Depends(services)) -> Page[TableView]:
    return s.db.read(lambda session: views.list_tables(session, s.ctx, page.limit, page.offset))


@router.get("/tables/{table}", response_model=TableView, responses=error_responses(404))
def get_table(table: str, s: Services = Depends(services)) -> TableView:
    return s.db.read(lambda session: views.get_table(session, s.ctx, table))


@router.put(
    "/tables/{table}/log",
    response_model=TableView,
    responses=error_responses(400, 404, 413),
    dependencies=[require(Role.WRITER)],
)
async def put_table_log(
    table: str, spec: TableLogSpec, s: Services = Depends(services)
) -> TableView:
    """Publish the table's log store: its mode ('embedded' in the writing driver, or
    'external') and its service's address. Readers find the log here. With auth on, 422
    ``log_address_unverified`` unless the log service there proves it holds a writer token
    (or its address is in the allowlist; with an allowlist, only such addresses)."""
    why = await log_probe(s).publishable(spec.all_addresses())
    if why is not None:
        raise Invalid(why, field="address", code="log_address_unverified")
    return await s.db.write_async(
        lambda session: service.put_table_log(session, s.ctx, table, spec)
    )


@router.get(
    "/tables/{table}/log",
    response_model=TableLogStatus,
    responses=error_responses(404),
)
async def get_table_log(table: str, s: Services = Depends(services)) -> TableLogStatus:
    """The table's log: its mode and address as published, and what its log service holds
    now (epoch, entries, memory, first and last offsets, the last persisted batch,
    readers), asked within one 2 s deadline. A log service that does not answer (or does
    not prove it is one) gives ``reachable: false`` and why. 404 ``not_found`` for an
    unknown table, 404 ``no_log`` for a table without a log (the message says how to
    enable one)."""
    # The database is read and released first; the log services are asked from the event
    # loop, so no request thread waits on them.
    log = await s.db.read_async(lambda session: views.table_log(session, table))
    return await views.table_log_status(table, log, log_probe(s))


@router.delete(
    "/tables/{table}/log",
    response_model=TableView,
    responses=error_responses(404),
    dependencies=[require(Role.WRITER)],
)
def delete_table_log(table: str, s: Services = Depends(services)) -> TableView:
    """The table has no log any more."""
    return s.db.write(lambda session: service.delete_table_log(session, s.ctx, table))


@router.get(
    "/tables/{table}/snapshots",
    response_model=Page[SnapshotView],
    responses=error_responses(404, 413),
)
def table_snapshots(
    table: str,
    from_barrier: int | None = Query(
        None, ge=0, le=MAX_SIGNED_64, description="Only barriers >= this"
    ),
    to_barrier: int | None = Query(
        None, ge=0, le=MAX_SIGNED_64, description="Only barriers <= this"
    ),
    page: Paging = Depends(paging),
    s: Services = Depends(services),
) -> Page[SnapshotView]:
    """The barrier-to-snapshot mapping of a table, oldest first."""
    return s.db.read(
        lambda session: views.table_snapshots(
            session, table, from_barrier, to_barrier, page.limit, page.offset
        )
    )
