"""``metaservice start``: migrate the database, then serve the MetaService with uvicorn."""

from __future__ import annotations

import logging
import logging.config
import os
from pathlib import Path
from typing import Annotated

import typer

from metaservice.cli.reconcile import run_reconcile
from metaservice.cli.server_code import (
    DbOption,
    LogFormat,
    console,
    err,
    fail,
    needs_server,
    settings_from,
)
from metaservice.cli.token import token_count
from metaservice.lifecycle.cli import ExpireEveryOption


@needs_server("start")
def start(
    port: Annotated[int | None, typer.Option(help="Port to listen on (default 8765)")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1)")] = None,
    db: DbOption = None,
    barrier_interval_ms: Annotated[
        int | None, typer.Option(help="Barrier clock slot width in ms (default 1000)")
    ] = None,
    workers: Annotated[int, typer.Option(help="Worker processes (uvicorn)")] = 1,
    log_level: Annotated[
        str | None, typer.Option(help="debug, info, warning, error (default info)")
    ] = None,
    log_format: Annotated[
        LogFormat | None,
        typer.Option(
            case_sensitive=False,
            help="text, or json: one JSON object per line, uvicorn's access log included "
            "(default text)",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="METASERVICE_CONFIG",
            dir_okay=False,
            help="TOML file of settings (keys as the METASERVICE_* variables, lower case, "
            "without the prefix); flags and variables take precedence over it",
        ),
    ] = None,
    auth_required: Annotated[
        bool,
        typer.Option(
            "--auth-required",
            help="Require a bearer token on /api/v1 (METASERVICE_AUTH_REQUIRED); "
            "make one with `metaservice token create`",
        ),
    ] = False,
    ssl_keyfile: Annotated[
        str | None,
        typer.Option(help="Serve HTTPS with this private key (PEM), with --ssl-certfile"),
    ] = None,
    ssl_certfile: Annotated[
        str | None, typer.Option(help="Serve HTTPS with this certificate chain (PEM)")
    ] = None,
    reconcile: Annotated[
        bool,
        typer.Option(
            "--reconcile",
            help="After migrating, catch up with the tables' stamped snapshots "
            "(see `metaservice reconcile`)",
        ),
    ] = False,
    expire_every: ExpireEveryOption = None,
    openlineage_url: Annotated[
        str | None,
        typer.Option(
            help="Emit OpenLineage events for the barrier jobs to this backend, e.g. "
            "http://marquez:5000 (METASERVICE_OPENLINEAGE_URL; key: "
            "METASERVICE_OPENLINEAGE_API_KEY)",
        ),
    ] = None,
) -> None:
    """Start the MetaService, applying database migrations first if it is behind."""
    import uvicorn

    from metaservice.logs import log_config, redact_url
    from metaservice.metrics import share_between_workers
    from metaservice.migrate import upgrade
    from metaservice.settings import CONFIG_ENV

    if config is not None:  # read by Settings, here and in every worker
        os.environ[CONFIG_ENV] = str(config)
    settings = settings_from(
        port=port,
        host=host,
        db_url=db,
        barrier_interval_ms=barrier_interval_ms,
        auth_required=auth_required or None,
        expire_every_seconds=expire_every,
        openlineage_url=openlineage_url,
        log_level=log_level,
        log_format=log_format and log_format.value,
    )
    if settings.expire_every_seconds:
        import metaservice.lifecycle.iceberg  # noqa: F401 (the schedule needs pyiceberg)
    if (ssl_keyfile is None) != (ssl_certfile is None):
        raise fail("--ssl-keyfile and --ssl-certfile go together")
    logs = log_config(settings.log_level, settings.log_format)
    logging.config.dictConfig(logs)
    try:
        revision = upgrade(settings.db_url)
    except Exception as exc:
        raise fail(f"cannot prepare the database {redact_url(settings.db_url)}: {exc}") from exc
    if reconcile and not run_reconcile(settings, None, check=False).ok:
        err.print("[bold yellow]warning:[/] reconciliation left conflicts; starting anyway")
    console.print(
        f"MetaService on {'https' if ssl_certfile else 'http'}://{settings.host}:{settings.port} "
        f"(API docs at /docs), auth {'required' if settings.auth_required else 'off'}, "
        f"database {redact_url(settings.db_url)} at migration {revision}, "
        f"barrier interval {settings.barrier_interval_ms} ms"
    )
    # Workers are separate processes: they rebuild the app from the environment.
    for key, value in (
        ("DB_URL", settings.db_url),
        ("BARRIER_INTERVAL_MS", settings.barrier_interval_ms),
        ("EXPIRE_EVERY_SECONDS", settings.expire_every_seconds),
    ):
        os.environ[f"METASERVICE_{key}"] = str(value)
    if settings.auth_required:
        os.environ["METASERVICE_AUTH_REQUIRED"] = "true"
    if settings.openlineage_url:
        os.environ["METASERVICE_OPENLINEAGE_URL"] = settings.openlineage_url
    if workers > 1:  # each worker counts requests into files they share
        share_between_workers()
    if settings.auth_required and not token_count(settings.db_url):
        err.print(
            "[bold yellow]warning:[/] auth is required but no token exists yet; make one "
            "with `metaservice token create --role admin`"
        )
    uvicorn.run(
        "metaservice.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        log_level=settings.log_level,
        log_config=logs,
        ssl_keyfile=ssl_keyfile,
        ssl_certfile=ssl_certfile,
    )
