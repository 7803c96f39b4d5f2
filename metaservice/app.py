"""The FastAPI application: routers under /api/v1, JSON errors, limits, metrics."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from metaservice import __version__
from metaservice.auth.endpoints import router as auth_router
from metaservice.auth.whoami import router as whoami_router
from metaservice.barriers.advancer import start_advancer
from metaservice.barriers.endpoints import router as barriers_router
from metaservice.barriers.endpoints import writes as barrier_writes_router
from metaservice.barriers.replica_changes import start_replica_changes
from metaservice.clock import Clock, SystemClock
from metaservice.context import Context
from metaservice.db import Database, database_contended, database_unreachable, schema_behind
from metaservice.delay.endpoints import router as delay_router
from metaservice.deps import Services
from metaservice.docs import install_docs, operation_id
from metaservice.errors import ServiceError
from metaservice.http_guard import CleanInput, install_site_checks
from metaservice.iceberg_rest.catalogs import release as release_catalog
from metaservice.iceberg_rest.endpoints import router as iceberg_rest_router
from metaservice.lifecycle.endpoints import router as lifecycle_router
from metaservice.lifecycle.schedule import start_schedule
from metaservice.lineage.endpoints import router as lineage_router
from metaservice.logs import RequestId
from metaservice.metrics import REQUESTS, observe_version_request
from metaservice.migrate import behind_message, current_revision, head_revision
from metaservice.openlineage.emit import start_emitting
from metaservice.openlineage.endpoints import INGEST_PATH
from metaservice.openlineage.endpoints import router as openlineage_router
from metaservice.ops.endpoints import router as ops_router
from metaservice.revisions.endpoints import router as revisions_router
from metaservice.schemas_common import error_responses
from metaservice.settings import Settings
from metaservice.topology.endpoints import events as topology_events_router
from metaservice.topology.endpoints import router as topology_router
from metaservice.ui import ROUTER_ERRORS as CONSOLE_ERRORS
from metaservice.ui import install_console
from metaservice.ui import router as console_router
from metaservice.versions.endpoints import router as versions_router
from metaservice.versions.tags.endpoints import router as tags_router

log = logging.getLogger("metaservice")
API_PREFIX = "/api/v1"
LINEAGE_INGEST = API_PREFIX + INGEST_PATH
# Every /api/v1 route may answer these (415: a body not sent as JSON); 422 is the service's
# ErrorBody, not FastAPI's
# default HTTPValidationError. Routes declare their other errors (404, 409, 413, ...).
API_ERRORS = error_responses(401, 403, 415, 422)


API_ROUTERS = (
    topology_router,
    topology_events_router,
    barriers_router,
    barrier_writes_router,
    versions_router,
    tags_router,
    revisions_router,
    lineage_router,
    openlineage_router,
    delay_router,
    lifecycle_router,
    auth_router,
    whoami_router,
)


@functools.cache
def shared_routes() -> tuple[BaseRoute, ...]:
    """Every route of the service but the docs' and the console's pages: the routers
    included once per process, into one router the apps it builds all take them from.

    FastAPI builds an included router's routes (each parameter's and model's field) on
    an app's first request through it, again for every app that includes it: 0.1-0.15 s
    per app, where a test process builds one per test (a tenth of test_tags' time, a
    third of a property test's, which builds one per example). Included once, they are
    built once. The routes hold nothing of an app (no
    ``dependency_overrides`` provider: ``app.dependency_overrides`` does not reach them,
    and nothing uses it); ``operation_id`` names them, as the app's own routes."""
    shared = APIRouter(generate_unique_id_function=operation_id)
    for router in API_ROUTERS:
        shared.include_router(router, prefix=API_PREFIX, responses=API_ERRORS)
    shared.include_router(ops_router)
    shared.include_router(iceberg_rest_router)  # /iceberg/v1: the read-only REST catalog
    shared.include_router(console_router, prefix=API_PREFIX, responses=CONSOLE_ERRORS)
    return tuple(shared.routes)


def create_app(settings: Settings | None = None, clock: Clock | None = None) -> FastAPI:
    """Build the service. The database engine is made in the lifespan, not at import.

    >>> app = create_app(Settings(db_url="sqlite:///ms.db"))
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings.db_url, max_transactions=settings.max_transactions)
        app.state.services = Services(
            ctx=Context(settings=settings, clock=clock or SystemClock()), db=db
        )
        log.info(
            "MetaService ready on database %s", db.engine.url.render_as_string(hide_password=True)
        )
        schedule = start_schedule(db, app.state.services.ctx)
        emitting = start_emitting(db, app.state.services.ctx)
        replicas = start_replica_changes(settings.db_url, app.state.services.changes)
        advancer = app.state.advancer = start_advancer(
            db, app.state.services.ctx, app.state.services.changes
        )
        try:
            yield
        finally:
            if advancer is not None:
                advancer.stop()
            if replicas is not None:
                replicas.stop()
            if emitting is not None:
                emitting.stop()
            if schedule is not None:
                schedule.stop()
            release_catalog(settings)  # the REST catalog's connections to the jobs' catalog
            db.dispose()

    app = FastAPI(
        title="MetaService",
        version=__version__,
        summary="Timestamp barriers, lineage and consistent versions for Spark streaming on Iceberg",
        lifespan=lifespan,
        # Served from the package below, not from a CDN: /docs works offline.
        docs_url=None,
        redoc_url=None,
        generate_unique_id_function=operation_id,
    )
    app.router.routes.extend(shared_routes())
    install_docs(app)
    install_console(app)  # the web console's pages at /ui
    _install_error_handlers(app)
    app.add_middleware(ObserveRequests)
    # Inside the body limit, so the body it reads is bounded; the OpenLineage ingest checks
    # its body itself, inflated, and answers in its own form.
    app.add_middleware(CleanInput, api_prefix=API_PREFIX, own_body_check=[LINEAGE_INGEST])
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    install_site_checks(app, settings)  # Host, Origin (and CORS) before any body is read
    app.add_middleware(RequestId)  # outermost: every answer carries its X-Request-ID
    return app


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, **extra}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        field = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        if first.get("type") == "json_invalid":
            return _error(
                400,
                "malformed_json",
                "the request body is not valid JSON: " + str(first.get("msg")),
                field=None,
            )
        details = [
            {"field": ".".join(str(p) for p in e.get("loc", ())[1:]), "message": e.get("msg")}
            for e in errors
        ]
        message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
        return _error(422, "invalid_request", message, field=field, errors=details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        response = _error(exc.status_code, code, str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(_allowed_methods(request))
        return response

    @app.exception_handler(PoolTimeout)
    async def no_connection(request: Request, exc: PoolTimeout) -> JSONResponse:
        log.warning(
            "no free database connection on %s %s: %s", request.method, request.url.path, exc
        )
        return _busy("every database connection of this replica stayed in use")

    @app.exception_handler(DBAPIError)
    async def database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        if schema_behind(exc):
            # Only a database behind this version: on one at the newest migration a
            # missing table or column is the service's own bug (500).
            current = await run_in_threadpool(_revision_or_head, request.app.state.services.db)
            if current != head_revision():
                detail = str(exc.orig).strip().splitlines()[0]
                log.error("%s (%s %s: %s)", behind_message(current), request.method,
                          request.url.path, detail)  # fmt: skip
                return _error(
                    503,
                    "database_behind",
                    f"{behind_message(current)}. It lacks what this request needs "
                    f"({detail}); nothing was applied",
                )
        if database_contended(exc):
            log.warning(
                "transaction kept losing on %s %s: %s", request.method, request.url.path, exc.orig
            )
            return _busy("its transaction kept losing to concurrent ones (deadlock or conflict)")
        if not database_unreachable(exc):
            return await unexpected(request, exc)
        log.warning("database unreachable on %s %s: %s", request.method, request.url.path, exc.orig)
        response = _error(
            503,
            "database_unavailable",
            "the MetaService cannot reach its database; retry shortly. The request was not "
            "applied, or, if the connection dropped while committing, applied once "
            "(registration, barrier, claim, grant and commit requests are idempotent)",
        )
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "internal", "internal error; the service log has the details")


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(request: Request) -> list[str]:
    """The methods some route takes at the request's path. Asked of the router method by
    method: FastAPI makes a route per method, and its 405 names the first one's alone."""
    routes = request.app.router.routes
    return [
        method
        for method in HTTP_METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]


def _revision_or_head(db: Database) -> str | None:
    """The database's migration; the newest one when it cannot be read (say no more
    than the error itself then)."""
    try:
        return current_revision(db.engine)
    except Exception:  # the database went away meanwhile: the request's own error stands
        return head_revision()


def _busy(why: str) -> JSONResponse:
    """503 ``database_busy``: the database is reachable but too contended for now."""
    response = _error(
        503,
        "database_busy",
        f"the MetaService could not apply the request now: {why}. Nothing was applied; "
        "retry shortly (registration, barrier, claim, grant and commit requests are idempotent); if this persists, spread "
        "the load (fewer concurrent requests, long-polling next-barrier) or add replicas",
    )
    response.headers["Retry-After"] = "1"
    return response


class ObserveRequests:
    """ASGI middleware: each answered request's latency by method, route and status.

    Plain ASGI rather than ``app.middleware("http")``: that runs every request in a task
    of its own behind a streaming response, which cost more than the cheap requests.
    A request whose handler raised (answered 500 by the outermost error handler) is
    not counted, as before.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, send_status)
        if status:
            seconds = time.perf_counter() - start
            route = _route_label(scope)
            REQUESTS.labels(scope["method"], route, str(status)).observe(seconds)
            observe_version_request(route, scope["method"], status, seconds)


def _route_label(scope: Scope) -> str:
    """The route's path template (bounded label cardinality), with the API prefix.

    Depending on the FastAPI version the matched route carries its path with or
    without the prefix it was included under; every API router is under API_PREFIX.
    """
    route_path = getattr(scope.get("route"), "path", None)
    if route_path is None:
        return "unmatched"
    path = str(route_path)
    if scope["path"].startswith(API_PREFIX + "/") and not path.startswith(API_PREFIX):
        return API_PREFIX + path
    return path


class BodyLimit:
    """Refuses request bodies over ``max_bytes`` with 413, before they reach a handler."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        # Read the whole body here, before any handler runs: FastAPI answers any error
        # raised from receive() while it reads the body with a 400, not our 413.
        buffered: list[Message] = []
        received = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        response = _error(
            413, "too_large", f"request body over the limit of {self.max_bytes} bytes", field="body"
        )
        await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})
