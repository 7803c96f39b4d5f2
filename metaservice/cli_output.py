"""What every ``metaservice`` command shares: ``--output``, tables and JSON, times and durations.

One place for each fact, so that all commands print and read the same way:

- ``--output table|json`` (``-o json``): JSON is the API's own answer, fields as the REST
  API names them (times in epoch milliseconds), one document on stdout.
- Tables: drawn by rich on a terminal; plain, aligned and never truncated when stdout is
  a pipe or a file (``metaservice tables | grep dwd.order_detail``), with the title line on
  stderr so that stdout holds the header and the rows only.
- Times are shown as ISO-8601 (UTC) and relative: ``2026-05-01T12:00:00.000Z (5 s ago)``;
  a frontier of a table that never committed is ``no data yet``.
- Whatever the service answered is shown with its control characters escaped
  (``printable``): an ESC in a job description prints as ``\\x1b``, and never reaches
  the terminal as the start of a sequence; JSON output escapes them as JSON does.
- Wherever a barrier is asked for, it is read as epoch milliseconds, ISO-8601
  (``2026-05-01T12:00:00Z``; no zone means UTC), ``now``, or relative (``10m ago``).
- A query command is one call of :func:`answer`: it asks the service, prints the answer
  as JSON or as the command draws it, and turns an error of the service into exit
  status 1 (``error: ...`` on stderr)::

      answer(url, token, lambda ms: ms.delay(table), show_delay, output=output)

This module needs the base install only (typer, rich, pydantic, the client).
"""

from __future__ import annotations

import enum
import json
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from metaservice.client import MetaServiceClient, MetaServiceError

__all__ = [
    "DEFAULT_URL",
    "JsonFlag",
    "Output",
    "OutputOption",
    "Printer",
    "TokenOption",
    "UrlOption",
    "ago",
    "answer",
    "ask",
    "duration",
    "duration_ms",
    "fail",
    "frontier",
    "parse_barrier",
    "parse_duration",
    "printable",
    "printer",
    "when",
]

NO_DATA = "no data yet"
T = TypeVar("T")


class Output(enum.StrEnum):
    table = "table"
    json = "json"


OutputOption = Annotated[
    Output,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table (aligned text when piped) or json (the API's answer)",
    ),
]
DEFAULT_URL = "http://127.0.0.1:8765"
UrlOption = Annotated[
    str,
    typer.Option("--url", envvar="METASERVICE_URL", help="Base URL of a running MetaService."),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="METASERVICE_TOKEN", help="Bearer token, when auth is on."),
]
# The --json flag of the first tag, revision and expire commands, kept as an alias.
JsonFlag = Annotated[bool, typer.Option("--json", hidden=True, help="Same as --output json")]

_err = Console(stderr=True)

# C0 and C1 control characters (ESC starts the terminal's sequences), DEL, and the
# bidirectional overrides that reorder what is shown. Newlines and tabs are layout.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with its control characters written as escapes, for a terminal.

    >>> printable("ok\\x1b[2Jgone\\u202e")
    'ok\\\\x1b[2Jgone\\\\u202e'
    """
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` on stderr; raise the answer (exit status 1)."""
    _err.print(f"[bold red]error:[/] {escape(printable(message))}")
    return typer.Exit(code=1)


# -- output -------------------------------------------------------------------------------


class Printer:
    """Prints one command's answer as a table (rich on a terminal, plain when piped) or as
    JSON. ``console`` is made per command, so that a test's captured stdout is used."""

    def __init__(self, output: Output = Output.table, *, json_flag: bool = False) -> None:
        self.json = json_flag or output == Output.json
        self.console = Console()
        self.err = Console(stderr=True)

    @property
    def plain(self) -> bool:
        """Plain text (no markup, no truncation): stdout is not a terminal."""
        return not self.console.is_terminal

    def dump(self, data: Any) -> None:
        """``data`` (a model, a list of models, or JSON-able values) as JSON on stdout."""
        typer.echo(json.dumps(_jsonable(data), indent=2))

    def line(self, text: str) -> None:
        """A line of rich markup; plain text when piped (markup removed, not wrapped)."""
        self.console.print(printable(text), soft_wrap=self.plain)

    def note(self, text: str) -> None:
        """A summary line: on stdout on a terminal, on stderr when piped."""
        if self.plain:
            self.err.print(printable(text), markup=False, soft_wrap=True, highlight=False)
        else:
            self.console.print(printable(text))

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """Rows of plain strings (not markup) under ``columns``."""
        if self.plain:
            self.note(title)
            typer.echo(plain_table(columns, rows), nl=False)
            return
        table = RichTable(title=escape(printable(title)))
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*(escape(printable(cell)) for cell in row))
        self.console.print(table)


def printer(output: Output = Output.table, json_flag: bool = False) -> Printer:
    return Printer(output, json_flag=json_flag)


# -- asking the service ----------------------------------------------------------------------


def ask(url: str, token: str | None, request: Callable[[MetaServiceClient], T]) -> T:
    """``request`` made of a client of the service at ``url``; an error the service
    answers is the command's error (exit status 1)."""
    try:
        with MetaServiceClient(url, token=token) as ms:
            return request(ms)
    except MetaServiceError as exc:
        raise fail(str(exc)) from exc


