"""The error history (issue 38): each item's failures, reaped leases and cancel reasons.

- ``adk_work``: ``error_history``, a nullable ``jsonb`` array of the newest entries
  (``{"attempt", "error", "at", "kind"}``, oldest first), appended by the same
  statement that writes ``last_error``; NULL for an item that never had one.

The column follows ``statepact.storage.postgres.schema.metadata`` (compared by
``tests/integration/test_migrations.py``). Adding a nullable column without a default
is a catalog change only (no table rewrite, no scan). Schema version unchanged (3):
an older statepact never selects nor writes the column. A revision is a frozen
snapshot: it never imports statepact.

Revision ID: statepact_0013
Revises: statepact_0012
Create Date: 2026-12-08 01:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "statepact_0013"
down_revision: str | None = "statepact_0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("adk_work", sa.Column("error_history", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("adk_work", "error_history")
