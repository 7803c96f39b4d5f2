"""tables: the first batch of the table's writer that may report it

Adding an output takes effect from the job's next batch: a batch opened before the
edit was opened without the table, so its report for it would be recorded at a
barrier the table's frontier has already passed (a version already handed out would
change). ``writer_first_batch`` is the writer's next batch id when it took the table
on; reports of earlier batches for the table are refused. Tables written before keep
their meaning (NULL: every batch of the writer), so nothing is backfilled.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("writer_first_batch", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tables") as batch:
        batch.drop_column("writer_first_batch")
