"""The state store's and the queue's tables (``adk_*`` by default), under the names a
:class:`StateTables` gives them."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    Identity,
    Index,
    Integer,
    Interval,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    Sequence,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from statepact._limits import MAX_PRIORITY
from statepact.models import ItemStatus, RunStatus
from statepact.storage.postgres._schema.columns import FINISHED, IDENTIFIER, check_in, ident, tz

__all__ = [
    "RUNS_TABLE_OPTIONS",
    "TURNS_TABLE_OPTIONS",
    "WORK_TABLE_OPTIONS",
    "StateTables",
    "Tables",
    "define_state_tables",
]

# Storage options kept in the migration too; see statepact.storage.postgres.schema.
WORK_TABLE_OPTIONS: dict[str, Any] = {
    "autovacuum_vacuum_scale_factor": 0.01,
    "autovacuum_vacuum_cost_delay": 0,
}
# Every turns update changes an indexed column (a partial-index predicate counts),
# so none is HOT and a fillfactor would only waste pages; vacuum is what it needs.
TURNS_TABLE_OPTIONS: dict[str, Any] = {
    "autovacuum_vacuum_scale_factor": 0.01,
    "autovacuum_vacuum_cost_delay": 0,
}
RUNS_TABLE_OPTIONS: dict[str, Any] = {"fillfactor": 80}


@dataclass(frozen=True, slots=True)
class StateTables:
    """The names of the state and queue tables; each must be a plain lower-case identifier.

    A table name is interpolated into SQL, not bound (a placeholder cannot name
    a relation), so anything but ``[a-z_][a-z0-9_]*`` (at most 63 characters) is
    refused with ``ValueError`` naming the field.
    """

    runs: str = "adk_runs"
    sessions: str = "adk_sessions"
    work: str = "adk_work"
    queue_turns: str = "adk_queue_turns"
    schema: str = "adk_schema"
    run_writes: str = "adk_run_writes"
    queue_control: str = "adk_queue_control"

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for spec in fields(self):
            value = getattr(self, spec.name)
            if not isinstance(value, str) or not IDENTIFIER.match(value):
                raise ValueError(
                    f"{spec.name}: {value!r} is not a plain SQL identifier "
                    "(lower-case letters, digits and '_', not starting with a digit, "
                    "at most 63 characters)"
                )
            if value in seen:
                raise ValueError(f"{spec.name}: {value!r} names another table too")
            seen.add(value)


@dataclass(frozen=True, slots=True)
class Tables:
    """The ``Table`` objects of one :class:`StateTables` naming, and the token sequence."""

    names: StateTables
    runs: Table
    sessions: Table
    work: Table
    queue_turns: Table
    schema: Table
    run_writes: Table
    token_seq: Sequence
    queue_control: Table


def define_state_tables(meta: MetaData, names: StateTables, db_schema: str | None) -> Tables:
    runs = Table(
        names.runs,
        meta,
        Column("tenant", ident(), nullable=False),
        Column("run_id", ident(), nullable=False),
        Column("seq", BigInteger, Identity(always=True), nullable=False),
        Column("session_id", ident(), nullable=True),
        Column("status", String(16), nullable=False),
        Column("data", JSON, nullable=False),
        Column("version", BigInteger, nullable=False),
        Column("input_tokens", BigInteger, nullable=False, server_default=text("0")),
        Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
        Column("cost", Numeric(38, 9), nullable=False, server_default=text("0")),
        Column("iterations", BigInteger, nullable=False, server_default=text("0")),
        Column("cursor", BigInteger, nullable=False, server_default=text("0")),
        Column("created_at", tz(), nullable=False),
        Column("updated_at", tz(), nullable=False),
        PrimaryKeyConstraint("tenant", "run_id"),
        CheckConstraint(check_in("status", [s.value for s in RunStatus]), name="status"),
        CheckConstraint("version > 0", name="version"),
        CheckConstraint(
            "input_tokens >= 0 AND output_tokens >= 0 AND cost >= 0 "
            "AND iterations >= 0 AND cursor >= 0",
            name="counters",
        ),
        # Paging is WHERE tenant = :t [AND filter] AND seq > :after ORDER BY seq
        # LIMIT :n+1: one index per filter, each ending in seq, is an index scan.
        Index(f"ix_{names.runs}_tenant_seq", "tenant", "seq", unique=True),
        Index(
            f"ix_{names.runs}_session_seq",
            "tenant",
            "session_id",
            "seq",
            postgresql_where=text("session_id IS NOT NULL"),
        ),
        Index(f"ix_{names.runs}_status_seq", "tenant", "status", "seq"),
        # run_totals over a window: a range of the tenant's runs by creation. created_at
        # is never rewritten, so patches stay HOT.
        Index(f"ix_{names.runs}_tenant_created", "tenant", "created_at"),
        # Patches rewrite no indexed column: room on the page keeps them HOT.
        postgresql_with=dict(RUNS_TABLE_OPTIONS),
        schema=db_schema,
    )
    sessions = Table(
        names.sessions,
        meta,
        Column("tenant", ident(), nullable=False),
        Column("session_id", ident(), nullable=False),
        Column("seq", BigInteger, Identity(always=True), nullable=False),
        Column("data", JSON, nullable=False),
        Column("version", BigInteger, nullable=False),
        Column("created_at", tz(), nullable=False),
        Column("updated_at", tz(), nullable=False),
        PrimaryKeyConstraint("tenant", "session_id"),
        CheckConstraint("version > 0", name="version"),
        Index(f"ix_{names.sessions}_tenant_seq", "tenant", "seq", unique=True),
        schema=db_schema,
    )
    token_seq = Sequence(f"{names.work}_token_seq", metadata=meta, schema=db_schema)
    work = Table(
        names.work,
        meta,
        Column("id", BigInteger, Identity(always=True), nullable=False),
        Column("queue", ident(), nullable=False),
        Column("tenant", ident(), nullable=False),
        Column("item_id", ident(), nullable=False),
        Column("payload", JSON, nullable=False),
        Column("priority", SmallInteger, nullable=False, server_default=text("0")),
        Column("status", String(16), nullable=False),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("available_at", tz(), nullable=False),
        Column("last_error", Text, nullable=True),
        Column("token", BigInteger, nullable=True),
        Column("worker_id", Text, nullable=True),
        Column("expires_at", tz(), nullable=True),
        Column("created_at", tz(), nullable=False),
        Column("updated_at", tz(), nullable=False),
        Column("unique_key", ident(), nullable=True),
        Column("unique_for", Interval, nullable=True),
        Column("timeout", Double, nullable=True),
        # The slot the item holds while it blocks others of its unique key (the front's
        # unique_slot()); NULL once it leaves its blocking states.
        Column("unique_slot", ident(), nullable=True),
        # Flow control (QueueLimits): what the item spends, and how much of it.
        Column("limit_key", ident(), nullable=True),
        Column("weight", Integer, nullable=False, server_default=text("1")),
        # The error history (error_history): a JSON array of the newest entries, NULL
        # until the first failure. Only the history read selects it; no index.
        Column("error_history", JSONB, nullable=True),
        PrimaryKeyConstraint("id"),
        UniqueConstraint("queue", "tenant", "item_id"),
        CheckConstraint(check_in("status", [s.value for s in ItemStatus]), name="status"),
        CheckConstraint(f"priority BETWEEN -{MAX_PRIORITY} AND {MAX_PRIORITY}", name="priority"),
        CheckConstraint("attempts >= 0", name="attempts"),
        CheckConstraint("timeout IS NULL OR timeout > 0", name="timeout"),
        CheckConstraint("weight >= 1", name="weight"),
        CheckConstraint(
            "status <> 'leased' OR (token IS NOT NULL AND expires_at IS NOT NULL "
            "AND worker_id IS NOT NULL)",
            name="lease",
        ),
        # The tenant's earliest queued item, for adk_queue_turns.next_due_at.
        Index(
            f"ix_{names.work}_due",
            "queue",
            "tenant",
            "available_at",
            postgresql_where=text("status = 'queued'"),
        ),
        Index(
            f"ix_{names.work}_expiry",
            "queue",
            "expires_at",
            postgresql_where=text("status = 'leased'"),
        ),
        Index(
            f"ix_{names.work}_dead",
            "queue",
            "tenant",
            "updated_at",
            "item_id",
            postgresql_where=text("status = 'dead'"),
        ),
        # Unique keys, enforced by the server: one holder per slot.
        Index(
            f"ix_{names.work}_unique_slot",
            "queue",
            "tenant",
            "unique_slot",
            unique=True,
            postgresql_where=text("unique_slot IS NOT NULL"),
        ),
        # Prune walks each finished status oldest first; stats counts the exceptional
        # ones (dead, cancelled) per tenant from it without reading the heap.
        Index(
            f"ix_{names.work}_finished",
            "queue",
            "status",
            "updated_at",
            postgresql_include=["tenant"],
            postgresql_where=text(check_in("status", FINISHED)),
        ),
        # Flow control's caps count leased items from the items themselves (a claim
        # under QueueLimits reads at most ``cap`` entries): per tenant and per
        # (tenant, limit key) from the first, per limit key from the second.
        Index(
            f"ix_{names.work}_leased",
            "queue",
            "tenant",
            "limit_key",
            postgresql_where=text("status = 'leased'"),
        ),
        Index(
            f"ix_{names.work}_leased_key",
            "queue",
            "limit_key",
            postgresql_where=text("status = 'leased' AND limit_key IS NOT NULL"),
        ),
        postgresql_with=dict(WORK_TABLE_OPTIONS),
        schema=db_schema,
    )
    # The claim: a tenant's queued items, best first; due-ness is filtered.
    Index(
        f"ix_{names.work}_claim",
        work.c.queue,
        work.c.tenant,
        work.c.priority.desc(),
        work.c.id,
        postgresql_where=text("status = 'queued'"),
    )
    queue_turns = Table(
        names.queue_turns,
        meta,
        Column("queue", ident(), nullable=False),
        Column("tenant", ident(), nullable=False),
        Column("last_turn", BigInteger, nullable=False, server_default=text("0")),
        Column("queued", BigInteger, nullable=False, server_default=text("0")),
        Column("next_due_at", tz(), nullable=True),
        Column("checked_at", tz(), nullable=False),
        Column("additions", BigInteger, nullable=False, server_default=text("0")),
        PrimaryKeyConstraint("queue", "tenant"),
        CheckConstraint("queued >= 0", name="queued"),
        Index(
            f"ix_{names.queue_turns}_ready",
            "queue",
            "last_turn",
            "tenant",
            postgresql_where=text("queued > 0 AND next_due_at <= checked_at"),
        ),
        Index(
            f"ix_{names.queue_turns}_waking",
            "queue",
            "next_due_at",
            postgresql_where=text("queued > 0 AND next_due_at > checked_at"),
        ),
        postgresql_with=dict(TURNS_TABLE_OPTIONS),
        schema=db_schema,
    )
    schema = Table(
        names.schema,
        meta,
        Column("component", ident(), nullable=False),
        Column("version", Integer, nullable=False),
        Column("revision", String(64), nullable=False),
        Column("applied_at", tz(), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("component"),
        schema=db_schema,
    )
    run_writes = Table(
        names.run_writes,
        meta,
        Column("tenant", ident(), nullable=False),
        Column("run_id", ident(), nullable=False),
        Column("applied_at", tz(), nullable=False),
        Column("op_id", ident(), nullable=False),
        # A resend carries its first attempt's clock reading: the lookup and the
        # sweep (applied_at < cutoff) are both range scans of this one index.
        PrimaryKeyConstraint("tenant", "run_id", "applied_at", "op_id"),
        schema=db_schema,
    )
    # One row per queue: whether it is paused, and the pruner's lease (its try-lock).
    queue_control = Table(
        names.queue_control,
        meta,
        Column("queue", ident(), nullable=False),
        Column("paused", Boolean, nullable=False, server_default=text("false")),
        Column("pruner", Text, nullable=True),
        Column("pruner_until", tz(), nullable=True),
        # The queue's QueueLimits as JSON text (NULL: none), so every process claims
        # under the same limits.
        Column("limits", Text, nullable=True),
        # The weight claimed per rate bucket under those limits (JSON text), and when the
        # earliest item a rate held back in the last limited claim fits (next_due's hint).
        Column("rate_spent", Text, nullable=True),
        Column("rate_wake", tz(), nullable=True),
        PrimaryKeyConstraint("queue"),
        schema=db_schema,
    )
    return Tables(
        queue_control=queue_control,
        names=names,
        runs=runs,
        sessions=sessions,
        work=work,
        queue_turns=queue_turns,
        schema=schema,
        run_writes=run_writes,
        token_seq=token_seq,
    )
