"""The API's documentation pages, working offline, and readable OpenAPI operation ids.

``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) load their scripts and styles from
``/docs/assets/``, files shipped in the ``fastapi-offline`` package (Swagger UI 5 and
ReDoc 2 builds, MIT), never from a CDN: the pages work on a machine with no internet.
Swagger UI's online validator badge is off for the same reason.

Operation ids are the endpoint functions' names (``put_job``, ``consistent_version``):
what a generated client calls its methods. Two routes with the same function name would
share an id; FastAPI warns about that when it builds the schema, and the tests fail on
that warning.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS_URL = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"


def operation_id(route: APIRoute) -> str:
    """The endpoint function's name: ``GET /versions/consistent`` is ``consistent_version``."""
    return route.name


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs``, its OAuth2 redirect and ``/redoc`` with local assets."""
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    # The pages read the app off the request, not from a closure: FastAPI keeps its
    # endpoints in module-level caches, and an endpoint closing over its app kept every
    # app a process ever built alive (a test process builds one per test).
    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        this = request.app
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{this.title} API",
            oauth2_redirect_url=root + oauth2_redirect_url,
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            # None: no badge fetched from validator.swagger.io
            swagger_ui_parameters={"validatorUrl": None, **(this.swagger_ui_parameters or {})},
        )

    @app.get(oauth2_redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        this = request.app
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{this.title} API",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
