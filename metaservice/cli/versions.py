"""``metaservice consistent`` and ``metaservice lease create|release``: the snapshots of
several tables that belong together, and pinning them against expiry."""

from __future__ import annotations

import math
from typing import Annotated

import typer
from rich.markup import escape

from metaservice import cli_output as fmt
from metaservice.versions.schemas import ConsistentVersion

lease_app = typer.Typer(
    help="Pin a consistent version against expiry, and unpin it.", no_args_is_help=True
)


def _as_the_api(version: ConsistentVersion) -> object:
    return version.model_dump(mode="json", exclude_none=True)


def consistent(
    tables: Annotated[list[str], typer.Argument(help="Table identifiers")],
    at_or_before: Annotated[
        int | None,
        fmt.barrier_option("--at-or-before", help="Latest version at or before this barrier"),
    ] = None,
    lease_seconds: Annotated[
        int | None, typer.Option(help="Pin the snapshots for this long")
    ] = None,
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Show the snapshots of several tables that belong together."""
    fmt.answer(
        url,
        token,
        lambda ms: ms.consistent_version(
            tables, at_or_before=at_or_before, lease_seconds=lease_seconds
        ),
        _print_version,
        output=output,
        as_json=_as_the_api,
    )


def _print_version(out: fmt.Printer, version: ConsistentVersion) -> None:
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
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Pin the tables' consistent version (writer): its snapshots are not expired until
    the lease ends or is released. Prints the lease id."""
    if seconds < 1:
        raise fmt.fail("--for is less than a second")
    fmt.answer(
        url,
        token,
        lambda ms: ms.create_lease(tables, math.ceil(seconds), at_or_before=at_or_before),
        _print_version,
        output=output,
        as_json=_as_the_api,
    )


@lease_app.command("release")
def lease_release(
    lease_id: Annotated[str, typer.Argument(help="The lease's id")],
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """End a lease now (writer): its snapshots may be expired again."""
    fmt.answer(
        url,
        token,
        lambda ms: ms.delete_lease(lease_id),
        lambda out, _: out.line(f"lease {escape(lease_id)} released"),
    )
