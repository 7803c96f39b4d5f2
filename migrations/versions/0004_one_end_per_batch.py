"""consistency on every path: planned batch ends, abandoned batches, Spark query
identity, the outputs and inputs a batch was opened with, the expiry horizon

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("query_id", sa.String(64), nullable=True))
        batch.add_column(
            sa.Column("abandoned", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(
            sa.Column("advanced", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("outputs", sa.Integer(), nullable=True))
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("expiry_horizon", sa.BigInteger(), nullable=True))
    op.create_table(
        "batch_plans",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("after", sa.BigInteger(), nullable=False),
        sa.Column("barrier", sa.BigInteger(), nullable=True),
        sa.Column("asked", sa.Text(), nullable=False, server_default=""),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_batch_plans_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "after", name=op.f("pk_batch_plans")),
    )
    op.create_table(
        "batch_inputs",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_batch_inputs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.id"],
            name=op.f("fk_batch_inputs_table_id_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "batch_id", "table_id", name=op.f("pk_batch_inputs")),
    )


def downgrade() -> None:
    op.drop_table("batch_inputs")
    op.drop_table("batch_plans")
    with op.batch_alter_table("tables") as batch:
        batch.drop_column("expiry_horizon")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("outputs")
        batch.drop_column("advanced")
        batch.drop_column("abandoned")
        batch.drop_column("query_id")
