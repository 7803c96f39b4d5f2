"""``metaservice delay``: how late a table is, and which upstream job is to blame."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from metaservice import cli_output as fmt
from metaservice.delay.schemas import Delay


def delay(
    table: Annotated[str, typer.Argument(help="Table identifier")],
    output: fmt.OutputOption = fmt.Output.table,
    url: fmt.UrlOption = fmt.DEFAULT_URL,
    token: fmt.TokenOption = None,
) -> None:
    """Show how late a table is and which upstream job is to blame."""
    fmt.answer(url, token, lambda ms: ms.delay(table), _show_delay, output=output)


def _show_delay(out: fmt.Printer, d: Delay) -> None:
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
