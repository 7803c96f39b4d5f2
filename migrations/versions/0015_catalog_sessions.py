"""catalog_sessions, catalog_session_tables: the Iceberg REST catalog's sessions

An engine attached to ``/iceberg`` gets a session whose every table reads one
consistent version, pinned by a lease (the session's id) and kept under the names
the tables had when the session was configured.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "catalog_sessions",
        sa.Column("lease_id", sa.String(36), nullable=False),
        sa.Column("warehouse", sa.String(200), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["lease_id"],
            ["leases.id"],
            name=op.f("fk_catalog_sessions_lease_id_leases"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("lease_id", name=op.f("pk_catalog_sessions")),
    )
    op.create_table(
        "catalog_session_tables",
        sa.Column("lease_id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(400), nullable=False),
        sa.Column("table_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["lease_id"],
            ["catalog_sessions.lease_id"],
            name=op.f("fk_catalog_session_tables_lease_id_catalog_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["table_id"],
            ["tables.id"],
            name=op.f("fk_catalog_session_tables_table_id_tables"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("lease_id", "name", name=op.f("pk_catalog_session_tables")),
    )
    op.create_index(
        op.f("ix_catalog_session_tables_table_id"), "catalog_session_tables", ["table_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_catalog_session_tables_table_id"), table_name="catalog_session_tables")
    op.drop_table("catalog_session_tables")
    op.drop_table("catalog_sessions")
