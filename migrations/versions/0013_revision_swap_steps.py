"""revision_swap_steps: the journal of a swap through a catalog outside this database

With a catalog outside the MetaService's database the swap's renames cannot share the
transaction that swaps the records. That transaction writes them as steps instead, and
each step is marked done once the catalog shows it done; a retry finishes the same steps.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "revision_swap_steps",
        sa.Column("revision_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(420), nullable=False),
        sa.Column("target", sa.String(420), nullable=False),
        sa.Column("moves", sa.String(16), nullable=False),
        sa.Column("done_ms", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["revision_id"],
            ["revisions.id"],
            name=op.f("fk_revision_swap_steps_revision_id_revisions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("revision_id", "position", name=op.f("pk_revision_swap_steps")),
    )


def downgrade() -> None:
    op.drop_table("revision_swap_steps")
