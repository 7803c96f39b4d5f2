"""``metaservice expire``, and the ``--expire-every`` option of ``metaservice start``.

A query command: it calls a running MetaService through the client and needs the base
install only (no server, no pyiceberg here: the service does the expiry).
"""

from __future__ import annotations

import json
import re
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from metaservice.client import MetaServiceClient, MetaServiceError
from metaservice.lifecycle.schemas import ExpiryResult

console = Console()
err = Console(stderr=True)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number with an optional unit (ms, s, m, h, d; seconds
    without one), e.g. ``10m``, ``90s``, ``1.5h``.

    >>> parse_duration("10m")
    600.0
    """
    found = _DURATION.match(text)
    if found is None:
        raise typer.BadParameter(
            f"{text!r} is not a duration: give a number and a unit, e.g. 30s, 10m, 1h, 1d"
        )
    return float(found.group(1)) * _UNIT_SECONDS[found.group(2) or "s"]


ExpireEveryOption = Annotated[
    float | None,
    typer.Option(
        "--expire-every",
        parser=parse_duration,
        metavar="DURATION",
        help="Expire every table's unused snapshots on this period, e.g. 10m "
        "(METASERVICE_EXPIRE_EVERY_SECONDS; needs the iceberg extra). Default: off",
        show_default=False,
    ),
]


def expire(
    tables: Annotated[list[str], typer.Argument(help="Table identifiers, e.g. ods.orders")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; change nothing")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON")] = False,
    url: Annotated[
        str,
        typer.Option("--url", envvar="METASERVICE_URL", help="Base URL of a running MetaService."),
    ] = "http://127.0.0.1:8765",
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="METASERVICE_TOKEN", help="Bearer token, when auth is on."),
    ] = None,
) -> None:
    """Expire the tables' snapshots that nothing uses any more (admin), and delete the
    files only they referenced; print snapshots, files and bytes per table.

    Exits with 1 when any table failed (the others are expired all the same).
    """
    results: list[ExpiryResult] = []
    failed = False
    with MetaServiceClient(url, token=token) as ms:
        for table in tables:
            try:
                results.append(ms.expire(table, dry_run=dry_run))
            except MetaServiceError as exc:
                err.print(f"[bold red]error:[/] {escape(table)}: {escape(str(exc))}")
                failed = True
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in results], indent=2))
    else:
        for result in results:
            _print(result)
    if failed:
        raise typer.Exit(code=1)


def _print(r: ExpiryResult) -> None:
    verb = "would remove" if r.dry_run else "removed"
    console.print(
        f"[bold]{escape(r.table)}[/]: {verb} {r.snapshots_removed} snapshots, "
        f"{r.files_removed} files, {_bytes(r.bytes_freed)}"
    )
    if r.dry_run:
        for s in r.snapshots:
            console.print(f"  snapshot {s.snapshot_id} (barrier {s.barrier}, batch {s.batch_id})")
        for f in r.files:
            console.print(f"  {f.kind} {escape(f.path)} ({_bytes(f.bytes)})")
    if r.already_gone:
        console.print(f"  already gone from the table (recorded): {r.already_gone}")
    if r.held_by_refs:
        console.print(f"  kept, a branch or tag points at them: {r.held_by_refs}")


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
