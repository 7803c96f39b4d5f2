"""expiry execution: the snapshots an expiry removed, and per-table retention policies

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "expired_snapshots",
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=False),
        sa.Column("barrier", sa.BigInteger(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("expired_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.id"],
            name=op.f("fk_expired_snapshots_table_id_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("table_id", "snapshot_id", name=op.f("pk_expired_snapshots")),
    )
    op.create_table(
        "table_retention",
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("keep_last", sa.BigInteger(), nullable=True),
        sa.Column("keep_for_seconds", sa.BigInteger(), nullable=True),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.id"],
            name=op.f("fk_table_retention_table_id_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("table_id", name=op.f("pk_table_retention")),
    )


def downgrade() -> None:
    op.drop_table("table_retention")
    op.drop_table("expired_snapshots")
