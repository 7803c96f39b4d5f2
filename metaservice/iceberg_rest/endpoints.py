"""``/iceberg/v1/...``: the Iceberg REST catalog, read-only (apache/iceberg
``open-api/rest-catalog-open-api.yaml``).

Served: ``GET /v1/config``, and under the prefix the config hands out, listing
namespaces (``?parent=``), loading and checking (``HEAD``) a namespace, listing tables,
loading and checking a table. Every other operation (creating, committing, renaming,
dropping, views, scan planning) is answered ``406 UnsupportedOperationException``; every
error has the spec's form ``{"error": {"message", "type", "code"}}``. With auth on a
reader token is required (the spec's bearer auth).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials

from metaservice.auth import service as auth_service
from metaservice.deps import Services, bearer, services_of
from metaservice.errors import ServiceError
from metaservice.iceberg_rest import service
from metaservice.iceberg_rest.service import CatalogError, SessionView

PREFIX = "/iceberg"
NAMESPACE_SEPARATOR = "\x1f"  # the spec's default (%1F in paths)

SERVED = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
]

# The spec's error type for a status the service's own errors carry.
_TYPES = {
    400: "BadRequestException",
    401: "NotAuthorizedException",
    403: "ForbiddenException",
    404: "NotFoundException",
    406: "UnsupportedOperationException",
    409: "BadRequestException",
    413: "BadRequestException",
    422: "BadRequestException",
    503: "ServiceUnavailableException",
}


def spec_error(status: int, kind: str, message: str) -> JSONResponse:
    # The spec has no 409 or 422 for reads: such refusals are bad requests.
    code = 400 if status in (409, 413, 422) else status
    headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": code}}, code, headers=headers
    )


class CatalogRoute(APIRoute):
    """A route whose every error, the request's validation included, is answered in the
    REST spec's form rather than the API's ``{"code", "message"}``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except CatalogError as exc:
                return spec_error(exc.status, exc.iceberg_type, exc.message)
            except ServiceError as exc:
                return spec_error(
                    exc.status, _TYPES.get(exc.status, "BadRequestException"), exc.message
                )
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                where = ".".join(str(p) for p in first.get("loc", ()))
                return spec_error(400, "BadRequestException", f"{where}: {first.get('msg')}")

        return route


