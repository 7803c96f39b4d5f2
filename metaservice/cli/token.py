"""``metaservice token create|list|revoke``: API tokens, straight in the database (no
running service needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from metaservice import cli_output as fmt
from metaservice.auth.schemas import Role
from metaservice.cli.server_code import DbOption, console, fail, needs_server, settings_from

if TYPE_CHECKING:
    from metaservice.context import Context
    from metaservice.db import Database

token_app = typer.Typer(
    help="Manage API tokens, directly in the database (no running service needed).",
    no_args_is_help=True,
)


def _token_db(db: str | None) -> tuple[Context, Database]:
    """The settings' database, migrated (a fresh one is often first touched by `token create`)."""
    from metaservice.context import Context
    from metaservice.db import Database
    from metaservice.logs import redact_url
    from metaservice.migrate import upgrade

    settings = settings_from(db_url=db)
    try:
        upgrade(settings.db_url)
    except Exception as exc:
        raise fail(f"cannot prepare the database {redact_url(settings.db_url)}: {exc}") from exc
    return Context(settings=settings), Database(settings.db_url)


def token_count(url: str) -> int:
    from metaservice.auth import repository
    from metaservice.db import Database

    database = Database(url)
    try:
        return database.read(repository.count)
    finally:
        database.dispose()


@token_app.command("create")
@needs_server("token create")
def token_create(
    role: Annotated[Role, typer.Option(help="What the token may do", case_sensitive=False)],
    description: Annotated[str, typer.Option(help="Whom or what the token is for")] = "",
    jobs: Annotated[
        str | None,
        typer.Option(
            help="Scope a writer token to these jobs: comma-separated names or patterns "
            "('ingest_*,build_order_detail'); it then acts only for them and the tables "
            "they write. Default: every job",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Issue a token; it is printed alone on the last line: `TOKEN=$(... | tail -n 1)`."""
    from metaservice.auth import service as auth_service

    if len(description) > 1000:
        raise fail("--description is longer than 1000 characters")
    from metaservice.errors import Invalid

    scope = _job_scope(jobs)
    ctx, database = _token_db(db)
    try:
        created = database.write(
            lambda session: auth_service.create_token(session, ctx, role, description, scope)
        )
    except Invalid as exc:
        raise fail(f"--jobs: {exc.message}") from exc
    finally:
        database.dispose()
    scoped = f", scoped to the jobs {', '.join(created.jobs)}" if created.jobs else ""
    typer.echo(
        f"token {created.id} with role {created.role.value}{scoped} created; the database "
        "keeps only its hash, so this is the one time it is shown:"
    )
    typer.echo(created.token)


def _job_scope(jobs: str | None) -> list[str] | None:
    """--jobs as the list of names or patterns it holds (checked by the service)."""
    return None if jobs is None else [p.strip() for p in jobs.split(",") if p.strip()]


@token_app.command("list")
@needs_server("token list")
def token_list(db: DbOption = None, output: fmt.OutputOption = fmt.Output.table) -> None:
    """Show every token's id, role, description and creation time (never the token)."""
    from metaservice.auth import service as auth_service

    out = fmt.printer(output)
    _, database = _token_db(db)
    try:
        page = database.read(lambda session: auth_service.list_tokens(session, 2**31 - 1, 0))
    finally:
        database.dispose()
    if out.json:
        return out.dump(page.items)
    out.table(
        f"{page.total} tokens",
        ("id", "role", "jobs", "description", "created"),
        [
            (
                str(t.id),
                t.role.value,
                ",".join(t.jobs) if t.jobs is not None else "*",
                t.description,
                fmt.when(t.created_ms),
            )
            for t in page.items
        ],
    )


@token_app.command("revoke")
@needs_server("token revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="The token's id (see `metaservice token list`)")],
    db: DbOption = None,
) -> None:
    """Revoke a token: requests presenting it are refused with 401 from now on."""
    from metaservice.auth import service as auth_service
    from metaservice.errors import NotFound

    _, database = _token_db(db)
    try:
        database.write(lambda session: auth_service.revoke_token(session, token_id))
    except NotFound as exc:
        raise fail(exc.message) from exc
    finally:
        database.dispose()
    console.print(f"token {token_id} revoked")