def answer(
    url: str,
    token: str | None,
    request: Callable[[MetaServiceClient], T],
    show: Callable[[Printer, T], None],
    *,
    output: Output = Output.table,
    json_flag: bool = False,
    as_json: Callable[[T], Any] | None = None,
) -> T:
    """What a query command does: :func:`ask` the service, then print its answer, as
    JSON (``as_json`` of it, else all of it) or as ``show`` draws it; returns the answer
    (for an exit status that depends on it)."""
    out = Printer(output, json_flag=json_flag)
    found = ask(url, token, request)
    if out.json:
        out.dump(found if as_json is None else as_json(found))
    else:
        show(out, found)
    return found


def plain_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned with two spaces, the last one not padded; nothing cut.

    >>> print(plain_table(["a", "b"], [["x", "1"], ["long", "2"]]), end="")
    a     b
    x     1
    long  2
    """
    cells = [list(columns), *([_one_line(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for row in cells:
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines) + "\n"


def _one_line(cell: str) -> str:
    return printable(" ".join(cell.split()) if "\n" in cell or "\t" in cell else cell)


def _jsonable(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list | tuple):
        return [_jsonable(item) for item in data]
    if isinstance(data, dict):
        return {str(key): _jsonable(value) for key, value in data.items()}
    return data


# -- showing times and durations ------------------------------------------------------------


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int) -> str:
    """``2026-05-01T12:00:00.000Z``"""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def duration_ms(ms: int) -> str:
    """A length of time for people: ``250 ms``, ``5.2 s``, ``3 min``, ``2.5 h``, ``4 d``.

    >>> duration_ms(1_500), duration_ms(300_000), duration_ms(9_000_000)
    ('1.5 s', '5 min', '2.5 h')
    """
    ms = abs(ms)
    if ms < 1000:
        return f"{ms} ms"
    for unit, size, limit in (("s", 1000, 120), ("min", 60_000, 120), ("h", 3_600_000, 48)):
        value = ms / size
        if value < limit:
            return (
                f"{value:.1f} {unit}".replace(".0 ", " ") if value < 10 else f"{value:.0f} {unit}"
            )
    days = ms / 86_400_000
    return f"{days:.1f} d".replace(".0 ", " ") if days < 10 else f"{days:.0f} d"


def duration(ms: int | None) -> str:
    return "-" if ms is None else duration_ms(ms)


def ago(ms: int, now: int | None = None) -> str:
    """``5 s ago``, or ``in 3 min`` for a time ahead."""
    delta = (now_ms() if now is None else now) - ms
    return f"{duration_ms(delta)} ago" if delta >= 0 else f"in {duration_ms(delta)}"


def when(ms: int | None, *, none: str = "never", now: int | None = None) -> str:
    """``2026-05-01T12:00:00.000Z (5 s ago)``; ``none`` for no time."""
    if ms is None:
        return none
    return f"{iso(ms)} ({ago(ms, now)})"


def frontier(ms: int | None, *, now: int | None = None, written: bool = False) -> str:
    """A table's or job's frontier; 0 (a job that committed nothing yet), or None for a
    table that has a writer (``written``), is ``no data yet``; None without one is ``-``."""
    if ms is None:
        return NO_DATA if written else "-"
    return NO_DATA if ms <= 0 else when(ms, now=now)


def behind(delay: int | None, *, written: bool) -> str:
    """A table's delay; None is ``no data yet`` when the table has a writer (``written``)
    that committed nothing (the API answers null, never the age of the epoch), else ``-``."""
    if delay is None:
        return NO_DATA if written else "-"
    return duration_ms(delay)


# -- reading times and durations ------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|d)?\s*$")
_UNIT_SECONDS = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}


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


def parse_barrier(text: str, *, now: Callable[[], int] = now_ms) -> int:
    """A barrier (epoch milliseconds) from epoch ms, ISO-8601, ``now`` or ``10m ago``.

    >>> parse_barrier("1700000000000"), parse_barrier("2023-11-14T22:13:20Z")
    (1700000000000, 1700000000000)
    >>> parse_barrier("10s ago", now=lambda: 1_700_000_010_000)
    1700000000000
    """
    value = text.strip()
    if re.fullmatch(r"\d+", value):
        return int(value)
    if value.lower() == "now":
        return now()
    relative = re.fullmatch(r"(.+?)\s*ago", value, flags=re.IGNORECASE)
    if relative is not None:
        try:
            seconds = parse_duration(relative.group(1))
        except typer.BadParameter:
            pass
        else:
            return max(0, now() - round(seconds * 1000))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a time: give epoch milliseconds (1767225600000), ISO-8601 "
            "(2026-01-01T00:00:00Z), now, or a time ago (10m ago, 2h ago)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if moment.timestamp() < 0:
        raise typer.BadParameter(f"{text!r} is before 1970")
    return round(moment.timestamp() * 1000)


BarrierHelp = "epoch ms, ISO-8601 (2026-01-01T12:00:00Z), now, or relative (10m ago)"  # one wording


def barrier_option(*names: str, help: str) -> Any:
    """A typer option that takes a barrier as :func:`parse_barrier` reads it."""
    return typer.Option(*names, parser=parse_barrier, metavar="TIME", help=f"{help}: {BarrierHelp}")
