"""The service's reads: a session with its recent events, a page of sessions, a user's
state, a page of events, the usage of its runs, and whether its tables exist.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Double, Select, Table, Text, and_, cast, func, literal, select
from sqlalchemy.dialects.postgresql import aggregate_order_by

from statepact.integrations.adk._postgres_sql._parts import p, scope_state, session_key
from statepact.storage.postgres.schema import AdkTables

__all__ = ["get_session", "list_events", "page_sessions", "present", "usage", "user_state"]


def get_session(t: AdkTables, *, after: bool) -> Select[Any]:
    """The session, its scopes' state and its most recent events (``p_recent``, NULL: all)
    in one round trip, read backwards from the newest through the primary key. With
    ``after``: only the events after the newest one below ``p_after`` (within the
    recent window), found by the same backward scan, which stops there."""
    s, e = t.sessions, t.events
    wanted = session_key(e)
    if after:
        older = e.alias("older")
        version = select(s.c.version).where(*session_key(s)).scalar_subquery()
        window = version - func.coalesce(p("recent", BigInteger()), version)
        cut = (
            select(older.c.seq)
            .where(*session_key(older), older.c.seq > window)
            .where(older.c.timestamp < p("after", Double()))
            .order_by(older.c.seq.desc())
            .limit(1)
            .scalar_subquery()
        )
        wanted.append(e.c.seq > func.coalesce(cut, 0))
    recent = (
        select(e.c.seq, cast(e.c.data, Text).label("data"))
        .where(*wanted)
        .order_by(e.c.seq.desc())
        .limit(p("recent", BigInteger()))
        .subquery("recent")
    )
    events = select(
        func.array_agg(aggregate_order_by(recent.c.data, recent.c.seq))
    ).scalar_subquery()
    return select(
        s.c.seq,
        s.c.version,
        s.c.state,
        s.c.last_update_time,
        scope_state(t.app_states, ("app",), None).label("app_state"),
        scope_state(t.user_states, ("app", "user"), None).label("user_state"),
        events.label("events"),
    ).where(*session_key(s))


def page_sessions(t: AdkTables, *, by_user: bool) -> Select[Any]:
    """Up to ``p_limit`` sessions after ``p_after`` in seq order, each with its user's
    state, and the app's state (read once)."""
    s, u = t.sessions, t.user_states
    where = [s.c.app_name == p("app", Text()), s.c.seq > p("after", BigInteger())]
    if by_user:
        where.append(s.c.user_id == p("user", Text()))
    joined = s.outerjoin(u, and_(u.c.app_name == s.c.app_name, u.c.user_id == s.c.user_id))
    return (
        select(
            s.c.user_id,
            s.c.session_id,
            s.c.seq,
            s.c.version,
            s.c.state,
            s.c.last_update_time,
            u.c.state.label("user_state"),
            scope_state(t.app_states, ("app",), None).label("app_state"),
        )
        .select_from(joined)
        .where(*where)
        .order_by(s.c.seq)
        .limit(p("limit", BigInteger()))
    )


def user_state(t: AdkTables) -> Select[Any]:
    u = t.user_states
    return select(u.c.state).where(
        u.c.app_name == p("app", Text()), u.c.user_id == p("user", Text())
    )


def list_events(t: AdkTables) -> Select[Any]:
    """The session's version (no row: no session) and up to ``p_limit`` events after
    ``p_after``, as two arrays in seq order."""
    s, e = t.sessions, t.events
    page = (
        select(e.c.seq, cast(e.c.data, Text).label("data"))
        .where(*session_key(e), e.c.seq > p("after", BigInteger()))
        .order_by(e.c.seq)
        .limit(p("limit", BigInteger()))
        .subquery("page")
    )
    seqs = select(func.array_agg(aggregate_order_by(page.c.seq, page.c.seq)))
    datas = select(func.array_agg(aggregate_order_by(page.c.data, page.c.seq)))
    return select(
        s.c.version,
        seqs.scalar_subquery().label("seqs"),
        datas.scalar_subquery().label("events"),
    ).where(*session_key(s))


def usage(runs: Table, *, by_user: bool, prefix: str) -> Select[Any]:
    """The sums of the counters of the service's runs of a tenant (of one user)."""
    where = [runs.c.tenant == p("app", Text()), runs.c.run_id.startswith(prefix, autoescape=True)]
    if by_user:
        where.append(runs.c.session_id == p("user", Text()))
    total = [
        func.coalesce(func.sum(runs.c[name]), 0).label(name)
        for name in ("input_tokens", "output_tokens", "cost", "iterations", "cursor")
    ]
    return select(func.count().label("sessions"), *total).where(*where)


def present(t: AdkTables) -> Any:
    """Whether each of the four tables exists (revision ``statepact_0006``)."""
    names = (t.sessions, t.events, t.app_states, t.user_states)
    return select(
        *(
            func.to_regclass(literal(f"{n.schema}.{n.name}" if n.schema else n.name)).is_not(None)
            for n in names
        )
    )
