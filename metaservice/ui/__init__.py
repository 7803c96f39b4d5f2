"""The web console at ``/ui``: static pages over the REST API, plus the one read it needs.

The pages (``static/``) are plain HTML, CSS and JavaScript with the graph drawn by
cytoscape.js and its dagre layout, vendored under ``static/vendor/`` with their licences:
nothing is fetched from a CDN, so the console works on a machine with no internet. The
browser calls ``/api/v1`` like any client, with the bearer token the user entered (kept
in ``sessionStorage``) when the service requires one.

``install_console(app)`` mounts the pages; ``router`` holds the console's read endpoint,
``GET /tables/{table}/leases`` (the live leases of a table; the REST API had no way to
list them), which the app includes under ``/api/v1``::

    app = FastAPI()
    app.include_router(router, prefix="/api/v1", responses=ROUTER_ERRORS)
    install_console(app)  # GET /ui -> /ui/ -> static/index.html
"""

from __future__ import annotations

from metaservice.ui.endpoints import ROUTER_ERRORS, install_console, router

__all__ = ["ROUTER_ERRORS", "install_console", "router"]
