"""Loading the jobs' Iceberg catalog by its pyiceberg properties, and checking that its
warehouse is reachable: the one place both sides open a catalog, the service (expiry,
tags, revisions, the REST catalog, ``metaservice reconcile``) and the Spark side
(:mod:`spark_barrier.iceberg.catalog`, which adds the tables' creation).

A catalog is named by its pyiceberg properties, as `pyiceberg.catalog.load_catalog`
takes them: `{"type": "rest", "uri": "https://...", "warehouse": "..."}`, or a SQL
catalog with tables on object storage::

    {"type": "sql", "uri": "postgresql+psycopg://iceberg@db/catalog",
     "warehouse": "s3://bucket/wh", "s3.endpoint": "http://minio:9000",
     "s3.access-key-id": "...", "s3.secret-access-key": "...", "s3.region": "us-east-1"}

The default (:func:`sql_catalog_properties`) is a SQL catalog in the MetaService's own
database with its warehouse (``METASERVICE_DB_URL``, ``METASERVICE_WAREHOUSE``).
Properties are plain strings, so the driver hands them to its executors as they are
(the barrier source's ``catalog`` option): a warehouse given as a local folder is made
an absolute ``file://`` URI on the driver (:func:`normalised_properties`); any other
URI (``s3://bucket/wh``) is kept as is.

This module imports pyiceberg, and neither pyspark, the server, nor anything of
``spark_barrier``: the service never imports the Spark side
(``tests/metaservice/test_import_cycles.py`` checks it).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path

from pyiceberg.catalog import Catalog
from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog
from pyiceberg.io import load_file_io

__all__ = [
    "CATALOG_NAME",
    "DB_URL_ENV",
    "DEFAULT_DB_URL",
    "DEFAULT_WAREHOUSE",
    "WAREHOUSE_ENV",
    "CatalogUnavailable",
    "check_warehouse",
    "is_sql_catalog",
    "load_catalog",
    "normalised_properties",
    "open_catalog",
    "shown",
    "sql_catalog_properties",
]

CATALOG_NAME = "metaservice"

# The MetaService's settings the default catalog follows: metaservice.settings.Settings
# reads the same variables with the same defaults (tests/spark_barrier/test_catalogs.py
# holds them together). Read here without the server's settings object.
DB_URL_ENV, DEFAULT_DB_URL = "METASERVICE_DB_URL", "sqlite:///metaservice.db"
WAREHOUSE_ENV, DEFAULT_WAREHOUSE = "METASERVICE_WAREHOUSE", "warehouse"

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Catalog types whose `warehouse` property is a location (a REST catalog's is a name).
_LOCATION_WAREHOUSE = frozenset({"sql", "in-memory"})
# Property names whose values are never shown in an error message.
_SECRET = re.compile(r"secret|password|token|credential|session|key-id|sas|signature", re.I)
_URL_PASSWORD = re.compile(r"(://[^/:@]*):[^/@]*@")  # postgresql://user:password@host


class CatalogUnavailable(Exception):
    """The catalog cannot be loaded, or its warehouse cannot be written; the message
    says which properties to check."""


def sql_catalog_properties(uri: str | None = None, warehouse: str | None = None) -> dict[str, str]:
    """The pyiceberg properties of the default catalog: a SQL catalog (Iceberg's JDBC
    layout) at `uri`, tables under `warehouse` (a folder or a URI such as `s3://b/wh`).

    Each defaults to the MetaService's setting (``METASERVICE_DB_URL``,
    ``METASERVICE_WAREHOUSE``): the catalog shares the service's database.
    """
    return {
        "type": "sql",
        "uri": uri or os.environ.get(DB_URL_ENV) or DEFAULT_DB_URL,
        "warehouse": warehouse or os.environ.get(WAREHOUSE_ENV) or DEFAULT_WAREHOUSE,
    }


def normalised_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """`properties` as they are loaded, here and on the executors.

    For a SQL (or in-memory) catalog, a `warehouse` without a scheme is a local folder:
    it becomes the `file://` URI of its absolute path, resolved here (on the driver),
    since Spark and pyiceberg must agree on file paths and executors may run elsewhere.
    A SQL catalog's `postgresql://` URI names psycopg 3 (the driver installed).
    """
    props = {str(k): str(v) for k, v in properties.items()}
    kind = _catalog_type(props)
    warehouse = props.get("warehouse")
    if kind in _LOCATION_WAREHOUSE and warehouse and not _URI.match(warehouse):
        props["warehouse"] = Path(warehouse).expanduser().resolve().as_uri()
    if kind == "sql" and "uri" in props:
        props["uri"] = _psycopg_url(props["uri"])
    return props


def load_catalog(properties: Mapping[str, str], name: str = CATALOG_NAME) -> Catalog:
    """The pyiceberg catalog `properties` describe (any type: sql, rest, glue, hive...).

    >>> catalog = load_catalog({"type": "sql", "uri": "sqlite:///ms.db", "warehouse": "wh"})  # doctest: +SKIP

    Raises :class:`CatalogUnavailable` when it cannot be loaded (unknown type, missing
    property, unreachable database or server), with the properties (secrets hidden).
    """
    props = normalised_properties(properties)
    try:
        return pyiceberg_load_catalog(name, **props)
    except Exception as exc:
        raise CatalogUnavailable(
            f"cannot load the Iceberg catalog '{name}' {shown(props)}: {_reason(exc)}. "
            "Check the catalog properties (pyiceberg's: type, uri, warehouse, and what the "
            "catalog type needs), and that its database or server is up"
        ) from exc


def open_catalog(uri: str, warehouse: str, name: str = CATALOG_NAME) -> Catalog:
    """The SQL catalog at SQLAlchemy URL `uri` with tables under `warehouse`:
    :func:`load_catalog` of :func:`sql_catalog_properties`.

    `uri` is e.g. `sqlite:////var/lib/ms.db` or `postgresql+psycopg://user@host/db`
    (the catalog tables are created when missing); `warehouse` a folder or a URI
    (`file:///...`, `s3://...`).
    """
    return load_catalog(sql_catalog_properties(uri, warehouse), name)


def check_warehouse(catalog: Catalog) -> None:
    """Write and delete a small object under the catalog's warehouse, through the
    catalog's FileIO (S3 endpoint and credentials from its properties).

    Raises :class:`CatalogUnavailable` saying what to check when the object store is
    unreachable, the bucket missing or the credentials refused. A catalog whose
    `warehouse` is not a location (a REST catalog's is a name) is not probed.
    """
    location = catalog.properties.get("warehouse", "")
    if not _URI.match(location):
        return
    probe = f"{location.rstrip('/')}/.metaservice-probe-{uuid.uuid4().hex}"
    try:
        io = load_file_io(catalog.properties, location)
        with io.new_output(probe).create(overwrite=True) as out:
            out.write(b"metaservice warehouse probe\n")
        io.delete(probe)
    except Exception as exc:
        raise CatalogUnavailable(
            f"cannot write to the warehouse {location} of catalog '{catalog.name}' "
            f"{shown(catalog.properties)}: {_reason(exc)}. Check that the object store is "
            "up and reachable from here (s3.endpoint), that the bucket exists, and the "
            "credentials and region (s3.access-key-id, s3.secret-access-key, s3.region)"
        ) from exc


def shown(properties: Mapping[str, str]) -> str:
    """`properties` for a message: secrets and URL passwords hidden."""
    hidden = {
        key: "***" if _SECRET.search(key) else _URL_PASSWORD.sub(r"\1:***@", value)
        for key, value in properties.items()
    }
    return "(" + ", ".join(f"{k}={v}" for k, v in sorted(hidden.items())) + ")"


def is_sql_catalog(properties: Mapping[str, str]) -> bool:
    """Whether pyiceberg makes a SQL catalog of ``properties``."""
    return _catalog_type(properties) == "sql"


def _catalog_type(props: Mapping[str, str]) -> str | None:
    if "type" in props:
        return props["type"].lower()
    if props.get("uri", "").startswith(("sqlite", "postgres")):  # pyiceberg infers sql
        return "sql"
    return None


def _psycopg_url(url: str) -> str:
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
