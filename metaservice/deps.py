"""FastAPI dependencies: the service's context, its database, paging, and the caller's role.

Routes declare the least role they need, and nothing else does authorisation::

    router = APIRouter(dependencies=[require(Role.READER)])

    @router.post("/commits", dependencies=[require(Role.WRITER)])

The dependencies are ``async``: FastAPI runs a plain ``def`` dependency in its thread
pool, a hop that costs more than these functions do. The one that may block (the token
lookup, only when auth is on) takes that hop itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Depends, Query, Request, Response, params
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from metaservice.auth import repository as auth_repository
from metaservice.auth import service as auth_service
from metaservice.auth.schemas import Role
from metaservice.barriers.changes import Changes
from metaservice.barriers.schemas import MAX_SIGNED_64
from metaservice.context import Context
from metaservice.db import Database
from metaservice.errors import TooLarge, Unauthenticated


@dataclass
class Services:
    ctx: Context
    db: Database
    changes: Changes = field(default_factory=Changes)  # this replica's long-poll wake-ups


def services_of(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def services(request: Request) -> Services:
    return services_of(request)


@dataclass
class Paging:
    limit: int
    offset: int


async def paging(
    request: Request,
    limit: int = Query(100, ge=1, description="Items per page"),
    offset: int = Query(0, ge=0, le=MAX_SIGNED_64, description="Items to skip"),
) -> Paging:
    most = services_of(request).ctx.settings.max_page_size
    if limit > most:
        raise TooLarge(f"limit {limit} is over the page size limit of {most}", field="limit")
    return Paging(limit=limit, offset=offset)


bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="A token from `metaservice token create` or `POST /api/v1/tokens`; "
    "needed only when the service runs with METASERVICE_AUTH_REQUIRED=true.",
)


async def caller(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> auth_service.Caller:
    """Who the request comes from; 401 when auth is on and it brings no known token."""
    s = services_of(request)
    if not s.ctx.settings.auth_required:
        return auth_service.ANONYMOUS_ADMIN
    if credentials is None:
        raise Unauthenticated(
            "this request needs a bearer token: send the header 'Authorization: Bearer <token>'"
        )
    token = credentials.credentials
    return await run_in_threadpool(
        s.db.read, lambda session: auth_service.authenticate(session, token)
    )


def require(role: Role) -> params.Depends:
    """A route dependency refusing callers below ``role`` (401 without a token, 403 below it).

    For the writer role it also holds a scoped writer to its jobs: a route's ``{job}`` must
    be one of them, and a route's ``{table}`` must be written by one (403 ``out_of_scope``).
    Routes taking the job from their body check it themselves (``check_job_scope``).
    """

    async def check(
        request: Request, who: auth_service.Caller = Depends(caller)
    ) -> auth_service.Caller:
        auth_service.check_role(who, role)
        if who.jobs is not None and role is not Role.READER:
            await _check_scope(request, who)
        return who

    return params.Depends(check)


async def _check_scope(request: Request, who: auth_service.Caller) -> None:
    path = request.path_params
    if (job := path.get("job")) is not None:
        auth_service.check_job_scope(who, job)
    if (table := path.get("table")) is not None:
        writer = await run_in_threadpool(
            services_of(request).db.read,
            lambda session: auth_repository.writer_of_table(session, table),
        )
        auth_service.check_table_scope(who, table, writer)


async def metrics_access(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> None:
    """/metrics is open unless METASERVICE_METRICS_PUBLIC=false; then any token will do."""
    if not services_of(request).ctx.settings.metrics_public:
        await caller(request, credentials)


def json_response(model: BaseModel) -> Response:
    """The model as JSON, without FastAPI's validation of a returned model against the
    route's ``response_model`` (the route declares it for the docs): the hot routes'
    answer, serialised once by the model's own serializer."""
    return Response(model.__pydantic_serializer__.to_json(model), media_type="application/json")
