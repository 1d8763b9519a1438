"""A session's lease: acquired (a new token), renewed, released."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Select, Table, Text, null, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from statepact.integrations.adk._postgres_sql._parts import TZ, p, session_key
from statepact.storage.postgres.schema import AdkTables

__all__ = ["acquire_lease", "release_lease", "renew_lease"]


def acquire_lease(t: AdkTables) -> Select[Any]:
    """A new token for ``p_owner`` unless another owner holds a live lease; returns the
    token (NULL: refused) and the holder as the statement found it (no row: no session)."""
    s = t.sessions
    free = or_(
        s.c.lease_expires_at.is_(None),
        s.c.lease_expires_at <= p("now", TZ),
        s.c.lease_owner == p("owner", Text()),
    )
    granted = (
        update(s)
        .where(*session_key(s), free)
        .values(
            lease_owner=p("owner", Text()),
            lease_token=s.c.lease_token + 1,
            lease_expires_at=p("expires", TZ),
        )
        .returning(s.c.lease_token)
        .cte("granted")
    )
    return select(
        select(granted.c.lease_token).scalar_subquery().label("token"), s.c.lease_owner
    ).where(*session_key(s))


def _held(s: Table) -> list[ColumnElement[bool]]:
    """The session's lease is the call's (owner and token), live or not."""
    return [
        *session_key(s),
        s.c.lease_owner == p("owner", Text()),
        s.c.lease_token == p("token", BigInteger()),
    ]


def renew_lease(t: AdkTables) -> Any:
    s = t.sessions
    return (
        update(s)
        .where(*_held(s), s.c.lease_expires_at > p("now", TZ))
        .values(lease_expires_at=p("expires", TZ))
        .returning(s.c.lease_token)
    )


def release_lease(t: AdkTables) -> Any:
    s = t.sessions
    return (
        update(s)
        .where(*_held(s))
        .values(lease_owner=null(), lease_expires_at=null())
        .returning(s.c.lease_token)
    )
