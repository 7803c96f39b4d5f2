"""The one settings object: CLI flags, environment variables prefixed ``METASERVICE_`` and
an optional TOML file, in that order of precedence, then the defaults.

The file is named by ``METASERVICE_CONFIG`` (``metaservice start --config FILE`` sets it, so
that ``--workers`` processes read the same file). Its keys are the field names::

    db_url = "postgresql+psycopg://metaservice@db/metaservice"
    port = 8765
    log_format = "json"

    [catalog_properties]
    type = "rest"
    uri = "https://catalog.example.com"

Unlike the environment, whose unrelated ``METASERVICE_*`` variables are ignored, the file is
checked strictly: an unknown key or a value of the wrong TOML type is a
:class:`ConfigFileError` naming the key.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

CONFIG_ENV = "METASERVICE_CONFIG"
# Storage properties that carry a secret (s3.secret-access-key, s3.session-token, a
# password, an account key...): never handed out by the REST catalog.
_SECRET_KEY = re.compile(r"secret|token|password|credential|access-key|account-key|sas", re.I)


class ConfigFileError(ValueError):
    """The config file is missing, is not TOML, or has an unknown key or a wrong value."""


# Transactions one service process runs at once (see metaservice.db for why 6).
DEFAULT_MAX_TRANSACTIONS = 6
# Every this many turns, the longest waiter for a transaction goes next (metaservice.db).
OLDEST_EVERY = 8


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
    log_spill_locations: list[str] = Field(
        default_factory=list,
        description="The spill folders of external log services (their --spill-dir: a "
        "folder or a URI, s3://bucket/spill; JSON in METASERVICE_LOG_SPILL_LOCATIONS). "
        "Expiry deletes a snapshot's spilled log files only under the table's location or "
        "under <location>/<table> of one of these; any other path is logged and left.",
    )
    host: str = "127.0.0.1"
    port: int = 8765
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names the service answers to besides localhost and IP addresses "
        '(JSON in METASERVICE_ALLOWED_HOSTS, e.g. ["metaservice.example.com", "*.corp.example"]; '
        '"*": any). A request naming another Host is refused (400 host_not_allowed), so that '
        "a web page cannot reach the service through a name it controls (DNS rebinding).",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins (scheme://host[:port]) whose web pages may call the API from a "
        'browser (JSON in METASERVICE_CORS_ORIGINS, e.g. ["https://grafana.example.com"]): CORS '
        "is answered for them and their requests accepted. Empty: CORS is off and browser "
        "requests from any other origin are refused (403 cross_origin).",
    )
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
    idle_advance: Literal["auto", "background", "readers", "manual"] = Field(
        "auto",
        description="Who raises the barrier clock's watermark and advances idle derived "
        "jobs, once a slot: `background`, a task of the service (one leader across "
        "replicas on PostgreSQL), so consistent-version reads never write; `readers`, "
        "no task, and a read whose writers could move takes that write step first (the "
        "old behaviour); `manual`, neither (tests call "
        "`metaservice.barriers.advancer.tick`); `auto`, `background` on the system "
        "clock and `readers` on any other (a test's ManualClock).",
    )
    expire_every_seconds: float = Field(
        0,
        ge=0,
        description="Expire every table's unused snapshots on this period, in the "
        "background (0: off; `metaservice start --expire-every 10m`).",
    )
    max_transactions: int = Field(
        DEFAULT_MAX_TRANSACTIONS,
        gt=0,
        description="Database transactions one service process runs at once; the others "
        "wait their turn: batch barriers, commit reports and offline grants first, then "
        f"next-barrier polls, then the rest (every {OLDEST_EVERY}th turn to the longest waiter).",
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)
    max_tables_per_query: int = Field(1000, gt=0)
    max_lineage_depth: int = Field(1000, gt=0)
    max_page_size: int = Field(1000, gt=0)
    max_commits_per_request: int = Field(10_000, gt=0)
    max_lease_seconds: int = Field(7 * 24 * 3600, gt=0)
    catalog_session_idle_seconds: int = Field(
        3600,
        gt=0,
        description="How long the Iceberg REST catalog (/iceberg) keeps an idle session's "
        "version: each session's version is held by a lease that every request of the "
        "session renews; one unused for this long ends, and its snapshots may be expired.",
    )
    catalog_table_config: dict[str, str] = Field(
        default_factory=dict,
        description="Non-secret storage properties the Iceberg REST catalog hands engines "
        'with every table (JSON in METASERVICE_CATALOG_TABLE_CONFIG, e.g. {"s3.endpoint": '
        '"http://minio:9000", "s3.region": "eu-west-1"}); readers bring their own '
        "credentials, and a credential given here is refused.",
    )
    revision_ready_lag_ms: int = Field(
        5000,
        ge=0,
        description="A revision is ready to swap once every mirror's frontier is at most this "
        "far behind its original's.",
    )
    log_level: str = Field("info", description="debug, info, warning or error.")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text, or json: one JSON object per line, uvicorn's access log included.",
    )
    auth_required: bool = Field(
        False,
        description="Require a bearer token on every /api/v1 request; off, every caller is admin.",
    )
    log_address_allowlist: list[str] = Field(
        default_factory=list,
        description="Log service hosts (or host:port) the service calls without a proof "
        "that they hold a writer token (JSON in METASERVICE_LOG_ADDRESS_ALLOWLIST, e.g. "
        '["logs.internal:7070"]). Empty: with auth on, a published log address is accepted '
        "and called only when the log service there proves it holds one; given: only "
        "these addresses are accepted.",
    )
    metrics_public: bool = Field(
        True,
        description="Serve /metrics without a token even when auth is required (for scrapers).",
    )
    openlineage_url: str | None = Field(
        None,
        description="Emit OpenLineage events for barrier jobs to this backend (Marquez or any "
        "OpenLineage HTTP endpoint, e.g. http://marquez:5000); events are queued in the "
        "database, so an unreachable backend loses nothing. None: no events are emitted.",
    )
    openlineage_endpoint: str = Field(
        "api/v1/lineage", description="Path of the backend's lineage endpoint under the URL."
    )
    openlineage_api_key: str | None = Field(
        None, description="Sent to the OpenLineage backend as 'Authorization: Bearer <key>'."
    )
    openlineage_namespace: str = Field(
        "metaservice",
        min_length=1,
        description="OpenLineage namespace of the barrier jobs and their tables.",
    )
    openlineage_retry_seconds: float = Field(
        5.0,
        gt=0,
        description="How long an event the backend did not take waits before the next try.",
    )

    @field_validator("catalog_table_config")
    @classmethod
    def _no_credentials(cls, config: dict[str, str]) -> dict[str, str]:
        secret = sorted(k for k in config if _SECRET_KEY.search(k))
        if secret:
            raise ValueError(
                f"catalog_table_config must hold no credentials ({', '.join(secret)}): "
                "engines bring their own storage credentials"
            )
        return config

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win: flags (init), environment, then the file.
        path = os.environ.get(CONFIG_ENV)
        if not path:
            return init_settings, env_settings
        return init_settings, env_settings, ConfigFile(settings_cls, Path(path))


class ConfigFile(TomlConfigSettingsSource):
    """pydantic-settings' TOML source, checked against the fields before anything is merged."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        if not path.is_file():
            raise ConfigFileError(f"config file {path}: no such file")
        try:
            super().__init__(settings_cls, toml_file=path)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigFileError(f"config file {path}: not valid TOML: {exc}") from exc
        try:
            _file_model(settings_cls).model_validate(self.toml_data)
        except ValidationError as exc:
            raise ConfigFileError(
                f"config file {path}: " + "; ".join(_problem(e) for e in exc.errors())
            ) from exc


def _file_model(settings_cls: type[BaseSettings]) -> type[BaseModel]:
    """The settings' fields as a plain model that refuses unknown keys and converts nothing
    (TOML values are typed: ``port = "80"`` is a mistake, not a number)."""
    fields: dict[str, Any] = {
        name: (field.annotation, field) for name, field in settings_cls.model_fields.items()
    }
    return create_model(
        "ConfigFileKeys", __config__=ConfigDict(extra="forbid", strict=True), **fields
    )


def _problem(error: Any) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {key!r}"
    return f"{key}: {error['msg']} (got {error['input']!r})"
