"""``metaservice``: run the service, migrate its database, and query a running one.

The query commands (``tables``, ``topology``, ``snapshots``, ``lineage``, ``consistent``,
``delay``, ``expirable``, ``job``, ``batch``, ``lease``, ``expire``, ``tag``, ``tags``,
``untag``, ``revision``, ``log status``) talk to a running MetaService through the client and need the base
install only; each prints a table or, with ``--output json``, the API's answer
(:mod:`metaservice.cli_output` holds what they share). The commands that run
the server's code (``start``, ``db``, ``token``, ``reconcile``) import it inside the
command, and say which extra to install when it is missing (:func:`_needs_server`).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import logging.config
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from metaservice import __version__
from metaservice import cli_output as fmt
from metaservice.auth.schemas import Role
from metaservice.cli_output import (
    DEFAULT_URL,
    Output,
    OutputOption,
    Printer,
    TokenOption,
    UrlOption,
    printer,
)
from metaservice.client import MetaServiceClient, MetaServiceError
from metaservice.iceberg_rest import cli as catalog_cli
from metaservice.lifecycle.cli import ExpireEveryOption
from metaservice.lifecycle.cli import expire as expire_command
from metaservice.lineage.schemas import SnapshotLineage
from metaservice.logstore import cli as log_cli
from metaservice.reconcile.schemas import ReconcileReport
from metaservice.revisions import cli as revisions_cli
from metaservice.versions.schemas import ConsistentVersion
from metaservice.versions.tags import cli as tags_cli

if TYPE_CHECKING:
    from metaservice.context import Context
    from metaservice.db import Database
    from metaservice.settings import Settings

P = ParamSpec("P")
R = TypeVar("R")

# Top-level modules that only the `server` extra installs, and those of the `iceberg`
# extra (pyiceberg reads the tables' stamps for `reconcile`).
SERVER_MODULES = frozenset(
    {
        "alembic",
        "fastapi",
        "fastapi_offline",
        "networkx",
        "prometheus_client",
        "psycopg",
        "pydantic_settings",
        "sqlalchemy",
        "starlette",
        "uvicorn",
    }
)
ICEBERG_MODULES = frozenset({"pyarrow", "pyiceberg"})

app = typer.Typer(
    help="MetaService: timestamp barriers, lineage, delay and consistent versions "
    "for Spark streaming on Apache Iceberg.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Manage the MetaService database.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()
err = Console(stderr=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL (sqlite:///FILE or postgresql+psycopg://USER@HOST/DB). "
        "Default: METASERVICE_DB_URL, else sqlite:///metaservice.db",
        show_default=False,
    ),
]


class LogFormat(enum.StrEnum):  # metaservice.logs.FORMATS, without importing the server
    text = "text"
    json = "json"


def _settings(**overrides: object) -> Settings:
    """The settings: these flags (``None``: not given), then the environment, then the
    config file; a wrong value anywhere is exit status 2 with the key and the problem."""
    from pydantic import ValidationError

    from metaservice.settings import ConfigFileError, Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ConfigFileError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(code=2) from None
    except ValidationError as exc:
        for problem in exc.errors():
            key = ".".join(str(part) for part in problem["loc"])
            err.print(
                f"[bold red]error:[/] setting {escape(key)}: {escape(problem['msg'])} "
                f"(got {escape(repr(problem['input']))})",
                soft_wrap=True,
            )
        raise typer.Exit(code=2) from None


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=1)


def _needs_server(
    command: str, *, iceberg: bool = False
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Turn a missing server or pyiceberg dependency met anywhere in the command into
    an error that names the extras to install (``iceberg``: the command always reads
    the tables, so name that extra from the start)."""

    def wrap(run: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(run)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return run(*args, **kwargs)
            except ModuleNotFoundError as exc:
                if not _from_an_extra(exc):
                    raise
                tables = iceberg or _top_level(exc) in ICEBERG_MODULES
                extras = "server,iceberg" if tables else "server"
                raise _fail(
                    escape(
                        f"`metaservice {command}` runs the MetaService's own code, which needs "
                        f"the module {exc.name!r}; it is not installed. Install the server's "
                        f"dependencies: pip install 'metaservice[{extras}]'"
                    )
                ) from exc

        return checked

    return wrap


def _top_level(exc: ModuleNotFoundError) -> str:
    return (exc.name or "").partition(".")[0]


def _from_an_extra(exc: BaseException) -> bool:
    """Whether ``exc`` is a module of the server or iceberg extra missing."""
    return isinstance(exc, ModuleNotFoundError) and (
        _top_level(exc) in SERVER_MODULES | ICEBERG_MODULES
    )


def _show_version(show: bool) -> None:
    if show:
        typer.echo(f"metaservice {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    # Only for --version: the app's help is the Typer's own.
    pass


def _key_values(option: str, pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict; a pair without ``=`` is an error."""
    bad = [pair for pair in pairs if "=" not in pair]
    if bad:
        raise _fail(escape(f"{option} takes KEY=VALUE, not {bad[0]!r}"))
    return dict(pair.split("=", 1) for pair in pairs)


@contextlib.contextmanager
def _calling(url: str, token: str | None) -> Iterator[MetaServiceClient]:
    """A client of the service at ``url``; an error of the service is the command's error."""
    try:
        with MetaServiceClient(url, token=token) as ms:
            yield ms
    except MetaServiceError as exc:
        raise fmt.fail(str(exc)) from exc


@app.command()
@_needs_server("start")
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
    settings = _settings(
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
        raise _fail("--ssl-keyfile and --ssl-certfile go together")
    logs = log_config(settings.log_level, settings.log_format)
    logging.config.dictConfig(logs)
    try:
        revision = upgrade(settings.db_url)
    except Exception as exc:
        raise _fail(f"cannot prepare the database {redact_url(settings.db_url)}: {exc}") from exc
    if reconcile and not _reconcile(settings, None, check=False).ok:
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
    if settings.auth_required and not _token_count(settings.db_url):
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


@db_app.command("upgrade")
@_needs_server("db upgrade")
def db_upgrade(db: DbOption = None, revision: str = "head") -> None:
    """Apply Alembic migrations to the database."""
    from metaservice.migrate import upgrade

    url = _settings(db_url=db).db_url
    try:
        at = upgrade(url, revision)
    except Exception as exc:
        raise _fail(f"migration of {url} failed: {exc}") from exc
    console.print(f"database {url} is at migration {at}")


@db_app.command("current")
@_needs_server("db current")
def db_current(db: DbOption = None) -> None:
    """Show the database's migration and the newest one this version knows."""
    from metaservice.db import make_engine
    from metaservice.migrate import current_revision, head_revision

    url = _settings(db_url=db).db_url
    engine = make_engine(url)
    try:
        console.print(f"database {url}: at {current_revision(engine)}, newest {head_revision()}")
    finally:
        engine.dispose()


token_app = typer.Typer(
    help="Manage API tokens, directly in the database (no running service needed).",
    no_args_is_help=True,
)
app.add_typer(token_app, name="token")


def _token_db(db: str | None) -> tuple[Context, Database]:
    """The settings' database, migrated (a fresh one is often first touched by `token create`)."""
    from metaservice.context import Context
    from metaservice.db import Database
    from metaservice.logs import redact_url
    from metaservice.migrate import upgrade

    settings = _settings(db_url=db)
    try:
        upgrade(settings.db_url)
    except Exception as exc:
        raise _fail(f"cannot prepare the database {redact_url(settings.db_url)}: {exc}") from exc
    return Context(settings=settings), Database(settings.db_url)


def _token_count(url: str) -> int:
    from metaservice.auth import repository
    from metaservice.db import Database

    database = Database(url)
    try:
        return database.read(repository.count)
    finally:
        database.dispose()


@token_app.command("create")
@_needs_server("token create")
def token_create(
    role: Annotated[Role, typer.Option(help="What the token may do", case_sensitive=False)],
    description: Annotated[str, typer.Option(help="Whom or what the token is for")] = "",
    jobs: Annotated[
        str | None,
        typer.Option(
            help="Scope a writer token to these jobs: comma-separated names or patterns "
            "('ingest_*,build_order_detail'); it then acts only for them and the tables "
            "they write. Default: every job",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Issue a token; it is printed alone on the last line: `TOKEN=$(... | tail -n 1)`."""
    from metaservice.auth import service as auth_service

    if len(description) > 1000:
        raise _fail("--description is longer than 1000 characters")
    from metaservice.errors import Invalid

    scope = _job_scope(jobs)
    ctx, database = _token_db(db)
    try:
        created = database.write(
            lambda session: auth_service.create_token(session, ctx, role, description, scope)
        )
    except Invalid as exc:
        raise _fail(f"--jobs: {exc.message}") from exc
    finally:
        database.dispose()
    scoped = f", scoped to the jobs {', '.join(created.jobs)}" if created.jobs else ""
    typer.echo(
        f"token {created.id} with role {created.role.value}{scoped} created; the database "
        "keeps only its hash, so this is the one time it is shown:"
    )
    typer.echo(created.token)


def _job_scope(jobs: str | None) -> list[str] | None:
    """--jobs as the list of names or patterns it holds (checked by the service)."""
    return None if jobs is None else [p.strip() for p in jobs.split(",") if p.strip()]


@token_app.command("list")
@_needs_server("token list")
def token_list(db: DbOption = None, output: OutputOption = Output.table) -> None:
    """Show every token's id, role, description and creation time (never the token)."""
    from metaservice.auth import service as auth_service

    out = printer(output)
    _, database = _token_db(db)
    try:
        page = database.read(lambda session: auth_service.list_tokens(session, 2**31 - 1, 0))
    finally:
        database.dispose()
    if out.json:
        return out.dump(page.items)
    out.table(
        f"{page.total} tokens",
        ("id", "role", "jobs", "description", "created"),
        [
            (
                str(t.id),
                t.role.value,
                ",".join(t.jobs) if t.jobs is not None else "*",
                t.description,
                fmt.when(t.created_ms),
            )
            for t in page.items
        ],
    )


@token_app.command("revoke")
@_needs_server("token revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="The token's id (see `metaservice token list`)")],
    db: DbOption = None,
) -> None:
    """Revoke a token: requests presenting it are refused with 401 from now on."""
    from metaservice.auth import service as auth_service
    from metaservice.errors import NotFound

    _, database = _token_db(db)
    try:
        database.write(lambda session: auth_service.revoke_token(session, token_id))
    except NotFound as exc:
        raise _fail(exc.message) from exc
    finally:
        database.dispose()
    console.print(f"token {token_id} revoked")


def _reconcile(settings: Settings, catalog_uri: str | None, check: bool) -> ReconcileReport:
    from metaservice.reconcile.iceberg import print_report, reconcile_database

    try:
        report = reconcile_database(settings, catalog_uri=catalog_uri, check=check)
    except Exception as exc:
        if _from_an_extra(exc):
            raise  # _needs_server names the extra
        raise _fail(f"reconciliation failed: {exc}") from exc
    print_report(console, report)
    return report


@app.command("reconcile")
@_needs_server("reconcile", iceberg=True)
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
    properties = _key_values("--catalog-property", catalog_property or [])
    settings = _settings(db_url=db, warehouse=warehouse, catalog_properties=properties or None)
    report = _reconcile(settings, catalog_uri, check)
    if not report.ok:
        raise typer.Exit(code=1)


@app.command()
def topology(
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Show every job with its inputs, outputs, status and frontier."""
    out = printer(output)
    with _calling(url, token) as ms:
        jobs = ms.all_jobs()
    if out.json:
        return out.dump(jobs)
    out.table(
        f"{len(jobs)} jobs",
        ("job", "kind", "inputs", "outputs", "status", "frontier"),
        [
            (
                j.name,
                j.kind,
                ", ".join(j.inputs) or "-",
                ", ".join(j.outputs),
                j.status,
                fmt.frontier(j.frontier),
            )
            for j in jobs
        ],
    )


@app.command()
def tables(
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Show every table with its writer, frontier, latest snapshot and delay."""
    out = printer(output)
    with _calling(url, token) as ms:
        items = ms.all_tables()
    if out.json:
        return out.dump(items)
    out.table(
        f"{len(items)} tables",
        ("table", "writer", "readers", "frontier", "latest snapshot", "delay"),
        [
            (
                t.name,
                t.writer or "-",
                ", ".join(t.readers) or "-",
                fmt.frontier(t.frontier, written=t.writer is not None),
                str(t.latest_snapshot if t.latest_snapshot is not None else "-"),
                fmt.behind(t.delay_ms, written=t.writer is not None),
            )
            for t in items
        ],
    )


@app.command()
def snapshots(
    table: Annotated[str, typer.Argument(help="Table identifier, e.g. dwd.order_detail")],
    from_barrier: Annotated[
        int | None, fmt.barrier_option("--from", help="Only barriers at or after this")
    ] = None,
    to_barrier: Annotated[
        int | None, fmt.barrier_option("--to", help="Only barriers at or before this")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many")] = 100,
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Show a table's snapshots with their barriers, jobs and batches (oldest first)."""
    out = printer(output)
    with _calling(url, token) as ms:
        page = ms.table_snapshots(
            table, from_barrier=from_barrier, to_barrier=to_barrier, limit=limit
        )
    if out.json:
        return out.dump(page)
    now = fmt.now_ms()
    out.table(
        f"{len(page.items)} of {page.total} snapshots of {table}",
        ("snapshot", "barrier", "time", "job", "batch", "reported"),
        [
            (
                "(no rows)" if s.snapshot_id is None else str(s.snapshot_id),
                str(s.barrier),
                fmt.when(s.barrier, now=now),
                s.job or "(deleted)",
                str(s.batch_id),
                fmt.ago(s.reported_ms, now),
            )
            for s in page.items
        ],
    )


@app.command()
def lineage(
    table: Annotated[str, typer.Argument(help="Table identifier, e.g. dws.item_revenue")],
    direction: Annotated[
        str, typer.Option(help="upstream, downstream or both (as the API and the client)")
    ] = "both",
    depth: Annotated[
        int | None, typer.Option(help="Jobs away from the table (all by default)")
    ] = None,
    snapshot: Annotated[
        int | None,
        typer.Option(
            "--snapshot",
            help="Instead: the data lineage of this snapshot (its job, batch, barrier and the "
            "input snapshot ranges it consumed)",
        ),
    ] = None,
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Show the jobs and tables a table comes from and feeds, as trees (or, with
    --snapshot, which input snapshots made one snapshot)."""
    out = printer(output)
    if snapshot is not None:
        with _calling(url, token) as ms:
            made = ms.snapshot_lineage(table, snapshot)
        if out.json:
            return out.dump(made)
        return _show_snapshot_lineage(out, made)
    with _calling(url, token) as ms:
        graph = ms.lineage(table, direction=direction, depth=depth)
    if out.json:
        return out.dump(graph)
    kinds = {n.id: n for n in graph.nodes}
    parents: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    for e in graph.edges:
        parents.setdefault(e.target, []).append(e.source)
        children.setdefault(e.source, []).append(e.target)

    def label(node_id: str) -> str:
        node = kinds[node_id]
        name = escape(node.name)
        return f"[cyan]{name}[/]" if node.kind == "table" else f"[yellow]job {name}[/]"

    def grow(tree: Tree, node_id: str, links: dict[str, list[str]], seen: frozenset[str]) -> None:
        for nxt in sorted(links.get(node_id, [])):
            if nxt not in seen:
                grow(tree.add(label(nxt)), nxt, links, seen | {nxt})

    if direction in ("upstream", "both"):
        up = Tree(f"{label(graph.root)} [dim]comes from[/]")
        grow(up, graph.root, parents, frozenset({graph.root}))
        out.console.print(up, soft_wrap=out.plain)
    if direction in ("downstream", "both"):
        down = Tree(f"{label(graph.root)} [dim]feeds[/]")
        grow(down, graph.root, children, frozenset({graph.root}))
        out.console.print(down, soft_wrap=out.plain)


def _show_snapshot_lineage(out: Printer, made: SnapshotLineage) -> None:
    out.line(
        f"snapshot {made.snapshot_id} of [bold]{escape(made.table)}[/]: job "
        f"{escape(made.job)} batch {made.batch_id}, barrier {made.barrier} "
        f"({fmt.when(made.barrier)})"
    )
    if not made.inputs:
        out.line("a source job's snapshot: it read no table")
        return
    out.table(
        f"{len(made.inputs)} inputs",
        ("input", "after snapshot", "up to snapshot", "barriers"),
        [
            (
                i.table,
                "(start)" if i.from_snapshot is None else str(i.from_snapshot),
                "(empty)" if i.to_snapshot is None else str(i.to_snapshot),
                f"({i.from_barrier}, {i.to_barrier}]",
            )
            for i in made.inputs
        ],
    )


@app.command()
def consistent(
    tables: Annotated[list[str], typer.Argument(help="Table identifiers")],
    at_or_before: Annotated[
        int | None,
        fmt.barrier_option("--at-or-before", help="Latest version at or before this barrier"),
    ] = None,
    lease_seconds: Annotated[
        int | None, typer.Option(help="Pin the snapshots for this long")
    ] = None,
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Show the snapshots of several tables that belong together."""
    out = printer(output)
    with _calling(url, token) as ms:
        version = ms.consistent_version(
            tables, at_or_before=at_or_before, lease_seconds=lease_seconds
        )
    if out.json:
        return out.dump(version.model_dump(mode="json", exclude_none=True))  # as the API
    _print_version(out, version)


def _print_version(out: Printer, version: ConsistentVersion) -> None:
    out.table(
        f"consistent version at barrier {version.barrier} ({fmt.when(version.barrier)})",
        ("table", "snapshot"),
        [
            (name, str(snapshot) if snapshot is not None else "(empty)")
            for name, snapshot in sorted(version.snapshots.items())
        ],
    )
    if version.lease_id:
        out.line(f"lease {version.lease_id} until {fmt.when(version.lease_expires_ms)}")


@app.command()
def delay(
    table: Annotated[str, typer.Argument(help="Table identifier")],
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Show how late a table is and which upstream job is to blame."""
    out = printer(output)
    with _calling(url, token) as ms:
        d = ms.delay(table)
    if out.json:
        return out.dump(d)
    if d.frontier is None:
        out.line(f"[bold]{escape(d.table)}[/]: {fmt.NO_DATA} (nothing committed)")
    else:
        out.line(
            f"[bold]{escape(d.table)}[/] is {fmt.duration(d.delay_ms)} behind "
            f"(frontier {fmt.when(d.frontier, now=d.now_ms)})"
        )
    out.table(
        "critical path (contributions add up to the delay)",
        ("job", "writes", "waits on", "contribution"),
        [
            (
                lag.job,
                lag.output,
                lag.slowest_input or "(wall clock)",
                fmt.NO_DATA if lag.contribution_ms is None else fmt.duration(lag.contribution_ms),
            )
            for lag in d.critical_path
        ],
    )


@app.command()
def expirable(
    table: Annotated[str, typer.Argument(help="Table identifier")],
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Show which snapshots of a table may be expired and why the others are kept."""
    out = printer(output)
    with _calling(url, token) as ms:
        plan = ms.expirable(table)
    if out.json:
        return out.dump(plan)
    out.line(
        f"{len(plan.expirable)} snapshots of {escape(plan.table)} may be expired; "
        f"{len(plan.kept)} kept"
    )
    out.table(
        f"{len(plan.kept)} kept",
        ("snapshot", "barrier", "kept because"),
        [(str(s.snapshot_id), fmt.when(s.barrier), "; ".join(s.reasons)) for s in plan.kept],
    )


job_app = typer.Typer(help="Show, delete and operate on one job.", no_args_is_help=True)
app.add_typer(job_app, name="job")


@job_app.command("show")
def job_show(
    name: Annotated[str, typer.Argument(help="Job name")],
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """A job's kind, inputs, outputs, status, frontier, last batch and barrier."""
    out = printer(output)
    with _calling(url, token) as ms:
        job = ms.get_job(name)
    if out.json:
        return out.dump(job)
    now = fmt.now_ms()
    rows = [
        ("kind", job.kind),
        ("inputs", ", ".join(job.inputs) or "-"),
        ("outputs", ", ".join(job.outputs)),
        ("status", job.status),
        ("frontier", fmt.frontier(job.frontier, now=now)),
        ("last batch", "-" if job.last_batch_id is None else str(job.last_batch_id)),
        ("last barrier", fmt.when(job.last_barrier, none="-", now=now)),
        ("pending target", fmt.when(job.pending_target, none="-", now=now)),
        ("last seen", fmt.when(job.last_seen_ms, now=now)),
        ("offline floor", fmt.when(job.offline_floor, none="-", now=now)),
        ("description", job.description or "-"),
    ]
    out.table(f"job {job.name}", ("field", "value"), rows)


@job_app.command("delete")
def job_delete(
    name: Annotated[str, typer.Argument(help="Job name")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Remove a job, its edges and its barrier history (admin); its outputs lose their
    writer. Refused while another job reads one of its outputs."""
    with _calling(url, token) as ms:
        ms.delete_job(name)
    printer().line(f"job {escape(name)} deleted")


@job_app.command("release-grant")
def job_release_grant(
    name: Annotated[str, typer.Argument(help="Job name")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Release a source job's offline grant (writer): its frontier no longer stays below
    the grant's floor. Releasing a grant the job does not hold is fine."""
    with _calling(url, token) as ms:
        ms.release_offline_grant(name)
    printer().line(f"offline grant of job {escape(name)} released")


batch_app = typer.Typer(help="Operate on a job's batches.", no_args_is_help=True)
app.add_typer(batch_app, name="batch")


@batch_app.command("abandon")
def batch_abandon(
    job: Annotated[str, typer.Argument(help="Job name")],
    batch_id: Annotated[int, typer.Argument(help="The open batch a dead driver left behind")],
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Give up a dead source driver's open batch (admin): its tables stop waiting for it.

    A late commit report of the batch is refused; a restarted driver that replays it
    gets a new barrier.
    """
    out = printer(output)
    with _calling(url, token) as ms:
        view = ms.abandon_batch(job, batch_id)
    if out.json:
        return out.dump(view)
    out.line(
        f"batch {view.batch_id} of job {escape(view.job)} (barrier {fmt.when(view.barrier)}) "
        "abandoned"
    )


lease_app = typer.Typer(
    help="Pin a consistent version against expiry, and unpin it.", no_args_is_help=True
)
app.add_typer(lease_app, name="lease")


@lease_app.command("create")
def lease_create(
    tables: Annotated[list[str], typer.Argument(help="Table identifiers")],
    seconds: Annotated[
        float,
        typer.Option(
            "--for",
            parser=fmt.parse_duration,
            metavar="DURATION",
            help="How long the lease lasts, e.g. 30m, 2h",
        ),
    ],
    at_or_before: Annotated[
        int | None,
        fmt.barrier_option("--at-or-before", help="Latest version at or before this barrier"),
    ] = None,
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Pin the tables' consistent version (writer): its snapshots are not expired until
    the lease ends or is released. Prints the lease id."""
    out = printer(output)
    if seconds < 1:
        raise fmt.fail("--for is less than a second")
    with _calling(url, token) as ms:
        version = ms.create_lease(tables, math.ceil(seconds), at_or_before=at_or_before)
    if out.json:
        return out.dump(version.model_dump(mode="json", exclude_none=True))  # as the API
    _print_version(out, version)


@lease_app.command("release")
def lease_release(
    lease_id: Annotated[str, typer.Argument(help="The lease's id")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """End a lease now (writer): its snapshots may be expired again."""
    with _calling(url, token) as ms:
        ms.delete_lease(lease_id)
    printer().line(f"lease {escape(lease_id)} released")


app.command("expire")(expire_command)
app.command("catalog")(catalog_cli.catalog)
app.command("tag")(tags_cli.tag)
app.command("tags")(tags_cli.tags)
app.command("untag")(tags_cli.untag)
app.add_typer(revisions_cli.app, name="revision")
app.add_typer(log_cli.app, name="log")

if __name__ == "__main__":
    app()
