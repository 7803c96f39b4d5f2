"""``metaservice log start`` (the standalone log service) and ``metaservice log status``.

``status`` is a query command (the MetaService client only: the MetaService asks the log
services); ``start`` runs the server's code, imported inside the command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from metaservice import cli_output as fmt
from metaservice.client import MetaServiceClient, NotFoundError
from metaservice.logstore.store import (
    DEFAULT_KEEP_BARRIERS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SPILL_BYTES,
)
from metaservice.logstore.wire import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_INFLATED_BYTES,
)
from metaservice.topology.schemas import LogServiceStatus, LogStatus, TableLogStatus

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
            help="Memory bound per table, e.g. 256M: the oldest persisted rows go first; "
            "rows not yet persisted are spilled to --spill-dir, or kept and reported as "
            "over the bound",
        ),
    ] = DEFAULT_MAX_BYTES,
    spill_dir: Annotated[
        str | None,
        typer.Option(
            "--spill-dir",
            metavar="URI",
            help="Where rows past --max-bytes that no snapshot holds yet go, as files under "
            "URI/<table>/ (a folder or s3://bucket/path). Writers list them in the batch's "
            "snapshot summary, and expiring the snapshot deletes them, so the MetaService "
            "must reach it too (put it in the warehouse)",
        ),
    ] = None,
    spill_property: Annotated[
        list[str] | None,
        typer.Option(
            "--spill-property",
            metavar="KEY=VALUE",
            help="A pyiceberg FileIO property for --spill-dir, e.g. s3.endpoint=http://... "
            "(repeat for several)",
        ),
    ] = None,
    max_spill_bytes: Annotated[
        int,
        typer.Option(
            "--max-spill-bytes",
            parser=parse_bytes,
            metavar="SIZE",
            help="Spill space per table, e.g. 4G: past it (and --max-bytes) appends are "
            "refused (log_full) and the log falls behind; readers read snapshots",
        ),
    ] = DEFAULT_MAX_SPILL_BYTES,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            "--max-body-bytes",
            parser=parse_bytes,
            metavar="SIZE",
            help="Largest append body, refused (413) while it streams",
        ),
    ] = DEFAULT_MAX_BODY_BYTES,
    max_inflated_bytes: Annotated[
        int,
        typer.Option(
            "--max-inflated-bytes",
            parser=parse_bytes,
            metavar="SIZE",
            help="Most an append's rows may take once decoded (a compressed body, 413 past it)",
        ),
    ] = DEFAULT_MAX_INFLATED_BYTES,
    metaservice_url: Annotated[
        str | None,
        typer.Option(
            "--metaservice-url",
            envvar="METASERVICE_URL",
            metavar="URL",
            help="Check every caller's bearer token with this MetaService (run it with "
            "--auth-required): writers to write, readers to read. Needed to listen beyond "
            "127.0.0.1",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            metavar="FILE",
            help="A file holding this log service's own writer token, with which it proves "
            "to the MetaService that it is a log service (so that the MetaService accepts "
            "and asks its address); or the METASERVICE_TOKEN environment variable",
        ),
    ] = None,
) -> None:
    """Run a standalone log service (log="external") until Ctrl-C.

    Writers append to it and readers follow it by table; each table's writer publishes
    this address to the MetaService (PUT /api/v1/tables/{table}/log). Beyond 127.0.0.1
    it checks every caller's token with the MetaService (--metaservice-url), and refuses
    to start without.
    """
    try:
        from metaservice.logstore.auth import LogAuth, LogAuthError
        from metaservice.logstore.server import BodyLimits, prepare, serve
        from metaservice.logstore.store import LogStore
    except ModuleNotFoundError as exc:
        raise fmt.fail(
            f"`metaservice log start` runs the log service, which needs the module "
            f"{exc.name!r}; it is not installed. Install the server's dependencies and "
            "pyarrow: pip install 'metaservice[server,iceberg]'"
        ) from None
    store = LogStore(
        keep_barriers=keep_barriers,
        max_bytes=max_bytes,
        spill_root=spill_dir,
        spill_properties=_properties(spill_property or []),
        max_spill_bytes=max_spill_bytes,
    )
    token = _own_token(token_file)
    auth = LogAuth(metaservice_url, token=token) if metaservice_url else None
    if token and auth is None:
        raise fmt.fail("a token is given without --metaservice-url: give the MetaService's URL")
    try:
        prepare(host, auth)  # before anything is said about a service that will not start
    except LogAuthError as exc:
        raise fmt.fail(str(exc)) from None
    spills = (
        f"spills to {spill_dir}, up to {shown_bytes(max_spill_bytes)} per table"
        if spill_dir
        else "no spill folder"
    )
    checks = f"checks tokens with {metaservice_url}" if auth else "no auth: loopback only"
    typer.echo(
        f"log service on http://{host}:{port} (keeps unpersisted rows + {keep_barriers} "
        f"persisted barriers, {shown_bytes(max_bytes)} per table, {spills}; {checks}); "
        "Ctrl-C stops it",
        err=True,
    )
    limits = BodyLimits(body_bytes=max_body_bytes, inflated_bytes=max_inflated_bytes)
    try:
        serve(store, host=host, port=port, auth=auth, limits=limits)
    except LogAuthError as exc:
        raise fmt.fail(str(exc)) from None
    typer.echo("log service stopped", err=True)


def _own_token(token_file: Path | None) -> str | None:
    if token_file is None:
        return os.environ.get("METASERVICE_TOKEN") or None
    try:
        return token_file.read_text().strip() or None
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot read {token_file}: {exc}", param_hint="--token-file"
        ) from None


def _properties(pairs: list[str]) -> dict[str, str]:
    properties = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(
                f"{pair!r} is not KEY=VALUE (e.g. s3.endpoint=http://127.0.0.1:9000)",
                param_hint="--spill-property",
            )
        properties[key.strip()] = value
    return properties


@app.command()
def status(
    table: Annotated[str | None, typer.Option("--table", "-t", help="Only this table")] = None,
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Show each table's log: mode, address, offsets held, memory and readers, as the
    MetaService gets them from the log services it names (GET /api/v1/tables/{table}/log);
    a log spread over several services gets a row per service."""

    def logs_of(ms: MetaServiceClient) -> list[TableLogStatus]:
        if table:  # a table without a log: 404 no_log says how to enable one
            return [ms.get_table_log(table)]
        named = [v.name for v in ms.all_tables() if v.log is not None]
        return [found for name in named if (found := _log_of(ms, name)) is not None]

    fmt.answer(url, token, logs_of, _show_logs, output=output)


