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
    warehouse: str = Field(
        "warehouse",
        description="Where the Iceberg tables live: a folder or a URI (s3://bucket/wh).",
    )
    catalog_properties: dict[str, str] = Field(
        default_factory=dict,
        description="pyiceberg properties of the tables' catalog (as load_catalog takes them; "
        'JSON in METASERVICE_CATALOG_PROPERTIES, e.g. {"type": "rest", "uri": "https://..."}), '
        "used by `reconcile`. Empty: a SQL catalog in db_url with tables under warehouse.",
    )
    host: str = "127.0.0.1"
    port: int = 8765
    barrier_interval_ms: int = Field(1000, gt=0, description="Width of one barrier-clock slot.")
    retention_keep_last: int = Field(
        1,
        ge=1,
        description="Default retention: the newest N snapshots of a table are kept "
        "(a table's own policy, PUT /tables/{table}/retention, overrides it).",
    )
    retention_keep_for_seconds: int = Field(
        0,
        ge=0,
        description="Default retention: snapshots reported less than this many seconds ago "
        "are kept (0: none for their age).",
    )
    expire_every_seconds: float = Field(
        0,
        ge=0,
        description="Expire every table's unused snapshots on this period, in the "
        "background (0: off; `metaservice start --expire-every 10m`).",
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
