"""Flow control (issue 35): an item's limit key and weight, a queue's limits.

- ``adk_work``: ``limit_key`` (what the item spends, e.g. a provider's model) and
  ``weight`` (how much of it, default 1, at least 1).
- ``adk_queue_control``: ``limits``, the queue's ``QueueLimits`` as JSON text (NULL:
  none), read by every process's claims.

The columns follow ``statepact.storage.postgres.schema.metadata`` (compared by
``tests/integration/test_migrations.py``). Adding a column with a constant default
is a catalog change only (no table rewrite); the check constraint scans ``adk_work``
once under the migration's lock. Schema version unchanged (3): an older statepact
ignores the new columns and its items get weight 1 and no key. A revision is a
frozen snapshot: it never imports statepact.

Revision ID: statepact_0009
Revises: statepact_0008
Create Date: 2026-12-07 19:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "statepact_0009"
down_revision: str | None = "statepact_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("adk_work", sa.Column("limit_key", sa.Text(collation="C"), nullable=True))
    op.add_column(
        "adk_work",
        sa.Column("weight", sa.Integer(), server_default=sa.text("1"), nullable=False),
    )
    op.create_check_constraint(op.f("ck_adk_work_weight"), "adk_work", "weight >= 1")
    op.add_column("adk_queue_control", sa.Column("limits", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("adk_queue_control", "limits")
    op.drop_constraint(op.f("ck_adk_work_weight"), "adk_work", type_="check")
    op.drop_column("adk_work", "weight")
    op.drop_column("adk_work", "limit_key")
