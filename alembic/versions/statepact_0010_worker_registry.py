"""The worker registry's table, read by the dashboard's workers page.

- ``statepact_workers``: one row per live worker (id, host, queues, concurrency,
  in-flight count, failures, last error, time to live), rewritten by the
  worker's beat; a row older than its ``ttl_seconds`` is a worker that went
  away, and the registry sweeps such rows in bounded batches. Indexed on
  ``last_seen`` for the live listing and the sweep.

A revision is a frozen snapshot: it never imports statepact.

Revision ID: statepact_0010
Revises: statepact_0009
Create Date: 2026-12-10 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "statepact_0010"
down_revision: str | None = "statepact_0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "statepact_workers",
        sa.Column("worker_id", sa.Text(collation="C"), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("queues", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("in_flight", sa.Integer(), nullable=False),
        sa.Column("failures", sa.BigInteger(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("ttl_seconds", sa.Double(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_statepact_workers")),
    )
    op.create_index(
        "ix_statepact_workers_last_seen", "statepact_workers", ["last_seen"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_statepact_workers_last_seen", table_name="statepact_workers")
    op.drop_table("statepact_workers")