def _show_logs(out: fmt.Printer, logs: list[TableLogStatus]) -> None:
    out.table(
        f"{len(logs)} table logs",
        ("table", "mode", "address", "epoch", "offsets held", "entries", "memory", "readers"),
        [row for entry in logs for row in _rows(entry)],
    )


def _log_of(ms: MetaServiceClient, table: str) -> TableLogStatus | None:
    try:
        return ms.get_table_log(table)
    except NotFoundError:  # its log (or the table) went since the list was read
        return None


def _rows(entry: TableLogStatus) -> list[tuple[str, ...]]:
    """One row per log service of the table (a log may be spread over several)."""
    services = entry.services or [
        LogServiceStatus(
            address=entry.address, reachable=entry.reachable, status=entry.status, error=entry.error
        )
    ]
    return [_row(entry.table, entry.mode, one) for one in services]


def _row(table: str, mode: str, service: LogServiceStatus) -> tuple[str, ...]:
    found = service.status
    if found is None:
        problem = service.error or "no status"
        return (table, mode, service.address, "-", problem, "-", "-", "-")
    return (
        table,
        mode,
        service.address,
        str(found.epoch),
        _offsets(found),
        str(found.entries),
        shown_bytes(found.bytes) + (" (over bound)" if found.over_bound else ""),
        ", ".join(found.readers) or "-",
    )


def _offsets(found: LogStatus) -> str:
    first, last = found.first, found.last
    if first is None or last is None:
        return "empty"
    return f"batch {first.batch_id}..{last.batch_id} (seq {first.seq}..{last.seq})"
