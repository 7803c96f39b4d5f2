"""``metaservice db upgrade|current``: the database's migrations."""

from __future__ import annotations

import typer

from metaservice.cli.server_code import DbOption, console, fail, needs_server, settings_from

db_app = typer.Typer(help="Manage the MetaService database.", no_args_is_help=True)


@db_app.command("upgrade")
@needs_server("db upgrade")
def db_upgrade(db: DbOption = None, revision: str = "head") -> None:
    """Apply Alembic migrations to the database."""
    from metaservice.migrate import upgrade

    url = settings_from(db_url=db).db_url
    try:
        at = upgrade(url, revision)
    except Exception as exc:
        raise fail(f"migration of {url} failed: {exc}") from exc
    console.print(f"database {url} is at migration {at}")


@db_app.command("current")
@needs_server("db current")
def db_current(db: DbOption = None) -> None:
    """Show the database's migration and the newest one this version knows."""
    from metaservice.db import make_engine
    from metaservice.migrate import current_revision, head_revision

    url = settings_from(db_url=db).db_url
    engine = make_engine(url)
    try:
        console.print(f"database {url}: at {current_revision(engine)}, newest {head_revision()}")
    finally:
        engine.dispose()
