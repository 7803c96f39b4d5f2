"""``metaservice``: run the service, migrate its database, and query a running one.

The query commands (``tables``, ``topology``, ``lineage``, ``consistent``, ``delay``,
``expirable``, ``batch``) talk to a running MetaService through the client and need
the base install only. The commands that run the server's code (``start``, ``db``,
``token``, ``reconcile``) import it inside the command, and say which extra to
install when it is missing (:func:`_needs_server`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable
from rich.tree import Tree

from metaservice import __version__
from metaservice.auth.schemas import Role
from metaservice.client import MetaServiceClient, MetaServiceError
from metaservice.lifecycle.cli import ExpireEveryOption
from metaservice.lifecycle.cli import expire as expire_command
from metaservice.reconcile.schemas import ReconcileReport

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
UrlOption = Annotated[
    str,
    typer.Option("--url", envvar="METASERVICE_URL", help="Base URL of a running MetaService."),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="METASERVICE_TOKEN", help="Bearer token, when auth is on."),
]


def _settings(**overrides: object) -> Settings:
    from metaservice.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


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


def _client(url: str, token: str | None) -> MetaServiceClient:
    return MetaServiceClient(url, token=token)


def _time(ms: int | None) -> str:
    if not ms:
        return "never"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    if abs(ms) < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


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
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error")] = "info",
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
) -> None:
    """Start the MetaService, applying database migrations first if it is behind."""
    import uvicorn

    from metaservice.migrate import upgrade

    settings = _settings(
        port=port,
        host=host,
        db_url=db,
        barrier_interval_ms=barrier_interval_ms,
        auth_required=auth_required or None,
        expire_every_seconds=expire_every,
    )
    if settings.expire_every_seconds:
        import metaservice.lifecycle.iceberg  # noqa: F401 (the schedule needs pyiceberg)
    if (ssl_keyfile is None) != (ssl_certfile is None):
        raise _fail("--ssl-keyfile and --ssl-certfile go together")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        revision = upgrade(settings.db_url)
    except Exception as exc:
        raise _fail(f"cannot prepare the database {settings.db_url}: {exc}") from exc
    if reconcile and not _reconcile(settings, None, check=False).ok:
        err.print("[bold yellow]warning:[/] reconciliation left conflicts; starting anyway")
    console.print(
        f"MetaService on {'https' if ssl_certfile else 'http'}://{settings.host}:{settings.port} "
        f"(API docs at /docs), auth {'required' if settings.auth_required else 'off'}, "
        f"database {settings.db_url} at migration {revision}, "
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
        log_level=log_level,
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
    from metaservice.migrate import upgrade

    settings = _settings(db_url=db)
    try:
        upgrade(settings.db_url)
    except Exception as exc:
        raise _fail(f"cannot prepare the database {settings.db_url}: {exc}") from exc
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
    db: DbOption = None,
) -> None:
    """Issue a token; it is printed alone on the last line: `TOKEN=$(... | tail -n 1)`."""
    from metaservice.auth import service as auth_service

    if len(description) > 1000:
        raise _fail("--description is longer than 1000 characters")
    ctx, database = _token_db(db)
    try:
        created = database.write(
            lambda session: auth_service.create_token(session, ctx, role, description)
        )
    finally:
        database.dispose()
    typer.echo(
        f"token {created.id} with role {created.role.value} created; the database keeps only "
        "its hash, so this is the one time it is shown:"
    )
    typer.echo(created.token)


@token_app.command("list")
@_needs_server("token list")
def token_list(db: DbOption = None) -> None:
    """Show every token's id, role, description and creation time (never the token)."""
    from metaservice.auth import service as auth_service

    _, database = _token_db(db)
    try:
        page = database.read(lambda session: auth_service.list_tokens(session, 2**31 - 1, 0))
    finally:
        database.dispose()
    table = RichTable(title=f"{page.total} tokens")
    for col in ("id", "role", "description", "created"):
        table.add_column(col)
    for t in page.items:
        table.add_row(str(t.id), t.role.value, escape(t.description), _time(t.created_ms))
    console.print(table)


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
def topology(url: UrlOption = "http://127.0.0.1:8765", token: TokenOption = None) -> None:
    """Show every job with its inputs, outputs, status and frontier."""
    try:
        with _client(url, token) as ms:
            jobs = ms.all_jobs()
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    table = RichTable(title=f"{len(jobs)} jobs")
    for col in ("job", "kind", "inputs", "outputs", "status", "frontier"):
        table.add_column(col)
    for j in jobs:
        table.add_row(
            j.name,
            j.kind,
            ", ".join(j.inputs) or "-",
            ", ".join(j.outputs),
            j.status,
            _time(j.frontier),
        )
    console.print(table)


@app.command()
def tables(url: UrlOption = "http://127.0.0.1:8765", token: TokenOption = None) -> None:
    """Show every table with its writer, frontier, latest snapshot and delay."""
    try:
        with _client(url, token) as ms:
            items = ms.all_tables()
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    table = RichTable(title=f"{len(items)} tables")
    for col in ("table", "writer", "readers", "frontier", "latest snapshot", "delay"):
        table.add_column(col)
    for t in items:
        table.add_row(
            t.name,
            t.writer or "-",
            ", ".join(t.readers) or "-",
            _time(t.frontier),
            str(t.latest_snapshot or "-"),
            _duration(t.delay_ms),
        )
    console.print(table)


