"""The statements of sessions: create, update, list and delete (the reads of one
session are ``_parts``' record reads)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Insert, Select, Table, Update, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete

from statepact.storage.postgres._sql import TZ, param
from statepact.storage.postgres._sql.state._parts import (
    json_param,
    meta_columns,
    record_key,
    row_columns,
)

__all__ = ["create_session", "delete_session", "list_sessions", "update_session"]


def create_session(sessions: Table) -> Insert:
    return (
        pg_insert(sessions)
        .values(
            tenant=param("tenant"),
            session_id=param("record_id"),
            data=json_param("data"),
            version=1,
            created_at=param("now", TZ),
            updated_at=param("now", TZ),
        )
        .on_conflict_do_nothing(index_elements=[sessions.c.tenant, sessions.c.session_id])
        .returning(*meta_columns(sessions))
    )


def update_session(sessions: Table) -> Update:
    return (
        update(sessions)
        .where(
            *record_key(sessions, "session_id"),
            sessions.c.version == param("expected", BigInteger()),
        )
        .values(
            data=json_param("data"), version=sessions.c.version + 1, updated_at=param("now", TZ)
        )
        .returning(*meta_columns(sessions))
    )


def list_sessions(sessions: Table) -> Select[Any]:
    return (
        select(*row_columns(sessions))
        .where(sessions.c.tenant == param("tenant"), sessions.c.seq > param("after", BigInteger()))
        .order_by(sessions.c.seq)
        .limit(param("limit", BigInteger()))
    )


def delete_session(sessions: Table) -> ReturningDelete[Any]:
    return delete(sessions).where(*record_key(sessions, "session_id")).returning(sessions.c.seq)
