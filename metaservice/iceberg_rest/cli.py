"""``metaservice catalog``: how to attach each engine to the service's Iceberg REST catalog.

A query command's sibling: it needs the base install only and calls no service (it prints
what to configure; the engines do the calling).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from metaservice.cli_output import DEFAULT_URL, UrlOption


class Engine(StrEnum):
    pyiceberg = "pyiceberg"
    duckdb = "duckdb"
    clickhouse = "clickhouse"
    spark = "spark"
    trino = "trino"


def attach_lines(engine: Engine, url: str, warehouse: str, auth: bool) -> list[str]:
    """What to type into ``engine`` to read every table at ``warehouse``'s version.

    >>> attach_lines(Engine.duckdb, "http://h:8765", "consistent", False)[-2]
    "ATTACH 'consistent' AS ms (TYPE iceberg, ENDPOINT 'http://h:8765/iceberg', AUTHORIZATION_TYPE 'none');"
    """
    rest = f"{url.rstrip('/')}/iceberg"
    token = "<a reader token: metaservice token create --role reader>"
    if engine is Engine.pyiceberg:
        extra = f', token="{token}"' if auth else ""
        return [
            "from pyiceberg.catalog.rest import RestCatalog",
            f'catalog = RestCatalog("ms", uri="{rest}", warehouse="{warehouse}"{extra})',
            'catalog.load_table("dw.order_detail").scan().to_arrow()',
        ]
    if engine is Engine.duckdb:
        secret = [f"CREATE SECRET ms_token (TYPE iceberg, TOKEN '{token}');"] if auth else []
        how = "SECRET ms_token" if auth else "AUTHORIZATION_TYPE 'none'"
        return [
            "INSTALL iceberg; LOAD iceberg;",
            *secret,
            f"ATTACH '{warehouse}' AS ms (TYPE iceberg, ENDPOINT '{rest}', {how});",
            "SELECT * FROM ms.dw.order_detail;",
        ]
    if engine is Engine.clickhouse:
        header = f", auth_header = 'Authorization: Bearer {token}'" if auth else ""
        return [
            "SET allow_experimental_database_iceberg = 1;",
            f"CREATE DATABASE ms ENGINE = DataLakeCatalog('{rest}/v1') SETTINGS "
            f"catalog_type = 'rest', warehouse = '{warehouse}', vended_credentials = 0{header};",
            "SELECT * FROM ms.`dw.order_detail`;",
        ]
    if engine is Engine.spark:
        conf = "spark.sql.catalog.ms"
        lines = [
            "# with the iceberg-spark-runtime jar on the classpath",
            f"--conf {conf}=org.apache.iceberg.spark.SparkCatalog",
            f"--conf {conf}.type=rest",
            f"--conf {conf}.uri={rest}",
            f"--conf {conf}.warehouse={warehouse}",
        ]
        if auth:
            lines.append(f"--conf {conf}.token={token}")
        return [*lines, "SELECT * FROM ms.dw.order_detail"]
    lines = [
        "# etc/catalog/ms.properties",
        "connector.name=iceberg",
        "iceberg.catalog.type=rest",
        f"iceberg.rest-catalog.uri={rest}",
        f"iceberg.rest-catalog.warehouse={warehouse}",
    ]
    if auth:
        lines += [
            "iceberg.rest-catalog.security=OAUTH2",
            f"iceberg.rest-catalog.oauth2.token={token}",
        ]
    return [*lines, "SELECT * FROM ms.dw.order_detail"]


def catalog(
    url: UrlOption = DEFAULT_URL,
    warehouse: Annotated[
        str,
        typer.Option(
            help="The version every table reads: consistent (fixed when the engine "
            "attaches), at:<barrier or ISO-8601 time>, or tag:<name>"
        ),
    ] = "consistent",
    engine: Annotated[
        list[Engine] | None,
        typer.Option(help="Only this engine (repeatable). Default: all of them"),
    ] = None,
    auth: Annotated[
        bool, typer.Option(help="The service requires tokens: show where a reader token goes")
    ] = False,
) -> None:
    """Print how to attach pyiceberg, DuckDB, ClickHouse, Spark and Trino to the service's
    Iceberg REST catalog, so that each reads every table at one consistent version."""
    typer.echo(
        f"Iceberg REST catalog: {url.rstrip('/')}/iceberg (read-only). Every table an engine "
        f"reads through it is at the version of warehouse '{warehouse}', fixed when the "
        "engine attaches; attach again for newer data."
    )
    for chosen in engine or list(Engine):
        typer.echo(f"\n{chosen.value}:")
        for line in attach_lines(chosen, url, warehouse, auth):
            typer.echo(f"  {line}")
