"""The agent frameworks' tables: the LangGraph checkpoint saver's and the Google ADK
session service's."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    Double,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import postgresql

from statepact.storage.postgres._schema.columns import ident, tz

__all__ = ["AdkTables", "LangGraphTables", "define_adk_tables", "define_langgraph_tables"]


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


def define_langgraph_tables(meta: MetaData) -> LangGraphTables:
    checkpoints = Table(
        "statepact_lg_checkpoints",
        meta,
        Column("tenant", ident(), nullable=False),
        Column("thread_id", ident(), nullable=False),
        Column("checkpoint_ns", ident(), nullable=False),
        Column("checkpoint_id", ident(), nullable=False),
        Column("parent_checkpoint_id", ident(), nullable=True),
        Column("run_id", ident(), nullable=True),
        Column("type", Text, nullable=False),
        Column("checkpoint", LargeBinary, nullable=False),
        Column("metadata", postgresql.JSONB, nullable=False),
        # The (channel, version) pairs whose blobs hold the checkpoint's values.
        Column("channels", postgresql.ARRAY(ident()), nullable=False),
        Column("versions", postgresql.ARRAY(ident()), nullable=False),
        Column("created_at", tz(), nullable=False),
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
        Column("tenant", ident(), nullable=False),
        Column("thread_id", ident(), nullable=False),
        Column("checkpoint_ns", ident(), nullable=False),
        Column("channel", ident(), nullable=False),
        Column("version", ident(), nullable=False),
        Column("type", Text, nullable=False),
        Column("blob", LargeBinary, nullable=False),
        PrimaryKeyConstraint("tenant", "thread_id", "checkpoint_ns", "channel", "version"),
    )
    writes = Table(
        "statepact_lg_writes",
        meta,
        Column("tenant", ident(), nullable=False),
        Column("thread_id", ident(), nullable=False),
        Column("checkpoint_ns", ident(), nullable=False),
        Column("checkpoint_id", ident(), nullable=False),
        Column("task_id", ident(), nullable=False),
        Column("idx", Integer, nullable=False),
        Column("channel", ident(), nullable=False),
        Column("type", Text, nullable=False),
        Column("blob", LargeBinary, nullable=False),
        Column("task_path", ident(), nullable=False, server_default=text("''")),
        PrimaryKeyConstraint(
            "tenant", "thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"
        ),
    )
    threads = Table(
        "statepact_lg_threads",
        meta,
        Column("tenant", ident(), nullable=False),
        Column("thread_id", ident(), nullable=False),
        # The injected clock at the thread's last put: retention sweeps by it.
        Column("written_at", tz(), nullable=False),
        PrimaryKeyConstraint("tenant", "thread_id"),
        Index("ix_statepact_lg_threads_written", "tenant", "written_at"),
    )
    return LangGraphTables(checkpoints=checkpoints, blobs=blobs, writes=writes, threads=threads)


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


def define_adk_tables(meta: MetaData, db_schema: str | None) -> AdkTables:
    sessions = Table(
        "statepact_adk_sessions",
        meta,
        Column("app_name", ident(), nullable=False),
        Column("user_id", ident(), nullable=False),
        Column("session_id", ident(), nullable=False),
        Column("seq", BigInteger, Identity(always=True), nullable=False),
        # Bumped by every append: the event appended gets the new version as its seq.
        Column("version", BigInteger, nullable=False),
        Column("state", postgresql.JSONB, nullable=False),
        # ADK's Session.last_update_time: the newest event's timestamp (epoch seconds).
        Column("last_update_time", Double, nullable=False),
        # The timestamp of the oldest event kept, NULL when none: what prune_events reads.
        Column("first_event_ts", Double, nullable=True),
        Column("lease_owner", ident(), nullable=True),
        Column("lease_token", BigInteger, nullable=False, server_default=text("0")),
        Column("lease_expires_at", tz(), nullable=True),
        Column("created_at", tz(), nullable=False),
        Column("updated_at", tz(), nullable=False),
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
        Column("app_name", ident(), nullable=False),
        Column("user_id", ident(), nullable=False),
        Column("session_id", ident(), nullable=False),
        Column("seq", BigInteger, nullable=False),
        Column("event_id", ident(), nullable=False),
        Column("timestamp", Double, nullable=False),
        # The append's call id: a resend after a lost reply finds its first attempt.
        Column("op_id", ident(), nullable=False),
        # The event as ADK's model_dump_json wrote it (json keeps the text as written).
        Column("data", JSON, nullable=False),
        # A session's events in order; num_recent_events and after_timestamp read its end.
        PrimaryKeyConstraint("app_name", "user_id", "session_id", "seq"),
        schema=db_schema,
    )
    app_states = Table(
        "statepact_adk_app_states",
        meta,
        Column("app_name", ident(), nullable=False),
        Column("state", postgresql.JSONB, nullable=False),
        Column("updated_at", tz(), nullable=False),
        PrimaryKeyConstraint("app_name"),
        postgresql_with={"fillfactor": 80},
        schema=db_schema,
    )
    user_states = Table(
        "statepact_adk_user_states",
        meta,
        Column("app_name", ident(), nullable=False),
        Column("user_id", ident(), nullable=False),
        Column("state", postgresql.JSONB, nullable=False),
        Column("updated_at", tz(), nullable=False),
        PrimaryKeyConstraint("app_name", "user_id"),
        postgresql_with={"fillfactor": 80},
        schema=db_schema,
    )
    return AdkTables(
        sessions=sessions, events=events, app_states=app_states, user_states=user_states
    )