async def reader(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> None:
    """With auth on, a known token (every role reads). pyiceberg sends ``Bearer None``
    when no token is configured: that is no token, not an unknown one."""
    s = services_of(request)
    if not s.ctx.settings.auth_required:
        return
    token = credentials.credentials if credentials is not None else ""
    if token in ("", "None", "null"):
        raise CatalogError(
            401,
            "NotAuthorizedException",
            "this catalog needs a bearer token: configure the client with token=<a reader "
            "token> (metaservice token create --role reader)",
        )
    await run_in_threadpool(s.db.read, lambda session: auth_service.authenticate(session, token))


# Not in the service's own OpenAPI: the protocol is the Iceberg REST spec's, and the
# tests check the answers against that spec's schemas.
router = APIRouter(
    prefix=PREFIX + "/v1",
    tags=["iceberg-rest-catalog"],
    route_class=CatalogRoute,
    dependencies=[Depends(reader)],
    include_in_schema=False,
)


@router.get("/config")
async def get_config(
    request: Request,
    warehouse: str | None = Query(
        None,
        max_length=300,
        description="consistent (the default), at:<barrier or ISO-8601 time>, or tag:<name>",
    ),
) -> dict[str, Any]:
    """Open a catalog session: its version is fixed now, and the prefix names it."""
    s = services_of(request)
    lease_id = await s.db.write_async(
        lambda session: service.open_session(session, s.ctx, warehouse)
    )
    return {
        "defaults": {},
        "overrides": {"prefix": lease_id},
        "endpoints": SERVED,
    }


async def _session(s: Services, prefix: str, table: str | None = None) -> SessionView:
    view = await s.db.read_async(
        lambda session: service.view_session(session, s.ctx, prefix, table)
    )
    if view.renew:
        await s.db.write_async(lambda session: service.renew_session(session, s.ctx, prefix))
    return view


def _namespace(text: str) -> tuple[str, ...]:
    parts = tuple(text.split(NAMESPACE_SEPARATOR))
    if not all(parts):
        raise CatalogError(400, "BadRequestException", f"namespace '{text}' has an empty part")
    return parts


@router.get("/{prefix}/namespaces")
async def list_namespaces(
    request: Request,
    prefix: str,
    parent: str | None = Query(None, max_length=400),
    page_token: str | None = Query(None, alias="pageToken", max_length=400),
    page_size: int | None = Query(None, alias="pageSize", ge=1),
) -> dict[str, Any]:
    """The namespaces one level below ``parent`` (all pages in one answer)."""
    view = await _session(services_of(request), prefix)
    found = service.namespaces(view, _namespace(parent) if parent else ())
    return {"namespaces": [list(n) for n in found], "next-page-token": None}


@router.get("/{prefix}/namespaces/{namespace}")
async def load_namespace(request: Request, prefix: str, namespace: str) -> dict[str, Any]:
    view = await _session(services_of(request), prefix)
    parts = _namespace(namespace)
    if not service.namespace_exists(view, parts):
        raise service.no_namespace(parts)
    return {"namespace": list(parts), "properties": {}}


@router.head("/{prefix}/namespaces/{namespace}", status_code=204)
async def namespace_exists(request: Request, prefix: str, namespace: str) -> Response:
    view = await _session(services_of(request), prefix)
    found = service.namespace_exists(view, _namespace(namespace))
    return Response(status_code=204 if found else 404)


@router.get("/{prefix}/namespaces/{namespace}/tables")
async def list_tables(
    request: Request,
    prefix: str,
    namespace: str,
    page_token: str | None = Query(None, alias="pageToken", max_length=400),
    page_size: int | None = Query(None, alias="pageSize", ge=1),
) -> dict[str, Any]:
    view = await _session(services_of(request), prefix)
    parts = _namespace(namespace)
    names = service.tables_in(view, parts)
    return {
        "identifiers": [{"namespace": list(parts), "name": n} for n in names],
        "next-page-token": None,
    }


@router.get("/{prefix}/namespaces/{namespace}/tables/{table}")
async def load_table(
    request: Request,
    prefix: str,
    namespace: str,
    table: str,
    snapshots: str = Query("all", pattern="^(all|refs)$"),
) -> dict[str, Any]:
    """The table's metadata pinned to the session's version (see ``iceberg_rest.metadata``)."""
    s = services_of(request)
    parts = _namespace(namespace)
    view = await _session(s, prefix, ".".join((*parts, table)))
    if not view.tables:  # the answer says whether the namespace is there
        view = await _session(s, prefix)
    found = service.table_of(view, parts, table)
    location, metadata = await run_in_threadpool(
        _load, s, found.current, found.snapshot_id, view.barrier, snapshots == "refs"
    )
    return {
        "metadata-location": location,
        "metadata": metadata,
        "config": dict(s.ctx.settings.catalog_table_config),
    }


def _load(
    s: Services, name: str, snapshot_id: int | None, barrier: int, refs_only: bool
) -> tuple[str, dict[str, Any]]:
    from pyiceberg.exceptions import NoSuchTableError

    from metaservice.iceberg_rest import metadata

    try:
        return metadata.load_pinned(s.ctx.settings, name, snapshot_id, barrier, refs_only=refs_only)
    except NoSuchTableError:
        raise CatalogError(
            404,
            "NoSuchTableException",
            f"table '{name}' is known to the MetaService but not to its catalog",
        ) from None
    except metadata.SnapshotGone:
        raise CatalogError(
            404,
            "NoSuchTableException",
            f"snapshot {snapshot_id} of '{name}', which this session reads, is no longer in "
            "the table: attach the catalog again",
        ) from None


@router.head("/{prefix}/namespaces/{namespace}/tables/{table}", status_code=204)
async def table_exists(request: Request, prefix: str, namespace: str, table: str) -> Response:
    parts = _namespace(namespace)
    view = await _session(services_of(request), prefix, ".".join((*parts, table)))
    found = any(t.name == ".".join((*parts, table)) for t in view.tables)
    return Response(status_code=204 if found else 404)


@router.api_route(
    "/{path:path}",
    methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
    include_in_schema=False,
)
async def unsupported(request: Request, path: str) -> Response:
    """Everything else: this catalog only reads."""
    return spec_error(
        406,
        "UnsupportedOperationException",
        f"{request.method} /iceberg/v1/{path[:200]} is not served: the MetaService's catalog "
        "is read-only and serves " + "; ".join(SERVED) + ". Tables are written by barrier "
        "jobs (spark_barrier)",
    )
