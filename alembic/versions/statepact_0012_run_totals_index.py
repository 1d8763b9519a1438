"""Run totals over a window (issue 38): an index on the runs by tenant and creation.

- ``adk_runs``: ``ix_adk_runs_tenant_created`` on ``(tenant, created_at)``, so
  ``run_totals`` (the dashboard's totals per tenant over a window) reads a range of
  the tenant's runs created since the window's start, and no other run.
  ``created_at`` is never rewritten, so ``patch_run`` stays a HOT update.

The shape follows ``statepact.storage.postgres.schema.metadata`` (compared by
``tests/integration/test_migrations.py``). The index is built under the migration's
lock (one pass over the runs). Schema version unchanged (3): an older statepact
ignores the index. A revision is a frozen snapshot: it never imports statepact.

Revision ID: statepact_0012
Revises: statepact_0011
Create Date: 2026-12-07 21:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "statepact_0012"
down_revision: str | None = "statepact_0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_adk_runs_tenant_created", "adk_runs", ["tenant", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_adk_runs_tenant_created", table_name="adk_runs")
