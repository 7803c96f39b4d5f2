"""api_tokens: the jobs a writer token may act for (NULL: every job, as before)

A writer token may be scoped to jobs by name or pattern (``ingest_*,build_order_detail``):
it then acts only on those jobs and the tables they write. Tokens issued before keep
their meaning, so the column is nullable and nothing is backfilled.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("jobs", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("jobs")
