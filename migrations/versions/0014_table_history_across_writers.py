"""tables and commits: a table's history outlives its writer

Every state change keeps every answer already given: a table's barrier-to-snapshot
history is what the consistent versions handed out for it named, so it stays when its
writer is deleted (``commits.job_id`` becomes NULL: the batch's job is gone, the
table's snapshot at each barrier is not), and the table remembers how far its former
writer answered for it (``handover_barrier``) and of which kind that writer was
(``handover_kind``), so a new writer starts above that barrier and only a writer that
keeps the table's exactness takes it on. Existing rows keep their meaning (NULL: the
table never lost a writer), so nothing is backfilled.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WITH_SNAPSHOT = sa.text("snapshot_id IS NOT NULL")
_INDEX = "ix_commits_table_barrier_with_snapshot"


def _commits_job_id(nullable: bool) -> None:
    # SQLite rebuilds the table for the change; its partial index is made again after,
    # so the rebuild cannot lose the index's condition.
    op.drop_index(_INDEX, table_name="commits")
    with op.batch_alter_table("commits") as batch:
        batch.alter_column("job_id", existing_type=sa.Integer(), nullable=nullable)
    op.create_index(
        _INDEX,
        "commits",
        ["table_id", "barrier", "batch_id", "snapshot_id"],
        postgresql_where=_WITH_SNAPSHOT,
        sqlite_where=_WITH_SNAPSHOT,
    )


def upgrade() -> None:
    _commits_job_id(nullable=True)
    with op.batch_alter_table("tables") as batch:
        batch.add_column(sa.Column("handover_barrier", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("handover_kind", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tables") as batch:
        batch.drop_column("handover_kind")
        batch.drop_column("handover_barrier")
    op.execute("DELETE FROM commits WHERE job_id IS NULL")
    _commits_job_id(nullable=False)
