"""Every PostgreSQL table statepact reads, as SQLAlchemy Core, in ONE ``MetaData``.

The single source of the schema: the Alembic revisions in the top-level
``alembic/`` are generated from :data:`metadata`, :data:`EXPECTED_SCHEMA` is
derived from it (so a deployment can own the migration), and the statements of
``_sql/`` are built on its ``Table`` objects (``adk_*`` names can be changed
with :class:`StateTables`). What each table holds and why:
docs/backings.md#tables.

It must never create, alter or drop anything itself: the kit reads and
refuses, migrations write.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    Interval,
    LargeBinary,
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
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateSequence, CreateTable

from statepact._limits import MAX_PRIORITY
from statepact.models import ItemStatus, RunStatus

__all__ = [
    "ADK_TABLES",
    "COMPATIBLE_SCHEMA_VERSIONS",
    "EXPECTED_SCHEMA",
    "NAMING_CONVENTION",
    "SCHEMA_COMPONENT",
    "SCHEMA_VERSION",
    "WRITE_RETENTION",
    "AdkTables",
    "ColumnShape",
    "IndexShape",
    "LangGraphTables",
    "SchemaShape",
    "StateTables",
    "TableShape",
    "Tables",
    "adk_tables_for",
    "langgraph_tables",
    "metadata",
    "tables_for",
    "worker_table_for",
]

#: The version the head revision writes into ``adk_schema``; bump it in a new revision.
SCHEMA_VERSION = 3
#: Versions this release reads; ``verify()`` refuses anything else.
COMPATIBLE_SCHEMA_VERSIONS: frozenset[int] = frozenset({SCHEMA_VERSION})
#: The ``adk_schema.component`` of statepact's row.
SCHEMA_COMPONENT = "statepact"

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Lower case only: an unquoted name in a deployment's own DDL is folded to lower
# case, and a quoted mixed-case name would not be the same relation.
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

# Storage options kept in the migration too; see the module docstring.
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

#: How long a run write's row in ``adk_run_writes`` is kept (by the injected
#: clock of the writes that sweep it): far above any failover budget, so a
#: resend always finds the row of its first attempt. Writers' clocks must agree
#: to well within this.
WRITE_RETENTION = timedelta(minutes=10)


#: The statuses of a finished item (prune's, and the finished index's predicate).
_FINISHED = ["done", "dead", "cancelled"]


def _ident() -> Text:
    return Text(collation="C")


def _tz() -> DateTime:
    return DateTime(timezone=True)


def _in(column: str, values: list[str]) -> str:
    listed = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({listed})"


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
            if not isinstance(value, str) or not _IDENTIFIER.match(value):
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


def _define_state_tables(meta: MetaData, names: StateTables, db_schema: str | None) -> Tables:
    runs = Table(
        names.runs,
        meta,
        Column("tenant", _ident(), nullable=False),
        Column("run_id", _ident(), nullable=False),
        Column("seq", BigInteger, Identity(always=True), nullable=False),
        Column("session_id", _ident(), nullable=True),
        Column("status", String(16), nullable=False),
        Column("data", JSON, nullable=False),
        Column("version", BigInteger, nullable=False),
        Column("input_tokens", BigInteger, nullable=False, server_default=text("0")),
        Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
        Column("cost", Numeric(38, 9), nullable=False, server_default=text("0")),
        Column("iterations", BigInteger, nullable=False, server_default=text("0")),
        Column("cursor", BigInteger, nullable=False, server_default=text("0")),
        Column("created_at", _tz(), nullable=False),
        Column("updated_at", _tz(), nullable=False),
        PrimaryKeyConstraint("tenant", "run_id"),
        CheckConstraint(_in("status", [s.value for s in RunStatus]), name="status"),
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
        Column("tenant", _ident(), nullable=False),
        Column("session_id", _ident(), nullable=False),
        Column("seq", BigInteger, Identity(always=True), nullable=False),
        Column("data", JSON, nullable=False),
        Column("version", BigInteger, nullable=False),
        Column("created_at", _tz(), nullable=False),
        Column("updated_at", _tz(), nullable=False),
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
        Column("queue", _ident(), nullable=False),
        Column("tenant", _ident(), nullable=False),
        Column("item_id", _ident(), nullable=False),
        Column("payload", JSON, nullable=False),
        Column("priority", SmallInteger, nullable=False, server_default=text("0")),
        Column("status", String(16), nullable=False),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("available_at", _tz(), nullable=False),
        Column("last_error", Text, nullable=True),
        Column("token", BigInteger, nullable=True),
        Column("worker_id", Text, nullable=True),
        Column("expires_at", _tz(), nullable=True),
        Column("created_at", _tz(), nullable=False),
        Column("updated_at", _tz(), nullable=False),
        Column("unique_key", _ident(), nullable=True),
        Column("unique_for", Interval, nullable=True),
        Column("timeout", Double, nullable=True),
        # The slot the item holds while it blocks others of its unique key (the front's
        # unique_slot()); NULL once it leaves its blocking states.
        Column("unique_slot", _ident(), nullable=True),
        # Flow control (QueueLimits): what the item spends, and how much of it.
        Column("limit_key", _ident(), nullable=True),
        Column("weight", Integer, nullable=False, server_default=text("1")),
        PrimaryKeyConstraint("id"),
        UniqueConstraint("queue", "tenant", "item_id"),
        CheckConstraint(_in("status", [s.value for s in ItemStatus]), name="status"),
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
            postgresql_where=text(_in("status", _FINISHED)),
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
        Column("queue", _ident(), nullable=False),
        Column("tenant", _ident(), nullable=False),
        Column("last_turn", BigInteger, nullable=False, server_default=text("0")),
        Column("queued", BigInteger, nullable=False, server_default=text("0")),
        Column("next_due_at", _tz(), nullable=True),
        Column("checked_at", _tz(), nullable=False),
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
        Column("component", _ident(), nullable=False),
        Column("version", Integer, nullable=False),
        Column("revision", String(64), nullable=False),
        Column("applied_at", _tz(), nullable=False, server_default=text("now()")),
        PrimaryKeyConstraint("component"),
        schema=db_schema,
    )
    run_writes = Table(
        names.run_writes,
        meta,
        Column("tenant", _ident(), nullable=False),
        Column("run_id", _ident(), nullable=False),
        Column("applied_at", _tz(), nullable=False),
        Column("op_id", _ident(), nullable=False),
        # A resend carries its first attempt's clock reading: the lookup and the
        # sweep (applied_at < cutoff) are both range scans of this one index.
        PrimaryKeyConstraint("tenant", "run_id", "applied_at", "op_id"),
        schema=db_schema,
    )
    # One row per queue: whether it is paused, and the pruner's lease (its try-lock).
    queue_control = Table(
        names.queue_control,
        meta,
        Column("queue", _ident(), nullable=False),
        Column("paused", Boolean, nullable=False, server_default=text("false")),
        Column("pruner", Text, nullable=True),
        Column("pruner_until", _tz(), nullable=True),
        # The queue's QueueLimits as JSON text (NULL: none), so every process claims
        # under the same limits.
        Column("limits", Text, nullable=True),
        # The weight claimed per rate bucket under those limits (JSON text), and when the
        # earliest item a rate held back in the last limited claim fits (next_due's hint).
        Column("rate_spent", Text, nullable=True),
        Column("rate_wake", _tz(), nullable=True),
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


def _define_backend_tables(meta: MetaData) -> None:
    Table(
        "statepact_meta",
        meta,
        Column("id", SmallInteger, nullable=False, autoincrement=False),
        Column("seq", BigInteger, nullable=False, server_default=text("0")),
        PrimaryKeyConstraint("id"),
        CheckConstraint("id = 1", name="single_row"),
        CheckConstraint("seq >= 0", name="seq"),
    )
    Table(
        "statepact_resources",
        meta,
        Column("name", _ident(), nullable=False),
        Column("metadata", JSON, nullable=False, server_default=text("'{}'::json")),
        Column("registered_at", _tz(), nullable=True),
        PrimaryKeyConstraint("name"),
    )
    Table(
        "statepact_values",
        meta,
        Column("resource", _ident(), nullable=False),
        Column("key", _ident(), nullable=False),
        Column("version", BigInteger, nullable=False, server_default=text("0")),
        Column("data", JSON, nullable=True),
        Column("committed_at", _tz(), nullable=True),
        # The transaction (pg_current_xact_id) that wrote the version (revision 0004): a
        # commit conflicts when its snapshot does not see it. NULL: written before 0004.
        Column("writer_xid", BigInteger, nullable=True),
        PrimaryKeyConstraint("resource", "key"),
        CheckConstraint("version >= 0", name="version"),
        Index("ix_statepact_values_resource_version", "resource", "version"),
        postgresql_with={"fillfactor": 90},
    )
    Table(
        "statepact_history",
        meta,
        Column("resource", _ident(), nullable=False),
        Column("key", _ident(), nullable=False),
        Column("version", BigInteger, nullable=False),
        Column("data", JSON, nullable=True),
        Column("committed_at", _tz(), nullable=False),
        # The transaction that wrote the version (revision 0002): a commit sent
        # again after a lost reply recognises its own first attempt.
        Column("txn_id", _ident(), nullable=True),
        # The PostgreSQL transaction that wrote the version (revision 0004): a snapshot
        # read takes the newest version whose writer the snapshot sees.
        Column("writer_xid", BigInteger, nullable=True),
        # Newest first and "newest visible in a snapshot" are backward scans of the key.
        PrimaryKeyConstraint("resource", "key", "version"),
        CheckConstraint("version > 0", name="version"),
    )
    Table(
        "statepact_idempotency",
        meta,
        Column("key", _ident(), nullable=False),
        Column("fingerprint", String(64), nullable=False),
        Column("version", BigInteger, nullable=False),
        Column("committed_at", _tz(), nullable=False),
        Column("txn_id", _ident(), nullable=True),
        PrimaryKeyConstraint("key"),
    )
    Table(
        "statepact_locks",
        meta,
        Column("resource", _ident(), nullable=False),
        Column("key", _ident(), nullable=False),
        Column("txn_id", _ident(), nullable=False),
        Column("mode", String(9), nullable=False),
        Column("acquired_at", _tz(), nullable=False),
        Column("expires_at", _tz(), nullable=True),
        PrimaryKeyConstraint("resource", "key", "txn_id"),
        CheckConstraint("mode IN ('shared', 'exclusive')", name="mode"),
        # end(txn_id) drops every lock of the transaction.
        Index("ix_statepact_locks_txn_id", "txn_id"),
    )
    Table(
        "statepact_leases",
        meta,
        Column("resource", _ident(), nullable=False),
        Column("owner", _ident(), nullable=True),
        # The highest token ever issued; release and expiry keep it.
        Column("token", BigInteger, nullable=False, server_default=text("0")),
        Column("expires_at", _tz(), nullable=True),
        Column("ttl", Double, nullable=True),
        Column("updated_at", _tz(), nullable=True),
        PrimaryKeyConstraint("resource"),
        CheckConstraint("token >= 0", name="token"),
    )


@dataclass(frozen=True, slots=True)
class LangGraphTables:
    """The tables of ``statepact.integrations.langgraph`` (revision ``statepact_0007``).

    Read and written by ``StatepactCheckpointSaver`` alone, under fixed names in
    the default schema; ``SCHEMA_VERSION`` does not cover them (the saver's
    ``open()`` checks they exist). Why each index is there:
    docs/agent-frameworks.md#langgraph-on-postgresql.
    """

    checkpoints: Table
    blobs: Table
    writes: Table
    threads: Table


def _define_langgraph_tables(meta: MetaData) -> LangGraphTables:
    checkpoints = Table(
        "statepact_lg_checkpoints",
        meta,
        Column("tenant", _ident(), nullable=False),
        Column("thread_id", _ident(), nullable=False),
        Column("checkpoint_ns", _ident(), nullable=False),
        Column("checkpoint_id", _ident(), nullable=False),
        Column("parent_checkpoint_id", _ident(), nullable=True),
        Column("run_id", _ident(), nullable=True),
        Column("type", Text, nullable=False),
        Column("checkpoint", LargeBinary, nullable=False),
        Column("metadata", postgresql.JSONB, nullable=False),
        # The (channel, version) pairs whose blobs hold the checkpoint's values.
        Column("channels", postgresql.ARRAY(_ident()), nullable=False),
        Column("versions", postgresql.ARRAY(_ident()), nullable=False),
        Column("created_at", _tz(), nullable=False),
        PrimaryKeyConstraint("tenant", "thread_id", "checkpoint_ns", "checkpoint_id"),
        Index(
            "ix_statepact_lg_checkpoints_run",
            "tenant",
            "run_id",
            postgresql_where=text("run_id IS NOT NULL"),
        ),
    )
    # alist's metadata filter (``metadata @> :filter``), any key, any JSON value.
    Index(
        "ix_statepact_lg_checkpoints_metadata",
        checkpoints.c.metadata,
        postgresql_using="gin",
        postgresql_ops={"metadata": "jsonb_path_ops"},
    )
    blobs = Table(
        "statepact_lg_blobs",
        meta,
        Column("tenant", _ident(), nullable=False),
        Column("thread_id", _ident(), nullable=False),
        Column("checkpoint_ns", _ident(), nullable=False),
        Column("channel", _ident(), nullable=False),
        Column("version", _ident(), nullable=False),
        Column("type", Text, nullable=False),
        Column("blob", LargeBinary, nullable=False),
        PrimaryKeyConstraint("tenant", "thread_id", "checkpoint_ns", "channel", "version"),
    )
    writes = Table(
        "statepact_lg_writes",
        meta,
        Column("tenant", _ident(), nullable=False),
        Column("thread_id", _ident(), nullable=False),
        Column("checkpoint_ns", _ident(), nullable=False),
        Column("checkpoint_id", _ident(), nullable=False),
        Column("task_id", _ident(), nullable=False),
        Column("idx", Integer, nullable=False),
        Column("channel", _ident(), nullable=False),
        Column("type", Text, nullable=False),
        Column("blob", LargeBinary, nullable=False),
        Column("task_path", _ident(), nullable=False, server_default=text("''")),
        PrimaryKeyConstraint(
            "tenant", "thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"
        ),
    )
    threads = Table(
        "statepact_lg_threads",
        meta,
        Column("tenant", _ident(), nullable=False),
        Column("thread_id", _ident(), nullable=False),
        # The injected clock at the thread's last put: retention sweeps by it.
        Column("written_at", _tz(), nullable=False),
        PrimaryKeyConstraint("tenant", "thread_id"),
        Index("ix_statepact_lg_threads_written", "tenant", "written_at"),
    )
    return LangGraphTables(checkpoints=checkpoints, blobs=blobs, writes=writes, threads=threads)


#: The one ``MetaData``: every table statepact reads, under the default names.
metadata = MetaData(naming_convention=NAMING_CONVENTION)
_DEFAULT = _define_state_tables(metadata, StateTables(), None)
_define_backend_tables(metadata)
#: The tables of the LangGraph checkpoint saver (``statepact.integrations.langgraph``).
langgraph_tables = _define_langgraph_tables(metadata)


@dataclass(frozen=True, slots=True)
class AdkTables:
    """The tables of the Google ADK session service (``statepact.integrations.adk``),
    created by revision ``statepact_0006``; docs/agent-frameworks.md#adk-tables.

    A state column holds a JSON object whose values are the JSON text of each state
    value (a ``jsonb`` of strings): ``||`` merges a delta key by key on the server,
    and every value reads back exactly as it was written.
    """

    sessions: Table
    events: Table
    app_states: Table
    user_states: Table


def _define_adk_tables(meta: MetaData, db_schema: str | None) -> AdkTables:
    sessions = Table(
        "statepact_adk_sessions",
        meta,
        Column("app_name", _ident(), nullable=False),
        Column("user_id", _ident(), nullable=False),
        Column("session_id", _ident(), nullable=False),
        Column("seq", BigInteger, Identity(always=True), nullable=False),
        # Bumped by every append: the event appended gets the new version as its seq.
        Column("version", BigInteger, nullable=False),
        Column("state", postgresql.JSONB, nullable=False),
        # ADK's Session.last_update_time: the newest event's timestamp (epoch seconds).
        Column("last_update_time", Double, nullable=False),
        # The timestamp of the oldest event kept, NULL when none: what prune_events reads.
        Column("first_event_ts", Double, nullable=True),
        Column("lease_owner", _ident(), nullable=True),
        Column("lease_token", BigInteger, nullable=False, server_default=text("0")),
        Column("lease_expires_at", _tz(), nullable=True),
        Column("created_at", _tz(), nullable=False),
        Column("updated_at", _tz(), nullable=False),
        PrimaryKeyConstraint("app_name", "user_id", "session_id"),
        CheckConstraint("version > 0", name="version"),
        Index("ix_statepact_adk_sessions_app_seq", "app_name", "seq", unique=True),
        Index("ix_statepact_adk_sessions_user_seq", "app_name", "user_id", "seq"),
        Index(
            "ix_statepact_adk_sessions_first_event",
            "app_name",
            "first_event_ts",
            postgresql_where=text("first_event_ts IS NOT NULL"),
        ),
        # An append rewrites no indexed column (first_event_ts only at the first event):
        # room on the page keeps it a HOT update.
        postgresql_with={"fillfactor": 80},
        schema=db_schema,
    )
    events = Table(
        "statepact_adk_events",
        meta,
        Column("app_name", _ident(), nullable=False),
        Column("user_id", _ident(), nullable=False),
        Column("session_id", _ident(), nullable=False),
        Column("seq", BigInteger, nullable=False),
        Column("event_id", _ident(), nullable=False),
        Column("timestamp", Double, nullable=False),
        # The append's call id: a resend after a lost reply finds its first attempt.
        Column("op_id", _ident(), nullable=False),
        # The event as ADK's model_dump_json wrote it (json keeps the text as written).
        Column("data", JSON, nullable=False),
        # A session's events in order; num_recent_events and after_timestamp read its end.
        PrimaryKeyConstraint("app_name", "user_id", "session_id", "seq"),
        schema=db_schema,
    )
    app_states = Table(
        "statepact_adk_app_states",
        meta,
        Column("app_name", _ident(), nullable=False),
        Column("state", postgresql.JSONB, nullable=False),
        Column("updated_at", _tz(), nullable=False),
        PrimaryKeyConstraint("app_name"),
        postgresql_with={"fillfactor": 80},
        schema=db_schema,
    )
    user_states = Table(
        "statepact_adk_user_states",
        meta,
        Column("app_name", _ident(), nullable=False),
        Column("user_id", _ident(), nullable=False),
        Column("state", postgresql.JSONB, nullable=False),
        Column("updated_at", _tz(), nullable=False),
        PrimaryKeyConstraint("app_name", "user_id"),
        postgresql_with={"fillfactor": 80},
        schema=db_schema,
    )
    return AdkTables(
        sessions=sessions, events=events, app_states=app_states, user_states=user_states
    )


#: The ADK session service's tables under the default schema, in :data:`metadata`.
ADK_TABLES = _define_adk_tables(metadata, None)


@lru_cache(maxsize=8)
def adk_tables_for(db_schema: str | None = None) -> AdkTables:
    """The ADK session service's tables in schema ``db_schema`` (default: the search_path)."""
    if db_schema is None:
        return ADK_TABLES
    return _define_adk_tables(MetaData(naming_convention=NAMING_CONVENTION), db_schema)


