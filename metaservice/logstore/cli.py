"""``metaservice log start`` (the standalone log service) and ``metaservice log status``.

``status`` is a query command (the MetaService client and the log services' HTTP: base
install plus pyarrow); ``start`` runs the server's code, imported inside the command.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from metaservice import cli_output as fmt
from metaservice.cli_output import (
    DEFAULT_URL,
    Output,
    OutputOption,
    Printer,
    TokenOption,
    UrlOption,
)
from metaservice.client import MetaServiceClient, MetaServiceError
from metaservice.logstore.client import LogClient, LogError
from metaservice.logstore.store import DEFAULT_KEEP_BARRIERS, DEFAULT_MAX_BYTES
from metaservice.topology.schemas import TableView

app = typer.Typer(
    help="The log store: a low-latency, at-least-once copy of tables' newest rows "
    "between barrier commits.",
    no_args_is_help=True,
)

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_bytes(text: str | int) -> int:
    """``268435456``, ``256M``, ``1G`` (binary units) as bytes."""
    if isinstance(text, int):  # the default, given as a number
        return text
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in _UNITS else (raw, "")
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a size: give e.g. 268435456, 256M, 1G") from None
    if value < 0:
        raise typer.BadParameter("a size cannot be negative")
    return int(value)


def shown_bytes(n: int) -> str:
    """``512 B``, ``1.5 KiB``, ``256 MiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" or size >= 10 else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


@app.command()
def start(
    port: Annotated[
        int, typer.Option("--port", "-p", help="TCP port to listen on", min=1, max=65535)
    ] = 7070,
    host: Annotated[
        str, typer.Option("--host", help="Interface to listen on (0.0.0.0: all)")
    ] = "127.0.0.1",
    keep_barriers: Annotated[
        int,
        typer.Option(
            "--keep-barriers",
            min=0,
            help="Persisted barriers kept per table beside the unpersisted rows",
        ),
    ] = DEFAULT_KEEP_BARRIERS,
    max_bytes: Annotated[
        int,
        typer.Option(
            "--max-bytes",
            parser=parse_bytes,
            metavar="SIZE",
            help="Memory bound per table, e.g. 256M: the oldest persisted rows go first "
            "(rows not yet persisted are kept, and reported as over the bound)",
        ),
    ] = DEFAULT_MAX_BYTES,
) -> None:
    """Run a standalone log service (log="external") until Ctrl-C.

    Writers append to it and readers follow it by table; each table's writer publishes
    this address to the MetaService (PUT /api/v1/tables/{table}/log).
    """
    try:
        from metaservice.logstore.server import serve
        from metaservice.logstore.store import LogStore
    except ModuleNotFoundError as exc:
        raise fmt.fail(
            f"`metaservice log start` runs the log service, which needs the module "
            f"{exc.name!r}; it is not installed. Install the server's dependencies and "
            "pyarrow: pip install 'metaservice[server,iceberg]'"
        ) from None
    store = LogStore(keep_barriers=keep_barriers, max_bytes=max_bytes)
    typer.echo(
        f"log service on http://{host}:{port} (keeps unpersisted rows + {keep_barriers} "
        f"persisted barriers, {shown_bytes(max_bytes)} per table); Ctrl-C stops it",
        err=True,
    )
    serve(store, host=host, port=port)
    typer.echo("log service stopped", err=True)


@app.command()
def status(
    table: Annotated[str | None, typer.Option("--table", "-t", help="Only this table")] = None,
    output: OutputOption = Output.table,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Show each table's log: mode, address, offsets held, memory and readers, from the
    MetaService and the log services it names."""
    out = Printer(output)
    try:
        with MetaServiceClient(url, token=token) as ms:
            views = [ms.get_table(table)] if table else ms.all_tables()
    except MetaServiceError as exc:
        raise fmt.fail(str(exc)) from None
    logs = [_table_log(view) for view in views if view.log is not None]
    if out.json:
        return out.dump(logs)
    if table and not logs:
        raise fmt.fail(
            f'table {table} has no log: enable it with register(..., log="embedded") in '
            'its writing job, or run `metaservice log start` and register(..., log="external")'
        )
    out.table(
        f"{len(logs)} table logs",
        ("table", "mode", "address", "epoch", "offsets held", "entries", "memory", "readers"),
        [_row(entry) for entry in logs],
    )


def _table_log(view: TableView) -> dict[str, Any]:
    """The table's registration and its log service's status (or why there is none)."""
    assert view.log is not None
    entry: dict[str, Any] = {
        "table": view.name,
        "log": view.log.model_dump(),
        "status": None,
        "error": None,
    }
    try:
        with LogClient(view.log.address, timeout=5.0) as client:
            found = client.status(view.name)
        entry["status"] = found[0] if found else None
    except LogError as exc:
        entry["error"] = str(exc)
    return entry


def _row(entry: dict[str, Any]) -> tuple[str, ...]:
    log, found = entry["log"], entry["status"]
    if found is None:
        problem = entry["error"] or "no status"
        return (entry["table"], log["mode"], log["address"], "-", problem, "-", "-", "-")
    return (
        entry["table"],
        log["mode"],
        log["address"],
        str(found["epoch"]),
        _offsets(found),
        str(found["entries"]),
        shown_bytes(found["bytes"]) + (" (over bound)" if found["over_bound"] else ""),
        ", ".join(found["readers"]) or "-",
    )


def _offsets(found: dict[str, Any]) -> str:
    first, last = found["first"], found["last"]
    if first is None or last is None:
        return "empty"
    return f"batch {first['batch_id']}..{last['batch_id']} (seq {first['seq']}..{last['seq']})"
