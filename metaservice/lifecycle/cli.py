"""``metaservice expirable`` and ``metaservice expire``, and the ``--expire-every`` option of
``metaservice start``.

Query commands: they call a running MetaService through the client and need the base
install only (no server, no pyiceberg here: the service does the expiry).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from metaservice import cli_output as fmt
from metaservice.client import MetaServiceClient, MetaServiceError
from metaservice.lifecycle.schemas import ExpiryPlan, ExpiryResult

err = Console(stderr=True)

ExpireEveryOption = Annotated[
    float | None,
    typer.Option(
        "--expire-every",
        parser=fmt.parse_duration,
        metavar="DURATION",
        help="Expire every table's unused snapshots on this period, e.g. 10m "
        "(METASERVICE_EXPIRE_EVERY_SECONDS; needs the iceberg extra). Default: off",
        show_default=False,
    ),
]


def expirable(
    table: Annotated[str, typer.Argument(help="Table identifier")],
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Show which snapshots of a table may be expired and why the others are kept."""
    fmt.answer(url, token, lambda ms: ms.expirable(table), _show_plan, output=output)


def _show_plan(out: fmt.Printer, plan: ExpiryPlan) -> None:
    out.line(
        f"{len(plan.expirable)} snapshots of {escape(plan.table)} may be expired; "
        f"{len(plan.kept)} kept"
    )
    out.table(
        f"{len(plan.kept)} kept",
        ("snapshot", "barrier", "kept because"),
        [(str(s.snapshot_id), fmt.when(s.barrier), "; ".join(s.reasons)) for s in plan.kept],
    )


def expire(
    tables: Annotated[list[str], typer.Argument(help="Table identifiers, e.g. ods.orders")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; change nothing")
    ] = False,
    output: fmt.OutputOption = fmt.Output.table,
    as_json: fmt.JsonFlag = False,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Expire the tables' snapshots that nothing uses any more (admin), and delete the
    files only they referenced; print snapshots, files and bytes per table.

    Exits with 1 when any table failed (the others are expired all the same).
    """
    out = fmt.Printer(output, json_flag=as_json)
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


def _print(out: fmt.Printer, r: ExpiryResult) -> None:
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
