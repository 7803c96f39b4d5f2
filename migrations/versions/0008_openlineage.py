"""openlineage: received events, observed jobs and datasets, the emit queue

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-15
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "observed_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("last_event_type", sa.String(16), nullable=True),
        sa.Column("last_run_id", sa.String(36), nullable=True),
        sa.Column("last_event_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_observed_jobs")),
        sa.UniqueConstraint("key", name=op.f("uq_observed_jobs_key")),
    )
    op.create_table(
        "observed_datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("symlinks", sa.Text(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_observed_datasets")),
        sa.UniqueConstraint("key", name=op.f("uq_observed_datasets_key")),
    )
    op.create_table(
        "observed_edges",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("direction", sa.String(8), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["observed_jobs.id"],
            name=op.f("fk_observed_edges_job_id_observed_jobs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["observed_datasets.id"],
            name=op.f("fk_observed_edges_dataset_id_observed_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "job_id", "dataset_id", "direction", name=op.f("pk_observed_edges")
        ),
    )
    op.create_index(op.f("ix_observed_edges_dataset_id"), "observed_edges", ["dataset_id"])
    op.create_table(
        "openlineage_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("event_key", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("event_type", sa.String(16), nullable=True),
        sa.Column("event_time_ms", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("received_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["observed_jobs.id"],
            name=op.f("fk_openlineage_events_job_id_observed_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_openlineage_events")),
        sa.UniqueConstraint("event_key", name=op.f("uq_openlineage_events_event_key")),
    )
    op.create_index(op.f("ix_openlineage_events_job_id"), "openlineage_events", ["job_id"])
    op.create_table(
        "openlineage_outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(200), nullable=False),
        sa.Column("event_type", sa.String(16), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("due_ms", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_openlineage_outbox")),
    )
    op.create_index("ix_openlineage_outbox_due_ms_id", "openlineage_outbox", ["due_ms", "id"])


def downgrade() -> None:
    op.drop_index("ix_openlineage_outbox_due_ms_id", table_name="openlineage_outbox")
    op.drop_table("openlineage_outbox")
    op.drop_index(op.f("ix_openlineage_events_job_id"), table_name="openlineage_events")
    op.drop_table("openlineage_events")
    op.drop_index(op.f("ix_observed_edges_dataset_id"), table_name="observed_edges")
    op.drop_table("observed_edges")
    op.drop_table("observed_datasets")
    op.drop_table("observed_jobs")
