"""The worker registry's table (``statepact_workers``)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
)
from sqlalchemy.dialects import postgresql

from statepact.storage.postgres._schema.columns import ident, tz

__all__ = ["define_worker_table"]


def define_worker_table(meta: MetaData, db_schema: str | None) -> Table:
    """Live workers for the dashboard (``statepact.dashboard.workers``, ``statepact_0010``).

    One row per worker, rewritten by its beat; a row whose ``last_seen`` is older
    than its ``ttl_seconds`` is a worker that went away. Only the registry reads it.
    """
    return Table(
        "statepact_workers",
        meta,
        Column("worker_id", ident(), nullable=False),
        Column("host", Text, nullable=False),
        Column("queues", postgresql.JSONB, nullable=False),
        Column("concurrency", Integer, nullable=False),
        Column("in_flight", Integer, nullable=False),
        Column("failures", BigInteger, nullable=False),
        Column("last_error", Text, nullable=True),
        Column("ttl_seconds", Double, nullable=False),
        Column("started_at", tz(), nullable=False),
        Column("last_seen", tz(), nullable=False),
        PrimaryKeyConstraint("worker_id"),
        # The live listing and the sweep of the gone both read by last_seen.
        Index("ix_statepact_workers_last_seen", "last_seen"),
        schema=db_schema,
    )
