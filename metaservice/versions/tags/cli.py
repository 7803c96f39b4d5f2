"""``metaservice tag``, ``metaservice tags`` and ``metaservice untag``.

Query commands: they call a running MetaService through the client and need the base
install only (the service makes the Iceberg tags).
"""

from __future__ import annotations

import math
from typing import Annotated

import typer
from rich.markup import escape

from metaservice import cli_output as fmt
from metaservice.versions.tags.schemas import TagView


def _retain_seconds(text: str) -> int:
    seconds = fmt.parse_duration(text)
    if seconds < 1:
        raise typer.BadParameter(f"{text!r} is less than a second: give e.g. 7d, 12h, 30m")
    return math.ceil(seconds)


def tag(
    name: Annotated[str, typer.Argument(help="The tag's name, e.g. daily-2026-12-01")],
    tables: Annotated[list[str], typer.Argument(help="Table identifiers, e.g. dw.order_detail")],
    at_or_before: Annotated[
        int | None,
        fmt.barrier_option(
            "--at-or-before", help="Tag the latest version at or before this barrier"
        ),
    ] = None,
    retain: Annotated[
        int | None,
        typer.Option(
            "--retain",
            parser=_retain_seconds,
            metavar="DURATION",
            help="The tag ends this long after it is made, e.g. 7d. Default: kept until untagged",
            show_default=False,
        ),
    ] = None,
    output: fmt.OutputOption = fmt.Output.table,
    as_json: fmt.JsonFlag = False,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Publish the tables' consistent version as Iceberg tag NAME in each of them (admin):
    any Iceberg engine then reads the version by name, and expiry keeps it."""
    fmt.answer(
        url,
        token,
        lambda ms: ms.create_tag(name, tables, at_or_before=at_or_before, retain_seconds=retain),
        _show_tag,
        output=output,
        json_flag=as_json,
    )


def _show_tag(out: fmt.Printer, view: TagView) -> None:
    out.line(
        f"tag [bold]{escape(view.name)}[/]: barrier {view.barrier} ({fmt.when(view.barrier)}), "
        f"ends {fmt.when(view.expires_ms)}"
    )
    for table, snapshot in sorted(view.snapshots.items()):
        where = f"snapshot {snapshot}" if snapshot is not None else "(empty: no Iceberg tag)"
        out.line(f"  {escape(table)}: {where}")


def tags(
    table: Annotated[
        str | None, typer.Option("--table", help="Only the tags of this table")
    ] = None,
    output: fmt.OutputOption = fmt.Output.table,
    as_json: fmt.JsonFlag = False,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """List the tags that have not ended."""
    fmt.answer(
        url, token, lambda ms: ms.all_tags(table=table), _list, output=output, json_flag=as_json
    )


def _list(out: fmt.Printer, items: list[TagView]) -> None:
    now = fmt.now_ms()
    out.table(
        f"{len(items)} tags",
        ("tag", "barrier", "tables", "state", "created", "ends"),
        [
            (
                t.name,
                f"{t.barrier} ({fmt.when(t.barrier, now=now)})",
                ", ".join(
                    f"{name}@{snap if snap is not None else '-'}"
                    for name, snap in sorted(t.snapshots.items())
                ),
                t.state,
                fmt.when(t.created_ms, now=now),
                fmt.when(t.expires_ms, now=now),
            )
            for t in items
        ],
    )


def untag(
    name: Annotated[str, typer.Argument(help="The tag's name")],
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Remove tag NAME (admin): its Iceberg tags in every table, and its record."""
    fmt.answer(url, token, lambda ms: ms.delete_tag(name), _show_removed, output=output)


def _show_removed(out: fmt.Printer, view: TagView) -> None:
    out.line(
        f"tag [bold]{escape(view.name)}[/] removed from {len(view.snapshots)} tables "
        f"(barrier {view.barrier})"
    )
