"""The jobs' catalog as the REST catalog reads it: loaded once per process for the
settings that name it, and released when the app stops (a SQL catalog holds a pool of
database connections). Imports pyiceberg only when a catalog is loaded, so the app
imports this without the ``iceberg`` extra."""

from __future__ import annotations

import json
import threading
from typing import Any

from metaservice.settings import Settings

_catalogs: dict[tuple[str, str, str], Any] = {}
_lock = threading.Lock()


def _key(settings: Settings) -> tuple[str, str, str]:
    properties = json.dumps(settings.catalog_properties, sort_keys=True)
    return settings.db_url, settings.warehouse, properties


def catalog_of(settings: Settings) -> Any:
    """The catalog (a pyiceberg ``Catalog``), loaded on first use."""
    from metaservice.lifecycle.iceberg import load_catalog

    with _lock:
        catalog = _catalogs.get(_key(settings))
        if catalog is None:
            catalog = _catalogs[_key(settings)] = load_catalog(settings)
        return catalog


def release(settings: Settings) -> None:
    """Forget the settings' catalog, closing a SQL catalog's connections."""
    with _lock:
        catalog = _catalogs.pop(_key(settings), None)
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()
