"""table_exact_barriers, tables.source_until: a table's exactness outlives its writer

A consistent version names a table at a barrier it is exact at. A derived table was
judged exact where its current writer committed, so a table taken over by a new derived
writer lost every barrier its former writer had answered for (409 where a version had
been handed out). The table now keeps them: the barriers each former derived writer
committed while it wrote the table (``table_exact_barriers``, copied at the hand-over)
and how far source jobs wrote it (``tables.source_until``: exact at every barrier at or
below). Existing rows keep their meaning (a table handed over before this migration
keeps only its current writer's barriers), so nothing is backfilled: the batches of a
deleted writer are gone.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "table_exact_barriers",
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.Column("barrier", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.id"],
            name=op.f("fk_table_exact_barriers_table_id_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("table_id", "barrier", name=op.f("pk_table_exact_barriers")),
    )
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("source_until", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tables") as batch:
        batch.drop_column("source_until")
    op.drop_table("table_exact_barriers")
