"""The queue's lifecycle (issue 33): cancel, unique keys, timeouts, pause, prune; schema
version 3.

- ``adk_work``: status ``cancelled`` allowed (the column widened to 16);
  ``unique_key``, ``unique_for``, ``timeout`` (the item's own fields) and
  ``unique_slot`` (the slot the item holds while it blocks others of its key, NULL
  once it stops), with a partial unique index
  on ``(queue, tenant, unique_slot)``; a partial index ``ix_adk_work_finished`` on
  ``(queue, status, updated_at) INCLUDE (tenant)`` over done, dead and cancelled items,
  which prune walks oldest first and ``stats()`` counts dead and cancelled items from.
- ``adk_queue_control``: one row per queue, whether it is paused and the pruner's
  lease.

The tables and columns follow ``statepact.storage.postgres.schema.metadata``
(compared by ``tests/integration/test_migrations.py``); the check constraint's
replacement and the ``adk_schema`` version update were written by hand. The indexes are built inside
the migration's transaction (no ``CONCURRENTLY``), which locks ``adk_work`` against
writes while they build: on a large queue, run it in a quiet moment. A revision is
a frozen snapshot: it never imports statepact.

Revision ID: statepact_0008
Revises: statepact_0007
Create Date: 2026-12-07 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "statepact_0008"
down_revision: str | None = "statepact_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


SCHEMA_VERSION = 3
PREVIOUS_SCHEMA_VERSION = 2

STATUSES = "status IN ('queued', 'leased', 'done', 'dead', 'cancelled')"
PREVIOUS_STATUSES = "status IN ('queued', 'leased', 'done', 'dead')"


def _set_version(version: int, written_by: str) -> None:
    schema = sa.table(
        "adk_schema",
        sa.column("component", sa.Text),
        sa.column("version", sa.Integer),
        sa.column("revision", sa.String),
        sa.column("applied_at", sa.DateTime(timezone=True)),
    )
    op.execute(
        schema.update()
        .where(schema.c.component == "statepact")
        .values(version=version, revision=written_by, applied_at=sa.func.now())
    )


def upgrade() -> None:
    op.create_table(
        "adk_queue_control",
        sa.Column("queue", sa.Text(collation="C"), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("pruner", sa.Text(), nullable=True),
        sa.Column("pruner_until", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("queue", name=op.f("pk_adk_queue_control")),
    )
    op.add_column("adk_work", sa.Column("unique_key", sa.Text(collation="C"), nullable=True))
    op.add_column("adk_work", sa.Column("unique_for", sa.Interval(), nullable=True))
    op.add_column("adk_work", sa.Column("timeout", sa.Double(), nullable=True))
    op.add_column("adk_work", sa.Column("unique_slot", sa.Text(collation="C"), nullable=True))
    # Longer: 'cancelled' is nine characters (a longer varchar is a catalog change only).
    op.alter_column(
        "adk_work",
        "status",
        existing_type=sa.String(length=8),
        type_=sa.String(length=16),
        existing_nullable=False,
    )
    op.drop_constraint(op.f("ck_adk_work_status"), "adk_work", type_="check")
    op.create_check_constraint(op.f("ck_adk_work_status"), "adk_work", STATUSES)
    op.create_check_constraint(
        op.f("ck_adk_work_timeout"), "adk_work", "timeout IS NULL OR timeout > 0"
    )
    op.create_index(
        "ix_adk_work_unique_slot",
        "adk_work",
        ["queue", "tenant", "unique_slot"],
        unique=True,
        postgresql_where=sa.text("unique_slot IS NOT NULL"),
    )
    op.create_index(
        "ix_adk_work_finished",
        "adk_work",
        ["queue", "status", "updated_at"],
        postgresql_include=["tenant"],
        postgresql_where=sa.text("status IN ('done', 'dead', 'cancelled')"),
    )
    _set_version(SCHEMA_VERSION, revision)


def downgrade() -> None:
    # Version 2 was written by revision statepact_0003 (0004 to 0007 kept it).
    _set_version(PREVIOUS_SCHEMA_VERSION, "statepact_0003")
    # Cancelled items have no status in version 2: they are dropped with the columns.
    op.execute("DELETE FROM adk_work WHERE status = 'cancelled'")
    op.drop_index(
        "ix_adk_work_finished",
        table_name="adk_work",
        postgresql_where=sa.text("status IN ('done', 'dead', 'cancelled')"),
    )
    op.drop_index(
        "ix_adk_work_unique_slot",
        table_name="adk_work",
        postgresql_where=sa.text("unique_slot IS NOT NULL"),
    )
    op.drop_constraint(op.f("ck_adk_work_timeout"), "adk_work", type_="check")
    op.drop_constraint(op.f("ck_adk_work_status"), "adk_work", type_="check")
    op.create_check_constraint(op.f("ck_adk_work_status"), "adk_work", PREVIOUS_STATUSES)
    op.alter_column(
        "adk_work",
        "status",
        existing_type=sa.String(length=16),
        type_=sa.String(length=8),
        existing_nullable=False,
    )
    op.drop_column("adk_work", "unique_slot")
    op.drop_column("adk_work", "timeout")
    op.drop_column("adk_work", "unique_for")
    op.drop_column("adk_work", "unique_key")
    op.drop_table("adk_queue_control")
