from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Iceberg ref names are free text; these are safe in every catalog, URL and shell.
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"
# A bound the database holds (BIGINT) with room for the arithmetic on it (seconds to ms).
MAX_RETAIN_SECONDS = 2**53 // 1000


class TagRequest(BaseModel):
    """The body of ``POST /versions/tags``: publish the consistent version of ``tables``
    as an Iceberg tag ``name`` in each of them."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="The tag's name: 1-100 letters, digits, '_', '.', '-', starting with a "
        "letter or digit; not 'main'. Unique: a name names one version",
        examples=["daily-2026-12-01"],
    )
    tables: list[str] = Field(min_length=1, examples=[["dwd.order_detail", "dws.item_revenue"]])
    at_or_before: int | None = Field(
        None, ge=0, description="Tag the latest consistent version at or before this barrier"
    )
    retain_seconds: int | None = Field(
        None,
        ge=1,
        le=MAX_RETAIN_SECONDS,
        description="The tag ends this long after it is made (its Iceberg tags get a "
        "max-ref-age); left out: kept until deleted",
        examples=[7 * 86_400],
    )


class TagView(BaseModel):
    """A published (or still being published) consistent version."""

    name: str
    barrier: int = Field(description="The consistent version's barrier")
    snapshots: dict[str, int | None] = Field(
        description="The snapshot each table's Iceberg tag points at; null for a table "
        "still empty at the barrier (it has no Iceberg tag)"
    )
    state: Literal["creating", "published"] = Field(
        description="creating: the Iceberg tags are being made (or a failed attempt left "
        "some: DELETE the tag); published: every table has its Iceberg tag"
    )
    created_ms: int
    expires_ms: int | None = Field(
        None, description="When the tag ends (retain_seconds after it was made); null: never"
    )