@lru_cache(maxsize=32)
def tables_for(names: StateTables | None = None, db_schema: str | None = None) -> Tables:
    """The ``Table`` objects for ``names`` in schema ``db_schema`` (default: the search_path).

    The default naming returns the tables of :data:`metadata`; any other gets
    its own ``MetaData`` with the same definitions, so statements and DDL name
    the deployment's relations.
    """
    names = names or StateTables()
    if names == StateTables() and db_schema is None:
        return _DEFAULT
    return _define_state_tables(MetaData(naming_convention=NAMING_CONVENTION), names, db_schema)


def _define_worker_table(meta: MetaData, db_schema: str | None) -> Table:
    """Live workers for the dashboard (``statepact.dashboard.workers``, ``statepact_0010``).

    One row per worker, rewritten by its beat; a row whose ``last_seen`` is older
    than its ``ttl_seconds`` is a worker that went away. Only the registry reads it.
    """
    return Table(
        "statepact_workers",
        meta,
        Column("worker_id", _ident(), nullable=False),
        Column("host", Text, nullable=False),
        Column("queues", postgresql.JSONB, nullable=False),
        Column("concurrency", Integer, nullable=False),
        Column("in_flight", Integer, nullable=False),
        Column("failures", BigInteger, nullable=False),
        Column("last_error", Text, nullable=True),
        Column("ttl_seconds", Double, nullable=False),
        Column("started_at", _tz(), nullable=False),
        Column("last_seen", _tz(), nullable=False),
        PrimaryKeyConstraint("worker_id"),
        # The live listing and the sweep of the gone both read by last_seen.
        Index("ix_statepact_workers_last_seen", "last_seen"),
        schema=db_schema,
    )


