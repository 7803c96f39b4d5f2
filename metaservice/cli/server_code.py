"""What the commands that run the server's own code share (``start``, ``db``, ``token``,
``reconcile``, and ``log start``'s settings): the settings from flags, environment and
config file (:func:`settings_from`), ``--db``, and :func:`needs_server`, which turns a
missing ``server`` or ``iceberg`` extra into an error that names it.

The server's modules are imported inside the functions: this module loads with the base
install, so that ``metaservice --help`` and the query commands need nothing more.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from metaservice.settings import Settings

P = ParamSpec("P")
R = TypeVar("R")

# Top-level modules that only the `server` extra installs, and those of the `iceberg`
# extra (pyiceberg reads the tables' stamps for `reconcile`).
SERVER_MODULES = frozenset(
    {
        "alembic",
        "fastapi",
        "fastapi_offline",
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


class LogFormat(enum.StrEnum):  # metaservice.logs.FORMATS, without importing the server
    text = "text"
    json = "json"


def settings_from(**overrides: object) -> Settings:
    """The settings: these flags (``None``: not given), then the environment, then the
    config file; a wrong value anywhere is exit status 2 with the key and the problem."""
    from pydantic import ValidationError

    from metaservice.settings import ConfigFileError, Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ConfigFileError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(code=2) from None
    except ValidationError as exc:
        for problem in exc.errors():
            key = ".".join(str(part) for part in problem["loc"])
            err.print(
                f"[bold red]error:[/] setting {escape(key)}: {escape(problem['msg'])} "
                f"(got {escape(repr(problem['input']))})",
                soft_wrap=True,
            )
        raise typer.Exit(code=2) from None


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` (rich markup) on stderr; raise the answer (exit status 1)."""
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=1)


def needs_server(
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
                if not from_an_extra(exc):
                    raise
                tables = iceberg or top_level(exc) in ICEBERG_MODULES
                extras = "server,iceberg" if tables else "server"
                raise fail(
                    escape(
                        f"`metaservice {command}` runs the MetaService's own code, which needs "
                        f"the module {exc.name!r}; it is not installed. Install the server's "
                        f"dependencies: pip install 'metaservice[{extras}]'"
                    )
                ) from exc

        return checked

    return wrap


def top_level(exc: ModuleNotFoundError) -> str:
    return (exc.name or "").partition(".")[0]


def from_an_extra(exc: BaseException) -> bool:
    """Whether ``exc`` is a module of the server or iceberg extra missing."""
    return isinstance(exc, ModuleNotFoundError) and (
        top_level(exc) in SERVER_MODULES | ICEBERG_MODULES
    )


def key_values(option: str, pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict; a pair without ``=`` is an error."""
    bad = [pair for pair in pairs if "=" not in pair]
    if bad:
        raise fail(escape(f"{option} takes KEY=VALUE, not {bad[0]!r}"))
    return dict(pair.split("=", 1) for pair in pairs)
