"""The Iceberg REST catalog's rules: which version a session reads, and what it lists.

An engine attaches with ``uri=http://host:port/iceberg`` and a ``warehouse`` naming the
version every table of its session reads:

- ``consistent`` (the default): the consistent version of every table the service knows,
  as it is when the session is configured;
- ``at:<B>``: the latest consistent version at or before barrier ``B`` (epoch ms, or an
  ISO-8601 time);
- ``tag:<NAME>``: a tag published with ``POST /versions/tags``.

``GET /v1/config`` opens the session: it fixes the version, pins it with a lease (the
session's id, handed out as the catalog ``prefix``) and records each table under the
name it has then, so that one query loading a table several times reads one version,
and a revision swapped in afterwards does not change what the session reads. Every
request of the session renews the lease once half of it has passed; a session idle for
``catalog_session_idle_seconds`` ends with its lease, and its snapshots may then be
expired. A ``consistent`` or ``at:`` session's lease is one of all tables (one row that
keeps each table's snapshot at its barrier, ``versions.service.create_lease_of_all_tables``),
so configuring a session writes two rows whatever the table count; a tag's session
leases the tag's snapshots. Renewing takes the lock its grant took and checks the
tables' expiry horizons, as granting does: an expiry reserved meanwhile either keeps
the session's snapshots or ends the session, never both.

Errors are raised as :class:`CatalogError`, which the router answers in the REST spec's
form (``{"error": {"message", "type", "code"}}``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from metaservice.context import Context
from metaservice.errors import Conflict, NotFound, ServiceError
from metaservice.iceberg_rest import repository as repo
from metaservice.topology import repository as topo
from metaservice.versions import repository as versions_repo
from metaservice.versions import service as versions
from metaservice.versions.schemas import ConsistentVersion
from metaservice.versions.tags import service as tags

DEFAULT_WAREHOUSE = "consistent"
_MAX_WAREHOUSE = 200


class CatalogError(ServiceError):
    """An error of the REST catalog: ``iceberg_type`` is the spec's error ``type``."""

    def __init__(self, status: int, iceberg_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.iceberg_type = iceberg_type


def bad_request(message: str) -> CatalogError:
    return CatalogError(400, "BadRequestException", message)


@dataclass(frozen=True)
class Warehouse:
    """What a session reads: ``kind`` is consistent, at or tag."""

    kind: str
    barrier: int | None = None
    tag: str | None = None


def parse_warehouse(text: str | None) -> Warehouse:
    """The warehouse a client names; 400 saying what is accepted otherwise.

    >>> parse_warehouse("at:1700000000000").barrier, parse_warehouse(None).kind
    (1700000000000, 'consistent')
    """
    value = (text or DEFAULT_WAREHOUSE).strip()
    if value == DEFAULT_WAREHOUSE:
        return Warehouse("consistent")
    if value.startswith("at:"):
        return Warehouse("at", barrier=_barrier_of(value[3:].strip()))
    if value.startswith("tag:") and value[4:].strip():
        return Warehouse("tag", tag=value[4:].strip())
    shown = value[:_MAX_WAREHOUSE]
    raise bad_request(
        f"warehouse '{shown}' is not one this catalog serves: use 'consistent' (the default), "
        "'at:<barrier>' (epoch ms or an ISO-8601 time, e.g. at:2026-12-01T10:00:00Z) or "
        "'tag:<name>' (a tag published with POST /api/v1/versions/tags)"
    )


def _barrier_of(text: str) -> int:
    if re.fullmatch(r"\d{1,19}", text):
        barrier = int(text)
        if barrier < 2**63:
            return barrier
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise bad_request(
            f"at:{text[:_MAX_WAREHOUSE]} names no barrier: give epoch milliseconds "
            "(at:1700000000000) or an ISO-8601 time (at:2026-12-01T10:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # a time without a zone is the service's: UTC
    return max(0, int(when.timestamp() * 1000))


def open_session(session: Session, ctx: Context, text: str | None) -> str:
    """Fix the version of a new catalog session and pin it; the session's id.

    A ``consistent`` or ``at:`` version is pinned by a lease of all tables (one row); a
    tag's by a lease of its snapshots (a tag may name snapshots no consistent version at
    its barrier names now, e.g. after a revision)."""
    warehouse = parse_warehouse(text)
    version = _version(session, ctx, warehouse)
    seconds = ctx.settings.catalog_session_idle_seconds
    try:
        if warehouse.kind == "tag":
            leased, tables = versions.create_lease_of_tables(session, ctx, version, seconds)
            ids = {name: t.id for name, t in tables.items()}
        else:
            leased, ids = versions.create_lease_of_all_tables(session, ctx, version, seconds)
    except Conflict as exc:  # expired or swapped while this request ran
        raise _refused(warehouse, exc) from None
    assert leased.lease_id is not None
    repo.add_session(
        session,
        leased.lease_id,
        (text or DEFAULT_WAREHOUSE).strip()[:_MAX_WAREHOUSE],
        {name: (ids[name], snapshot) for name, snapshot in version.snapshots.items()},
        ctx.now_ms(),
    )
    return leased.lease_id


def _version(session: Session, ctx: Context, warehouse: Warehouse) -> ConsistentVersion:
    if warehouse.kind == "tag":
        assert warehouse.tag is not None
        try:
            tag = tags.get_tag(session, ctx, warehouse.tag)
        except (NotFound, ServiceError) as exc:
            raise bad_request(f"warehouse 'tag:{warehouse.tag}': {exc}") from None
        return ConsistentVersion(barrier=tag.barrier, snapshots=tag.snapshots)
    names = repo.readable_tables(session)
    if not names:
        return ConsistentVersion(barrier=0, snapshots={})
    try:
        version = versions.version_unless_sealing(session, ctx, names, warehouse.barrier)
        if version is None:  # only where readers catch up (no advancer runs)
            versions.seal_writers(session, ctx, names)
            version = versions.consistent_version(session, ctx, names, warehouse.barrier)
        return version
    except Conflict as exc:
        raise _refused(warehouse, exc) from None


def _refused(warehouse: Warehouse, exc: Conflict) -> CatalogError:
    """A version refused: the client's choice for ``at:`` and ``tag:`` (400), a moment's
    for ``consistent`` (503: the next attempt finds another version)."""
    if warehouse.kind == "at":
        return bad_request(f"warehouse 'at:{warehouse.barrier}': {exc.message}")
    if warehouse.kind == "tag":
        return bad_request(f"warehouse 'tag:{warehouse.tag}': {exc.message}")
    return CatalogError(503, "ServiceUnavailableException", exc.message)


@dataclass(frozen=True)
class SessionView:
    """A live session's tables, and whether its lease is due for renewal."""

    warehouse: str
    barrier: int
    tables: list[repo.SessionTable]
    renew: bool


def view_session(
    session: Session, ctx: Context, lease_id: str, table: str | None = None
) -> SessionView:
    """The session's tables (or the one read as ``table``); 400 once it has ended."""
    row = repo.session_row(session, lease_id) if topo.storable(lease_id) else None
    now = ctx.now_ms()
    if row is None or row.expires_ms <= now:
        raise _ended(ctx, lease_id, row is not None)
    idle_ms = ctx.settings.catalog_session_idle_seconds * 1000
    return SessionView(
        warehouse=row.warehouse,
        barrier=row.barrier,
        tables=repo.session_tables(session, row, table),
        renew=row.expires_ms - now < idle_ms // 2,
    )


def renew_session(session: Session, ctx: Context, lease_id: str) -> None:
    """Extend a live session's lease by the idle time, under the lock a grant of its
    lease takes (the pins lock shared for a lease of all tables, else its tables' rows
    shared); the session ends (400) if an expiry has passed one of its snapshots or its
    lease ended meanwhile."""
    row = repo.session_row(session, lease_id)
    if row is None:
        raise _ended(ctx, lease_id, False)
    if row.all_tables:
        versions_repo.hold_pins_lock(session, exclusive=False)
    else:
        ids = sorted({table_id for table_id, _ in row.tables.values()})
        versions_repo.lock_tables(session, ids, exclusive=False)
    row = repo.session_row(session, lease_id)  # its lease as the lock holds it
    now = ctx.now_ms()
    if row is None or row.expires_ms <= now:
        raise _ended(ctx, lease_id, row is not None)
    tables = repo.session_tables(session, row)  # the horizons as the lock holds them
    if any(versions.may_be_expired(row.barrier, t.snapshot_id, t.expiry_horizon) for t in tables):
        raise _ended(ctx, lease_id, True)
    idle_ms = ctx.settings.catalog_session_idle_seconds * 1000
    if not repo.extend_lease(session, lease_id, now, now + idle_ms):
        raise _ended(ctx, lease_id, True)


def _ended(ctx: Context, lease_id: str, known: bool) -> CatalogError:
    idle = ctx.settings.catalog_session_idle_seconds
    why = (
        f"has ended (idle for more than {idle} s, or its version was expired)"
        if known
        else "is unknown"
    )
    return bad_request(
        f"catalog session '{lease_id[:64]}' {why}: attach the catalog again (a new "
        "session reads the version as it is then)"
    )


# -- namespaces and tables --------------------------------------------------------------------


def split_name(name: str) -> tuple[tuple[str, ...], str]:
    """``dw.order_detail`` -> (("dw",), "order_detail")."""
    parts = name.split(".")
    return tuple(parts[:-1]), parts[-1]


def namespaces(view: SessionView, parent: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The namespaces one level below ``parent`` (top level for ``()``)."""
    if parent and not namespace_exists(view, parent):
        raise no_namespace(parent)
    found = set()
    for t in view.tables:
        namespace, _ = split_name(t.name)
        if len(namespace) > len(parent) and namespace[: len(parent)] == parent:
            found.add(namespace[: len(parent) + 1])
    return sorted(found)


def namespace_exists(view: SessionView, namespace: tuple[str, ...]) -> bool:
    return any(split_name(t.name)[0][: len(namespace)] == namespace for t in view.tables) and bool(
        namespace
    )


def tables_in(view: SessionView, namespace: tuple[str, ...]) -> list[str]:
    if not namespace_exists(view, namespace):
        raise no_namespace(namespace)
    return [split_name(t.name)[1] for t in view.tables if split_name(t.name)[0] == namespace]


def table_of(view: SessionView, namespace: tuple[str, ...], name: str) -> repo.SessionTable:
    full = ".".join((*namespace, name))
    for t in view.tables:
        if t.name == full:
            return t
    if not namespace_exists(view, namespace):
        raise no_namespace(namespace)
    raise CatalogError(
        404,
        "NoSuchTableException",
        f"table '{full}' is not in this catalog session (version at barrier {view.barrier}, "
        f"warehouse '{view.warehouse}'): a table registered or first committed after the "
        "session was configured needs a new session",
    )


def no_namespace(namespace: tuple[str, ...]) -> CatalogError:
    return CatalogError(
        404,
        "NoSuchNamespaceException",
        f"namespace '{'.'.join(namespace)}' has no table in this catalog session",
    )
