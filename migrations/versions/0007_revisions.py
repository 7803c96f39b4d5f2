"""revisions: a table and its downstream closure mirrored from a barrier

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "revisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("from_barrier", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.id"],
            name=op.f("fk_revisions_table_id_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_revisions")),
    )
    op.create_index(op.f("ix_revisions_table_id"), "revisions", ["table_id"])
    op.create_index(op.f("ix_revisions_state"), "revisions", ["state"])
    op.create_table(
        "revision_tables",
        sa.Column("revision_id", sa.Integer(), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("mirror", sa.String(420), nullable=False),
        sa.Column("start_snapshot_id", sa.BigInteger(), nullable=True),
        sa.Column("writer", sa.String(200), nullable=False),
        sa.Column("frontier", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["revision_id"],
            ["revisions.id"],
            name=op.f("fk_revision_tables_revision_id_revisions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.id"],
            name=op.f("fk_revision_tables_table_id_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("revision_id", "table_id", name=op.f("pk_revision_tables")),
        sa.UniqueConstraint("mirror", name=op.f("uq_revision_tables_mirror")),
    )
    op.create_index(op.f("ix_revision_tables_table_id"), "revision_tables", ["table_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_revision_tables_table_id"), table_name="revision_tables")
    op.drop_table("revision_tables")
    op.drop_index(op.f("ix_revisions_state"), table_name="revisions")
    op.drop_index(op.f("ix_revisions_table_id"), table_name="revisions")
    op.drop_table("revisions")
