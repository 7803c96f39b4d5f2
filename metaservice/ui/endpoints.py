from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from metaservice.auth.schemas import Role
from metaservice.deps import Paging, Services, paging, require, services
from metaservice.schemas_common import Page, error_responses
from metaservice.ui import service
from metaservice.ui.schemas import TableLease

CONSOLE_URL = "/ui"
STATIC_DIR = Path(__file__).parent / "static"

router = APIRouter(tags=["console"], dependencies=[require(Role.READER)])
ROUTER_ERRORS = error_responses(401, 403, 422)  # what every route of it may answer


@router.get(
    "/tables/{table}/leases", response_model=Page[TableLease], responses=error_responses(404, 413)
)
def table_leases(
    table: str, page: Paging = Depends(paging), s: Services = Depends(services)
) -> Page[TableLease]:
    """The table's live leases: what each pins of it and until when, soonest to end first."""
    return s.db.read(
        lambda session: service.table_leases(session, s.ctx, table, page.limit, page.offset)
    )


def install_console(app: FastAPI) -> None:
    """Mount the console's pages at ``/ui`` (its read endpoint is :data:`router`, which
    the app includes under ``/api/v1`` with :data:`ROUTER_ERRORS`).

    The pages are static and open: every piece of data comes from the API, which
    checks the bearer token the page sends. ``/ui`` redirects to ``/ui/``.
    """
    app.mount(CONSOLE_URL, StaticFiles(directory=STATIC_DIR, html=True), name="console")