@app.command()
def lineage(
    table: Annotated[str, typer.Argument(help="Table identifier, e.g. dws.item_revenue")],
    direction: Annotated[str, typer.Option(help="upstream, downstream or both")] = "upstream",
    depth: Annotated[
        int | None, typer.Option(help="Jobs away from the table (all by default)")
    ] = None,
    url: UrlOption = "http://127.0.0.1:8765",
    token: TokenOption = None,
) -> None:
    """Show the jobs and tables a table comes from (or feeds) as a tree."""
    try:
        with _client(url, token) as ms:
            graph = ms.lineage(table, direction=direction, depth=depth)
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    kinds = {n.id: n for n in graph.nodes}
    parents: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    for e in graph.edges:
        parents.setdefault(e.target, []).append(e.source)
        children.setdefault(e.source, []).append(e.target)

    def label(node_id: str) -> str:
        node = kinds[node_id]
        return f"[cyan]{node.name}[/]" if node.kind == "table" else f"[yellow]job {node.name}[/]"

    def grow(tree: Tree, node_id: str, links: dict[str, list[str]], seen: frozenset[str]) -> None:
        for nxt in sorted(links.get(node_id, [])):
            if nxt not in seen:
                grow(tree.add(label(nxt)), nxt, links, seen | {nxt})

    if direction in ("upstream", "both"):
        up = Tree(f"{label(graph.root)} [dim]comes from[/]")
        grow(up, graph.root, parents, frozenset({graph.root}))
        console.print(up)
    if direction in ("downstream", "both"):
        down = Tree(f"{label(graph.root)} [dim]feeds[/]")
        grow(down, graph.root, children, frozenset({graph.root}))
        console.print(down)


@app.command()
def consistent(
    tables: Annotated[list[str], typer.Argument(help="Table identifiers")],
    at_or_before: Annotated[
        int | None, typer.Option(help="Latest version at or before this barrier")
    ] = None,
    lease_seconds: Annotated[
        int | None, typer.Option(help="Pin the snapshots for this long")
    ] = None,
    url: UrlOption = "http://127.0.0.1:8765",
    token: TokenOption = None,
) -> None:
    """Show the snapshots of several tables that belong together."""
    try:
        with _client(url, token) as ms:
            version = ms.consistent_version(
                tables, at_or_before=at_or_before, lease_seconds=lease_seconds
            )
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    table = RichTable(
        title=f"consistent version at barrier {version.barrier} ({_time(version.barrier)})"
    )
    table.add_column("table")
    table.add_column("snapshot")
    for name, snapshot in sorted(version.snapshots.items()):
        table.add_row(name, str(snapshot) if snapshot is not None else "(empty)")
    console.print(table)
    if version.lease_id:
        console.print(f"lease {version.lease_id} until {_time(version.lease_expires_ms)}")


@app.command()
def delay(
    table: Annotated[str, typer.Argument(help="Table identifier")],
    url: UrlOption = "http://127.0.0.1:8765",
    token: TokenOption = None,
) -> None:
    """Show how late a table is and which upstream job is to blame."""
    try:
        with _client(url, token) as ms:
            d = ms.delay(table)
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    console.print(
        f"[bold]{d.table}[/] is {_duration(d.delay_ms)} behind (frontier {_time(d.frontier)})"
    )
    path = RichTable(title="critical path (contributions add up to the delay)")
    for col in ("job", "writes", "waits on", "contribution"):
        path.add_column(col)
    for lag in d.critical_path:
        path.add_row(
            lag.job, lag.output, lag.slowest_input or "(wall clock)", _duration(lag.contribution_ms)
        )
    console.print(path)


@app.command()
def expirable(
    table: Annotated[str, typer.Argument(help="Table identifier")],
    url: UrlOption = "http://127.0.0.1:8765",
    token: TokenOption = None,
) -> None:
    """Show which snapshots of a table may be expired and why the others are kept."""
    try:
        with _client(url, token) as ms:
            plan = ms.expirable(table)
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    console.print(
        f"{len(plan.expirable)} snapshots of {plan.table} may be expired; {len(plan.kept)} kept"
    )
    for s in plan.kept:
        console.print(f"  keep {s.snapshot_id} (barrier {s.barrier}): {'; '.join(s.reasons)}")


batch_app = typer.Typer(help="Operate on a job's batches.", no_args_is_help=True)
app.add_typer(batch_app, name="batch")


@batch_app.command("abandon")
def batch_abandon(
    job: Annotated[str, typer.Argument(help="Job name")],
    batch_id: Annotated[int, typer.Argument(help="The open batch a dead driver left behind")],
    url: UrlOption = "http://127.0.0.1:8765",
    token: TokenOption = None,
) -> None:
    """Give up a dead source driver's open batch (admin): its tables stop waiting for it.

    A late commit report of the batch is refused; a restarted driver that replays it
    gets a new barrier.
    """
    try:
        with _client(url, token) as ms:
            view = ms.abandon_batch(job, batch_id)
    except MetaServiceError as exc:
        raise _fail(str(exc)) from exc
    console.print(
        f"batch {view.batch_id} of job {view.job} (barrier {_time(view.barrier)}) abandoned"
    )


app.command("expire")(expire_command)

if __name__ == "__main__":
    app()
