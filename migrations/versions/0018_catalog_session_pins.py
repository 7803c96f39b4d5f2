"""A catalog session pins its version with one lease row, whatever its table count

``leases.all_tables``: a lease that keeps, on every table, the snapshot at its barrier
(the catalog's ``consistent`` and ``at:`` sessions), in place of one lease_snapshots row
per table. ``catalog_sessions.tables``: the session's tables as one JSON object (the name
each is read under -> [table id, snapshot id]), in place of catalog_session_tables. A
live session is converted: its tables and their pinned snapshots move into the JSON; its
lease keeps its lease_snapshots rows (it stays a per-table lease).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Columns are added and dropped in place (SQLite 3.35+ drops one without rebuilding the
# table): a batch rebuild drops the old table, and with foreign keys on, SQLite cascades
# that to the rows referring to it (every lease's snapshots and sessions).


def upgrade() -> None:
    op.add_column(
        "leases", sa.Column("all_tables", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column(
        "catalog_sessions", sa.Column("tables", sa.Text(), nullable=False, server_default="{}")
    )
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT t.lease_id, t.name, t.table_id, s.snapshot_id "
            "FROM catalog_session_tables t LEFT JOIN lease_snapshots s "
            "ON s.lease_id = t.lease_id AND s.table_id = t.table_id"
        )
    ).all()
    sessions: dict[str, dict[str, list[int | None]]] = defaultdict(dict)
    for lease_id, name, table_id, snapshot_id in rows:
        sessions[lease_id][name] = [table_id, snapshot_id]
    for lease_id, tables in sessions.items():
        conn.execute(
            sa.text("UPDATE catalog_sessions SET tables = :t WHERE lease_id = :l"),
            {"t": json.dumps(tables, sort_keys=True), "l": lease_id},
        )
    op.drop_index(op.f("ix_catalog_session_tables_table_id"), table_name="catalog_session_tables")
    op.drop_table("catalog_session_tables")


def downgrade() -> None:
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
    # An all-tables lease has no per-table rows to go back to: its session ends.
    conn = op.get_bind()
    conn.execute(
        sa.text(
            "DELETE FROM catalog_sessions WHERE lease_id IN "
            "(SELECT id FROM leases WHERE all_tables)"
        )
    )
    conn.execute(sa.text("DELETE FROM leases WHERE all_tables"))
    for lease_id, text in conn.execute(sa.text("SELECT lease_id, tables FROM catalog_sessions")):
        for name, (table_id, _) in json.loads(text).items():
            conn.execute(
                sa.text(
                    "INSERT INTO catalog_session_tables (lease_id, name, table_id) "
                    "SELECT :l, :n, :t WHERE EXISTS (SELECT 1 FROM tables WHERE id = :t)"
                ),
                {"l": lease_id, "n": name, "t": table_id},
            )
    op.execute("ALTER TABLE catalog_sessions DROP COLUMN tables")
    op.execute("ALTER TABLE leases DROP COLUMN all_tables")
