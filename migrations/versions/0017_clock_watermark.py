"""clock.watermark: the per-slot watermark S (reads that never write)

Every barrier given to a source batch after S was raised lies above it, so an idle
source job's frontier is a function of recorded state (``barriers/watermark.py``).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("clock") as batch:
        batch.add_column(
            sa.Column("watermark", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("clock") as batch:
        batch.drop_column("watermark")
