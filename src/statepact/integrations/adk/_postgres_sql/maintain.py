"""The service's retention: idle sessions pruned, old events pruned."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Double, Select, Text, and_, delete, func, literal, select, update

from statepact._limits import MAX_COUNTER
from statepact.integrations.adk._postgres_sql._parts import TZ, p
from statepact.storage.postgres.schema import AdkTables

__all__ = ["prune_events", "prune_sessions"]


def prune_sessions(t: AdkTables) -> Select[Any]:
    """Delete up to ``p_limit`` sessions of the app last written before ``p_cutoff``,
    oldest first, with their events (sessions locked by another call are skipped)."""
    s, e = t.sessions, t.events
    idle = (
        select(s.c.user_id, s.c.session_id)
        .where(s.c.app_name == p("app", Text()), s.c.updated_at < p("cutoff", TZ))
        .order_by(s.c.updated_at, s.c.seq)
        .limit(p("limit", BigInteger()))
        .with_for_update(skip_locked=True)
        .cte("idle")
    )
    removed = (
        delete(s)
        .where(
            s.c.app_name == p("app", Text()),
            s.c.user_id == idle.c.user_id,
            s.c.session_id == idle.c.session_id,
        )
        .returning(s.c.user_id, s.c.session_id)
        .cte("removed")
    )
    events = (
        delete(e)
        .where(
            e.c.app_name == p("app", Text()),
            e.c.user_id == removed.c.user_id,
            e.c.session_id == removed.c.session_id,
        )
        .cte("events_removed")
    )
    return select(func.count()).select_from(removed).add_cte(events)


def prune_events(t: AdkTables) -> Select[Any]:
    """Delete up to ``p_limit`` events of the app, from the sessions whose oldest event is
    below ``p_cutoff``: each loses its events in seq order while their timestamp is below
    it; each session's ``first_event_ts`` moves to the event it now starts with."""
    s, e = t.sessions, t.events
    heads = (
        select(s.c.user_id, s.c.session_id, s.c.first_event_ts, s.c.seq)
        .where(s.c.app_name == p("app", Text()), s.c.first_event_ts < p("cutoff", Double()))
        .order_by(s.c.first_event_ts, s.c.seq)
        .limit(p("limit", BigInteger()))
        .with_for_update(skip_locked=True)
        .cte("heads")
    )
    same = [
        e.c.app_name == p("app", Text()),
        e.c.user_id == heads.c.user_id,
        e.c.session_id == heads.c.session_id,
    ]
    later = e.alias("later")
    keep_from = (
        select(func.min(later.c.seq)).where(
            later.c.app_name == p("app", Text()),
            later.c.user_id == heads.c.user_id,
            later.c.session_id == heads.c.session_id,
            later.c.timestamp >= p("cutoff", Double()),
        )
    ).scalar_subquery()
    doomed = (
        select(e.c.user_id, e.c.session_id, e.c.seq)
        .select_from(heads.join(e, and_(*same)))
        .where(e.c.seq < func.coalesce(keep_from, literal(MAX_COUNTER, BigInteger())))
        .order_by(heads.c.first_event_ts, heads.c.seq, e.c.seq)
        .limit(p("limit", BigInteger()))
        .cte("doomed")
    )
    removed = (
        delete(e)
        .where(
            e.c.app_name == p("app", Text()),
            e.c.user_id == doomed.c.user_id,
            e.c.session_id == doomed.c.session_id,
            e.c.seq == doomed.c.seq,
        )
        .returning(e.c.user_id, e.c.session_id, e.c.seq)
        .cte("events_removed")
    )
    last = (
        select(removed.c.user_id, removed.c.session_id, func.max(removed.c.seq).label("seq"))
        .group_by(removed.c.user_id, removed.c.session_id)
        .cte("last_removed")
    )
    next_head = (
        select(e.c.timestamp)
        .where(
            e.c.app_name == p("app", Text()),
            e.c.user_id == last.c.user_id,
            e.c.session_id == last.c.session_id,
            e.c.seq > last.c.seq,
        )
        .order_by(e.c.seq)
        .limit(1)
        .scalar_subquery()
    )
    moved = (
        update(s)
        .where(
            s.c.app_name == p("app", Text()),
            s.c.user_id == last.c.user_id,
            s.c.session_id == last.c.session_id,
        )
        .values(first_event_ts=next_head)
        .cte("heads_moved")
    )
    return select(func.count()).select_from(removed).add_cte(moved)