#: The worker registry's table under the default schema, in :data:`metadata`.
WORKER_TABLE = _define_worker_table(metadata, None)


@lru_cache(maxsize=8)
def worker_table_for(db_schema: str | None = None) -> Table:
    """The worker registry's table in schema ``db_schema`` (default: the search_path)."""
    if db_schema is None:
        return WORKER_TABLE
    return _define_worker_table(MetaData(naming_convention=NAMING_CONVENTION), db_schema)


# -- EXPECTED_SCHEMA -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnShape:
    name: str
    type: str
    nullable: bool
    default: str | None = None


@dataclass(frozen=True, slots=True)
class IndexShape:
    name: str
    columns: tuple[str, ...]
    unique: bool = False
    where: str | None = None


@dataclass(frozen=True, slots=True)
class TableShape:
    name: str
    columns: tuple[ColumnShape, ...]
    primary_key: tuple[str, ...]
    indexes: tuple[IndexShape, ...]
    checks: tuple[str, ...]
    options: Mapping[str, str] = field(default_factory=dict)

    def column(self, name: str) -> ColumnShape:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class SchemaShape:
    """The shape the adapters read: what a deployment's own migration must create.

    ``version`` is what ``adk_schema`` must hold; :meth:`ddl` is the PostgreSQL
    DDL of the whole shape (tables, indexes, sequences, storage options).
    """

    version: int
    tables: Mapping[str, TableShape]
    sequences: tuple[str, ...]

    def __getitem__(self, table: str) -> TableShape:
        return self.tables[table]

    def __iter__(self) -> Any:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)

    def ddl(self) -> str:
        return render_ddl(metadata)


