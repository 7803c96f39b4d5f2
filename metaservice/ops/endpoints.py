from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from metaservice.deps import Services, metrics_access, services
from metaservice.metrics import exposition, read_state
from metaservice.migrate import behind_message, current_revision, head_revision
from metaservice.schemas_common import ErrorBody

log = logging.getLogger("metaservice.metrics")
router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "database unreachable or behind"}})
def readyz(s: Services = Depends(services)) -> JSONResponse:
    """Readiness: the database answers and carries the newest migration."""
    try:
        with s.db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        current = current_revision(s.db.engine)
    except Exception as exc:  # any driver error means "not ready", with the reason
        return JSONResponse(
            {"status": "unavailable", "code": "database_unreachable", "message": str(exc)[:500]},
            status_code=503,
        )
    if current != head_revision():
        return JSONResponse(
            {
                "status": "unavailable",
                "code": "database_behind",
                "message": behind_message(current),
            },
            status_code=503,
        )
    return JSONResponse({"status": "ready", "migration": current})


@router.get(
    "/metrics",
    # Documents the answer as text (the Prometheus exposition format), not JSON.
    response_class=PlainTextResponse,
    responses={
        401: {
            "description": "METASERVICE_METRICS_PUBLIC=false and the request has no known token",
            # Spelled out: a `model` here would be documented as text/plain as well.
            "content": {"application/json": {"schema": ErrorBody.model_json_schema()}},
        }
    },
    dependencies=[Depends(metrics_access)],
)
def metrics(s: Services = Depends(services)) -> Response:
    """Prometheus metrics (open unless METASERVICE_METRICS_PUBLIC=false): the process's
    counters, and per table and job the state read from the database."""
    try:
        state = s.db.read(lambda session: read_state(session, s.ctx))
    except Exception as exc:  # the process's metrics still answer; the gauges are absent
        log.warning("/metrics could not read the database: %s", exc)
        state = None
    return Response(exposition(state), media_type=CONTENT_TYPE_LATEST)
