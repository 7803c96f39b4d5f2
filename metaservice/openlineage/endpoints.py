"""``POST /lineage``: OpenLineage events in, as Marquez takes them."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool

from metaservice.auth.schemas import Role
from metaservice.deps import Services, require, services
from metaservice.http_guard import bad_string
from metaservice.openlineage import service
from metaservice.openlineage.schemas import EVENT_BODY_SCHEMA, IngestResult
from metaservice.schemas_common import error_responses

router = APIRouter(tags=["lineage"], dependencies=[require(Role.WRITER)])
INGEST_PATH = "/lineage"


@router.post(
    INGEST_PATH,
    response_model=IngestResult,
    status_code=201,
    responses={
        200: {"model": IngestResult, "description": "A duplicate, or an ignored event type"},
        **error_responses(400, 413, 415),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": EVENT_BODY_SCHEMA}},
        }
    },
)
async def post_lineage(
    request: Request, response: Response, s: Services = Depends(services)
) -> IngestResult:
    """Ingest an OpenLineage RunEvent, JobEvent or DatasetEvent (spec 2-0-x), plain or
    gzip (`Content-Encoding: gzip`), as `openlineage-python`'s HTTP transport sends it.

    The same event again (a client's retry) is recorded once (200 `duplicate`); an
    event type the service does not know is acknowledged and ignored (200 `ignored`). Its
    jobs and datasets show in `GET /lineage` as observed, beside the barrier topology and
    without its single-writer rule; an Iceberg dataset named by location is matched to its
    table by its `symlinks` facet. A bad event is 400 with the JSON path of the problem
    (`path`), and nothing is stored; so is one holding a NUL character or an unpaired
    surrogate anywhere. The body must be sent as `application/json` (415 otherwise).
    """
    body = service.decode_body(
        await request.body(),
        request.headers.get("content-encoding"),
        s.ctx.settings.max_body_bytes,
    )
    # Checked here, not on the way in: a gzip body only now that it is inflated.
    if (found := bad_string(body)) is not None:
        where, problem = found
        raise service.BadEvent(
            f"holds {problem}, which the service does not store", service.json_path(where)
        )
    try:
        parsed = service.parse_event(body)
        if parsed is None:
            response.status_code = 200
            return IngestResult(status="ignored")
        result = await run_in_threadpool(
            s.db.write, lambda session: service.record(session, s.ctx, parsed)
        )
    except RecursionError:  # json and pydantic recurse per level: nothing was stored
        raise service.BadEvent(
            "the event is nested too deeply to be read (keep it under a few hundred levels)",
            code="too_deep",
        ) from None
    if result.status != "recorded":
        response.status_code = 200
    return result
