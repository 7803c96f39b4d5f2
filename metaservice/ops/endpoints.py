from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from metaservice.auth.schemas import Role
from metaservice.deps import Services, bearer, caller, metrics_access, services, services_of
from metaservice.metrics import exposition, read_state
from metaservice.migrate import behind_message, current_revision, head_revision
from metaservice.schemas_common import ErrorBody

log = logging.getLogger("metaservice.metrics")
router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


async def shows_detail(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> bool:
    """Whether the caller may read why the service is not ready: an admin, as every caller
    is when auth is off. A token is checked against the database, so while that does not
    answer nobody with auth on is told more than a status and a code."""
    if not services_of(request).ctx.settings.auth_required:
        return True
    if credentials is None:
        return False
    try:
        who = await caller(request, credentials)
    except Exception:  # an unknown token, or a database that cannot tell
        return False
    return who.role.includes(Role.ADMIN)


@router.get(
    "/readyz",
    responses={
        503: {
            "description": "database unreachable or behind; the reason's detail only to an "
            "admin (any caller when auth is off), to anyone else a status and a code"
        }
    },
)
def readyz(s: Services = Depends(services), admin: bool = Depends(shows_detail)) -> JSONResponse:
    """Readiness: the database answers and carries the newest migration.

    Anyone may ask (a load balancer has no token); what is wrong in detail (the driver's
    error, which names hosts and ports; the migrations) is for admins and the log only."""
    try:
        with s.db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        current = current_revision(s.db.engine)
    except Exception as exc:  # any driver error means "not ready"
        _log_once("/readyz: the database does not answer: %s", exc)
        return _unavailable(
            "database_unreachable",
            f"the database does not answer: {str(exc)[:500]}",
            admin,
        )
    if current != head_revision():
        _log_once("/readyz: %s", behind_message(current))
        return _unavailable("database_behind", behind_message(current), admin)
    return JSONResponse({"status": "ready", "migration": current if admin else None})


def _unavailable(code: str, detail: str, admin: bool) -> JSONResponse:
    message = (
        detail
        if admin
        else (
            "the service is not ready; the service log (or this answer, to an admin token) says why"
        )
    )
    return JSONResponse(
        {"status": "unavailable", "code": code, "message": message}, status_code=503
    )


_last_logged: list[str] = [""]  # probes ask every few seconds: a reason is logged when it changes


def _log_once(template: str, reason: object) -> None:
    text_ = template % (reason,)
    if text_ != _last_logged[0]:
        _last_logged[0] = text_
        log.warning("%s", text_)


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
