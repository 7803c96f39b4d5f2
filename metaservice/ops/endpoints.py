from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from metaservice.deps import Services, metrics_access, services
from metaservice.migrate import current_revision, head_revision
from metaservice.schemas_common import ErrorBody

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
    head = head_revision()
    if current != head:
        return JSONResponse(
            {
                "status": "unavailable",
                "code": "database_behind",
                "message": f"database is at migration {current}, this service needs {head}; "
                "run `metaservice db upgrade`",
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
def metrics() -> Response:
    """Prometheus metrics (open unless METASERVICE_METRICS_PUBLIC=false)."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
