"""Alembic environment: the URL comes from the caller (``metaservice.migrate``) or
``METASERVICE_DB_URL``; an existing connection can be handed in via ``config.attributes``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from metaservice.db import make_engine
from metaservice.models import Base
from metaservice.settings import Settings

config = context.config
target_metadata = Base.metadata


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or Settings().db_url
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or Settings().db_url
    engine = make_engine(url)
    with engine.connect() as conn:
        _configure_and_run(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
