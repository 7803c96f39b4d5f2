"""tables: the log a table's writer publishes (mode and address of its log service)

A table may have a log store: embedded in its writing Spark driver or a standalone
``metaservice log start``. The writer publishes where it runs; readers and
``metaservice log status`` look it up on the table.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("log_mode", sa.String(16), nullable=True))
        batch.add_column(sa.Column("log_address", sa.String(400), nullable=True))
        batch.add_column(sa.Column("log_updated_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tables") as batch:
        batch.drop_column("log_updated_ms")
        batch.drop_column("log_address")
        batch.drop_column("log_mode")