_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def _expr(clause: Any) -> str:
    if isinstance(clause, Column):
        return clause.name
    return str(
        clause.compile(
            dialect=_DIALECT, compile_kwargs={"literal_binds": True, "include_table": False}
        )
    )


def _shape_of(table: Table) -> TableShape:
    columns = tuple(
        ColumnShape(
            name=column.name,
            type=str(column.type.compile(dialect=_DIALECT)),
            nullable=bool(column.nullable),
            default=(
                "identity"
                if column.identity is not None
                else None
                if column.server_default is None
                else _expr(column.server_default.arg)  # type: ignore[attr-defined]
            ),
        )
        for column in table.columns
    )
    indexes = tuple(
        sorted(
            (
                IndexShape(
                    name=str(index.name),
                    columns=tuple(_expr(expr) for expr in index.expressions),
                    unique=bool(index.unique),
                    where=(
                        None
                        if index.dialect_options["postgresql"]["where"] is None
                        else _expr(index.dialect_options["postgresql"]["where"])
                    ),
                )
                for index in table.indexes
            ),
            key=lambda shape: shape.name,
        )
    )
    uniques = tuple(
        IndexShape(
            name=str(constraint.name),
            columns=tuple(column.name for column in constraint.columns),
            unique=True,
        )
        for constraint in table.constraints
        if isinstance(constraint, UniqueConstraint)
    )
    checks = tuple(
        sorted(
            _expr(constraint.sqltext)
            for constraint in table.constraints
            if isinstance(constraint, CheckConstraint)
        )
    )
    options = {
        key: str(value)
        for key, value in (table.dialect_options["postgresql"]["with"] or {}).items()
    }
    return TableShape(
        name=table.name,
        columns=columns,
        primary_key=tuple(column.name for column in table.primary_key.columns),
        indexes=uniques + indexes,
        checks=checks,
        options=options,
    )


def render_ddl(meta: MetaData) -> str:
    """The PostgreSQL DDL of every sequence, table and index in ``meta``."""
    statements: list[str] = [
        str(CreateSequence(sequence).compile(dialect=_DIALECT))
        for sequence in meta._sequences.values()
    ]
    for table in meta.sorted_tables:
        statements.append(str(CreateTable(table).compile(dialect=_DIALECT)).strip())
        statements.extend(
            str(CreateIndex(index).compile(dialect=_DIALECT))
            for index in sorted(table.indexes, key=lambda index: str(index.name))
        )
    return ";\n\n".join(statements) + ";\n"


def _derive(meta: MetaData) -> SchemaShape:
    return SchemaShape(
        version=SCHEMA_VERSION,
        tables={table.name: _shape_of(table) for table in meta.sorted_tables},
        sequences=tuple(sorted(sequence.name for sequence in meta._sequences.values())),
    )


#: The shape of every table under the default names, derived from :data:`metadata`.
EXPECTED_SCHEMA: SchemaShape = _derive(metadata)
