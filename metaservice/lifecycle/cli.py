"""``metaservice expire``, and the ``--expire-every`` option of ``metaservice start``.

A query command: it calls a running MetaService through the client and needs the base
install only (no server, no pyiceberg here: the service does the expiry).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from metaservice.cli_output import (
    DEFAULT_URL,
    JsonFlag,
    Output,
    OutputOption,
    Printer,
    TokenOption,
    UrlOption,
    parse_duration,
)
from metaservice.client import MetaServiceClient, MetaServiceError
from metaservice.lifecycle.schemas import ExpiryResult

err = Console(stderr=True)

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
    output: OutputOption = Output.table,
    as_json: JsonFlag = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Expire the tables' snapshots that nothing uses any more (admin), and delete the
    files only they referenced; print snapshots, files and bytes per table.

    Exits with 1 when any table failed (the others are expired all the same).
    """
    out = Printer(output, json_flag=as_json)
    results: list[ExpiryResult] = []
    failed = False
    with MetaServiceClient(url, token=token) as ms:
        for table in tables:
            try:
                results.append(ms.expire(table, dry_run=dry_run))
            except MetaServiceError as exc:
                err.print(f"[bold red]error:[/] {escape(table)}: {escape(str(exc))}")
                failed = True
    if out.json:
        out.dump(results)
    else:
        for result in results:
            _print(out, result)
    if failed:
        raise typer.Exit(code=1)


def _print(out: Printer, r: ExpiryResult) -> None:
    verb = "would remove" if r.dry_run else "removed"
    out.line(
        f"[bold]{escape(r.table)}[/]: {verb} {r.snapshots_removed} snapshots, "
        f"{r.files_removed} files, {_bytes(r.bytes_freed)}"
    )
    if r.dry_run:
        for s in r.snapshots:
            out.line(f"  snapshot {s.snapshot_id} (barrier {s.barrier}, batch {s.batch_id})")
        for f in r.files:
            out.line(f"  {f.kind} {escape(f.path)} ({_bytes(f.bytes)})")
    if r.already_gone:
        out.line(f"  already gone from the table (recorded): {r.already_gone}")
    if r.held_by_refs:
        out.line(f"  kept, a branch or tag points at them: {r.held_by_refs}")
    if r.refused_files:
        left = "would leave" if r.dry_run else "left"
        out.line(
            f"  [bold yellow]{left} {len(r.refused_files)} files outside the table's location "
            "and the log spill locations[/] (not the service's to delete):"
        )
        for refused in r.refused_files:
            path = escape(refused.path)
            out.line(f"  refused {refused.kind} {path} (snapshot {refused.snapshot_id})")


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
