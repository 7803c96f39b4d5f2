"""Read the stamps from the Iceberg tables and reconcile the database with them.

The only part of reconciliation that needs pyiceberg: its imports stay inside the
functions, so the service runs without it. The catalog is the one the jobs use, by
its pyiceberg properties (:func:`catalog_properties`), loaded through
:mod:`metaservice.catalog_loading`, which imports no pyspark: reconciliation runs
where only the ``iceberg`` extra is installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from metaservice.clock import Clock, SystemClock
from metaservice.context import Context
from metaservice.contract import parse_stamp
from metaservice.db import Database
from metaservice.reconcile import service
from metaservice.reconcile.schemas import ReconcileReport, Stamp, TableReconciliation
from metaservice.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

# A SQL catalog's URL other than the database's (shorthand, as --catalog-uri).
CATALOG_URI_ENV = "METASERVICE_CATALOG_URI"


class _DryRun(Exception):
    def __init__(self, report: ReconcileReport) -> None:
        super().__init__("dry run")
        self.report = report


def read_stamps(
    catalog: Catalog, names: Iterable[str]
) -> tuple[dict[str, list[Stamp]], dict[str, str], dict[str, str]]:
    """The stamped snapshots of each table in commit order, the tables missing from the
    catalog (they have no snapshots: an empty list of stamps), and the tables that could
    not be read, with the reason."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    stamps: dict[str, list[Stamp]] = {}
    missing: dict[str, str] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            table = catalog.load_table(name)
        except (NoSuchTableError, NoSuchNamespaceError):
            stamps[name] = []
            missing[name] = "not in the catalog (nothing committed yet)"
            continue
        except Exception as exc:
            errors[name] = f"cannot load the table: {exc}"
            continue
        try:
            stamps[name] = [
                Stamp(snapshot_id=snap.snapshot_id, barrier=s.barrier, job=s.job, batch_id=s.batch)
                for snap in table.snapshots()  # commit order
                if (s := parse_stamp(snap.summary)) is not None
            ]
        except Exception as exc:  # a malformed stamp or unreadable metadata
            errors[name] = f"cannot read the snapshots: {exc}"
    return stamps, missing, errors


def reconcile_catalog(
    db: Database, ctx: Context, catalog: Catalog, *, check: bool = False
) -> ReconcileReport:
    """Reconcile every registered table that has a writer with its stamps in ``catalog``."""
    names = db.read(service.tables_to_reconcile)
    stamps, missing, errors = read_stamps(catalog, names)
    if check:
        # The service rolls its own work back; raising also rolls back the transaction.
        def dry(session: Any) -> ReconcileReport:
            raise _DryRun(service.reconcile(session, ctx, stamps, check=True))

        try:
            db.write(dry)
        except _DryRun as done:
            report = done.report
    else:
        report = db.write(lambda session: service.reconcile(session, ctx, stamps))
    for entry in report.tables:
        entry.note = missing.get(entry.table, entry.note)
    unread = [TableReconciliation(table=name, error=reason) for name, reason in errors.items()]
    tables = sorted([*report.tables, *unread], key=lambda t: t.table)
    return report.model_copy(update={"tables": tables})


def catalog_properties(
    settings: Settings, catalog_uri: str | None = None, warehouse: str | None = None
) -> dict[str, str]:
    """The pyiceberg properties of the catalog to reconcile with: the setting
    ``catalog_properties`` (``METASERVICE_CATALOG_PROPERTIES``) when set, else a SQL
    catalog at ``catalog_uri``, else ``METASERVICE_CATALOG_URI``, else in the
    MetaService's own database, with tables under ``warehouse`` (else the setting)."""
    from metaservice.catalog_loading import sql_catalog_properties

    if settings.catalog_properties:
        if catalog_uri:
            raise ValueError(
                "both catalog properties and a catalog URI are given; pass the catalog "
                "one way: put 'uri' in the catalog properties"
            )
        return dict(settings.catalog_properties)
    uri = catalog_uri or os.environ.get(CATALOG_URI_ENV) or settings.db_url
    return sql_catalog_properties(uri, warehouse or settings.warehouse)


def reconcile_database(
    settings: Settings,
    *,
    catalog_uri: str | None = None,
    warehouse: str | None = None,
    check: bool = False,
    clock: Clock | None = None,
) -> ReconcileReport:
    """Open the database and the catalog (:func:`catalog_properties`) and reconcile them."""
    from metaservice.catalog_loading import load_catalog

    catalog = load_catalog(catalog_properties(settings, catalog_uri, warehouse))
    db = Database(settings.db_url)
    try:
        ctx = Context(settings=settings, clock=clock or SystemClock())
        return reconcile_catalog(db, ctx, catalog, check=check)
    finally:
        db.dispose()
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()


def print_report(console: Console, report: ReconcileReport) -> None:
    """A readable summary: one line per table, then each change and each problem."""

    def out(line: str) -> None:  # no wrapping: one fact per line, for grep and logs
        console.print(line, highlight=False, soft_wrap=True)

    out(
        "[bold]reconcile --check[/] (dry run: nothing was changed)"
        if report.check
        else "[bold]reconcile[/]"
    )
    would = "would add" if report.check else "added"
    for t in report.tables:
        head = f"  {escape(t.table)}"
        if t.writer:
            head += f" (writer {escape(t.writer)})"
        if t.error:
            out(f"{head}: [bold red]error:[/] {escape(t.error)}")
            continue
        counts = (
            f"{t.stamped} stamped, {t.already_present} already present, "
            f"{len(t.added)} {would}, {len(t.closed_empty)} empty closed, "
            f"{len(t.conflicts)} conflicts, {len(t.skipped)} skipped"
        )
        note = f" [dim]({escape(t.note)})[/]" if t.note else ""
        out(f"{head}: {counts}{note}")
        for r in t.added:
            out(
                f"    {would} batch {r.batch_id} of {escape(r.job)}: snapshot {r.snapshot_id} "
                f"at barrier {r.barrier}"
            )
        for r in t.closed_empty:
            out(
                f"    {would} empty commit of batch {r.batch_id} of {escape(r.job)} "
                f"at barrier {r.barrier} (a later batch is committed)"
            )
        for i in t.conflicts:
            out(
                f"    [bold red]conflict[/] {i.code}: snapshot {i.snapshot_id} stamped batch "
                f"{i.batch_id} of {escape(i.job)} at barrier {i.barrier}: {escape(i.message)}"
            )
        for i in t.skipped:
            out(f"    skipped snapshot {i.snapshot_id}: {escape(i.message)}")
    clock = (
        f"barrier clock {report.last_issued_before} -> {report.last_issued_after}"
        if report.last_issued_after != report.last_issued_before
        else f"barrier clock unchanged at {report.last_issued_before}"
    )
    out(
        f"{len(report.tables)} tables: {report.already_present} already present, "
        f"{report.added} {would}, {report.conflicts} conflicts, {report.errors} unreadable; "
        f"{clock}"
    )
