"""Flow control enforced on PostgreSQL (issue 35): what a limited claim reads and keeps.

- ``adk_work``: two partial indexes on leased rows, so a claim under ``QueueLimits``
  counts a tenant's, a (tenant, limit key)'s and a limit key's leased items from the
  items themselves, reading at most ``cap`` index entries (no counters to drift).
- ``adk_queue_control``: ``rate_spent`` (the weight claimed per rate bucket, JSON
  text) and ``rate_wake`` (when the earliest item a rate held back fits).

The shapes follow ``statepact.storage.postgres.schema.metadata`` (compared by
``tests/integration/test_migrations.py``). The indexes are built under the
migration's lock (one pass over the leased rows). Schema version unchanged (3): an
older statepact ignores the new columns and indexes. A revision is a frozen
snapshot: it never imports statepact.

Revision ID: statepact_0011
Revises: statepact_0010
Create Date: 2026-12-07 19:15:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "statepact_0011"
down_revision: str | None = "statepact_0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_adk_work_leased",
        "adk_work",
        ["queue", "tenant", "limit_key"],
        postgresql_where=sa.text("status = 'leased'"),
    )
    op.create_index(
        "ix_adk_work_leased_key",
        "adk_work",
        ["queue", "limit_key"],
        postgresql_where=sa.text("status = 'leased' AND limit_key IS NOT NULL"),
    )
    op.add_column("adk_queue_control", sa.Column("rate_spent", sa.Text(), nullable=True))
    op.add_column(
        "adk_queue_control",
        sa.Column("rate_wake", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("adk_queue_control", "rate_wake")
    op.drop_column("adk_queue_control", "rate_spent")
    op.drop_index("ix_adk_work_leased_key", table_name="adk_work")
    op.drop_index("ix_adk_work_leased", table_name="adk_work")
