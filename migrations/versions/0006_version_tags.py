"""tags: consistent versions published under a name as Iceberg tags

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "version_tags",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("barrier", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_version_tags")),
        sa.UniqueConstraint("name", name=op.f("uq_version_tags_name")),
    )
    op.create_index(op.f("ix_version_tags_expires_ms"), "version_tags", ["expires_ms"])
    op.create_table(
        "version_tag_snapshots",
        sa.Column("tag_id", sa.Integer(), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tag_id"],
            ["version_tags.id"],
            name=op.f("fk_version_tag_snapshots_tag_id_version_tags"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.id"],
            name=op.f("fk_version_tag_snapshots_table_id_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tag_id", "table_id", name=op.f("pk_version_tag_snapshots")),
    )
    op.create_index(
        op.f("ix_version_tag_snapshots_table_id"), "version_tag_snapshots", ["table_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_version_tag_snapshots_table_id"), table_name="version_tag_snapshots")
    op.drop_table("version_tag_snapshots")
    op.drop_index(op.f("ix_version_tags_expires_ms"), table_name="version_tags")
    op.drop_table("version_tags")
