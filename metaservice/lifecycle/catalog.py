"""Opening the jobs' Iceberg catalog for the service's own work (expiry, tags, mirrors),
and the error it answers when that cannot be done (:func:`unavailable` words it).

Its own module so that those who need a catalog (``lifecycle.expiry``,
``versions.tags.publish``, ``revisions.mirrors``) depend on it and not on each other:
expiry uses the tags' clean-up, and the tags only need a catalog.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from metaservice.errors import ServiceError
from metaservice.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

CatalogLoader = Callable[[Settings], "Catalog"]


class CatalogUnavailable(ServiceError):
    """The Iceberg catalog or its storage cannot be used right now (or pyiceberg is not
    installed); the message says what to check."""

    status = 503
    code = "catalog_unavailable"


def open_catalog(
    settings: Settings, load_catalog: CatalogLoader | None = None, doing: str = "this"
) -> Catalog:
    """The jobs' catalog, opened by ``load_catalog`` (default:
    ``lifecycle.iceberg.load_catalog``); 503 ``catalog_unavailable`` when it cannot be
    opened, or when pyiceberg is not installed (``doing`` names what needed it)."""
    try:
        from metaservice.lifecycle import iceberg
    except ModuleNotFoundError as exc:
        raise CatalogUnavailable(
            f"{doing} needs pyiceberg ({exc.name!r} is not installed): install "
            "the service with pip install 'metaservice[server,iceberg]'"
        ) from exc
    try:
        return (load_catalog or iceberg.load_catalog)(settings)
    except Exception as exc:
        raise CatalogUnavailable(
            f"cannot open the Iceberg catalog: {exc}. The service uses the jobs' catalog: "
            "METASERVICE_CATALOG_PROPERTIES, else a SQL catalog in METASERVICE_DB_URL with "
            "tables under METASERVICE_WAREHOUSE"
        ) from exc


@contextlib.contextmanager
def opened_catalog(
    settings: Settings, load_catalog: CatalogLoader | None = None, doing: str = "this"
) -> Iterator[Catalog]:
    """:func:`open_catalog`, closed (its database connections released) on the way out::

    with opened_catalog(ctx.settings, load_catalog, "publishing a tag") as catalog:
        ...
    """
    catalog = open_catalog(settings, load_catalog, doing)
    from metaservice.lifecycle.iceberg import close_catalog

    try:
        yield catalog
    finally:
        close_catalog(catalog)


def first_line(exc: BaseException, limit: int = 300) -> str:
    """``exc``'s type and the first line of its message (cut at ``limit`` characters)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:limit] if text else ''}"


def unavailable(doing: str, exc: Exception, then: str) -> CatalogUnavailable:
    """503 ``catalog_unavailable``: ``doing`` failed because of ``exc``; ``then`` says what
    was left (logged with ``exc``'s stack)."""
    log.warning("%s failed", doing, exc_info=exc)
    return CatalogUnavailable(
        f"{doing} failed: {first_line(exc)}. {then}; try again once the catalog and its "
        "storage are reachable"
    )
