"""commits: an index of the commits that carry a snapshot, per table by barrier

A table's snapshot at a barrier (versions, input ranges, the newest snapshot of a
table) skips the commits of empty batches; through the index of all commits, a table
whose batches have long been empty was read back to its last snapshot, commit by
commit. Covering (snapshot id included), so the lookup reads the index only.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WITH_SNAPSHOT = sa.text("snapshot_id IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_commits_table_barrier_with_snapshot",
        "commits",
        ["table_id", "barrier", "batch_id", "snapshot_id"],
        postgresql_where=_WITH_SNAPSHOT,
        sqlite_where=_WITH_SNAPSHOT,
    )


def downgrade() -> None:
    op.drop_index("ix_commits_table_barrier_with_snapshot", table_name="commits")
