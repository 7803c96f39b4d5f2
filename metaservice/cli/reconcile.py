"""``metaservice reconcile`` (and ``start --reconcile``): the barrier-to-snapshot mapping
rebuilt from the stamps in the tables' snapshots."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from metaservice.cli.server_code import (
    DbOption,
    console,
    fail,
    from_an_extra,
    key_values,
    needs_server,
    settings_from,
)

if TYPE_CHECKING:
    from metaservice.reconcile.schemas import ReconcileReport
    from metaservice.settings import Settings


def run_reconcile(settings: Settings, catalog_uri: str | None, check: bool) -> ReconcileReport:
    from metaservice.reconcile.iceberg import print_report, reconcile_database

    try:
        report = reconcile_database(settings, catalog_uri=catalog_uri, check=check)
    except Exception as exc:
        if from_an_extra(exc):
            raise  # needs_server names the extra
        raise fail(f"reconciliation failed: {exc}") from exc
    print_report(console, report)
    return report


@needs_server("reconcile", iceberg=True)
def reconcile_tables(
    db: DbOption = None,
    catalog_property: Annotated[
        list[str] | None,
        typer.Option(
            "--catalog-property",
            help="A pyiceberg property of the tables' catalog, KEY=VALUE (repeatable), e.g. "
            "type=rest, uri=https://..., s3.endpoint=http://...: the catalog is exactly "
            "these properties. Default: METASERVICE_CATALOG_PROPERTIES (JSON), else a SQL "
            "catalog (--catalog-uri, --warehouse)",
            show_default=False,
        ),
    ] = None,
    catalog_uri: Annotated[
        str | None,
        typer.Option(
            help="URL of a SQL catalog. Default: METASERVICE_CATALOG_URI, else the "
            "database URL (the catalog shares the MetaService database)",
            show_default=False,
        ),
    ] = None,
    warehouse: Annotated[
        str | None,
        typer.Option(
            help="The SQL catalog's warehouse (a folder or s3://...). "
            "Default: METASERVICE_WAREHOUSE"
        ),
    ] = None,
    check: Annotated[bool, typer.Option("--check", help="Only report; change nothing")] = False,
) -> None:
    """Rebuild the barrier-to-snapshot mapping from the stamps in the tables' snapshots.

    Exits with 1 when a stamp conflicts with the database or a table cannot be read.
    """
    properties = key_values("--catalog-property", catalog_property or [])
    settings = settings_from(db_url=db, warehouse=warehouse, catalog_properties=properties or None)
    report = run_reconcile(settings, catalog_uri, check)
    if not report.ok:
        raise typer.Exit(code=1)
