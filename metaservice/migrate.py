"""Apply and inspect Alembic migrations programmatically.

Two replicas starting together on one PostgreSQL must not both run DDL, so the
upgrade holds a PostgreSQL advisory lock for its duration.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

import migrations
from metaservice.db import make_engine, normalise_url

_ADVISORY_LOCK_KEY = 7_246_001  # arbitrary, fixed: "metaservice migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def is_at_head(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()


def behind_message(current: str | None) -> str:
    """What to do about a database at migration ``current`` when this code needs the head."""
    return (
        f"database is at migration {current}, this service needs {head_revision()}; "
        "run `metaservice db upgrade` (`metaservice serve` migrates before it starts)"
    )


def upgrade(url: str, revision: str = "head") -> str | None:
    """Bring the database at ``url`` to ``revision``; returns the revision it is at."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
                conn.commit()
            try:
                cfg = alembic_config(url)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
                conn.commit()
            finally:
                if postgres:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _ADVISORY_LOCK_KEY})
                    conn.commit()
        return current_revision(engine)
    finally:
        engine.dispose()
