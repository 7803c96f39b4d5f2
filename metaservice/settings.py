"""The one settings object: environment variables prefixed ``METASERVICE_`` and CLI flags."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything the service can be told. Every field has a default that works on a fresh machine.

    >>> Settings(db_url="sqlite:///ms.db").barrier_interval_ms
    1000
    """

    model_config = SettingsConfigDict(env_prefix="METASERVICE_", extra="ignore")

    db_url: str = Field(
        "sqlite:///metaservice.db",
        description="SQLAlchemy URL of the MetaService database (SQLite file or postgresql+psycopg://).",
    )
    warehouse: str = Field("warehouse", description="Folder of the Iceberg warehouse.")
    host: str = "127.0.0.1"
    port: int = 8765
    barrier_interval_ms: int = Field(1000, gt=0, description="Width of one barrier-clock slot.")
    retain_last_snapshots: int = Field(
        1, ge=1, description="Retention policy: the newest N snapshots of a table are kept."
    )
    retain_seconds: int = Field(
        0, ge=0, description="Retention policy: snapshots younger than this are kept."
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)
    max_tables_per_query: int = Field(1000, gt=0)
    max_lineage_depth: int = Field(1000, gt=0)
    max_page_size: int = Field(1000, gt=0)
    max_commits_per_request: int = Field(10_000, gt=0)
    max_lease_seconds: int = Field(7 * 24 * 3600, gt=0)
    log_level: str = "info"
    auth_required: bool = Field(
        False,
        description="Require a bearer token on every /api/v1 request; off, every caller is admin.",
    )
    metrics_public: bool = Field(
        True,
        description="Serve /metrics without a token even when auth is required (for scrapers).",
    )
