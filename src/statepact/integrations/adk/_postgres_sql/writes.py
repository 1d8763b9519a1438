"""The service's writes: a session created (with its scopes' state and its run), an
event appended (and why an append wrote nothing), a session deleted.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Double,
    Select,
    Table,
    Text,
    and_,
    cast,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact.integrations.adk._postgres_sql._parts import (
    COUNTERS,
    TZ,
    jsonb,
    merge,
    p,
    scope_state,
    session_key,
    state_upsert,
)
from statepact.models import RunStatus
from statepact.storage.postgres.schema import AdkTables, insert_new_run

__all__ = ["append_event", "append_refusal", "create_session", "delete_session"]


def create_session(t: AdkTables, runs: Table, *, app: bool, user: bool) -> Select[Any]:
    """The session (unless it exists), the scopes' state, and its run unless one exists;
    returns the new session's seq (NULL: it existed, nothing written) and the app and
    user state after the statement."""
    s = t.sessions
    created = (
        pg_insert(s)
        .values(
            app_name=p("app", Text()),
            user_id=p("user", Text()),
            session_id=p("session", Text()),
            version=1,
            state=jsonb("state"),
            last_update_time=p("lut", Double()),
            created_at=p("now", TZ),
            updated_at=p("now", TZ),
        )
        .on_conflict_do_nothing(index_elements=[s.c.app_name, s.c.user_id, s.c.session_id])
        .returning(s.c.seq)
        .cte("created")
    )
    run = insert_new_run(
        runs,
        tenant=p("app", Text()),
        run_id=p("run_id", Text()),
        session_id=p("user", Text()),
        status=literal(RunStatus.RUNNING.value),
        data=cast(p("run_data", Text()), JSON),
        now=p("now", TZ),
        where=[exists(select(created))],
    ).cte("run_created")
    app_merged = state_upsert(t.app_states, ("app",), created, "app_delta") if app else None
    user_merged = (
        state_upsert(t.user_states, ("app", "user"), created, "user_delta") if user else None
    )
    ctes = [c for c in (run, app_merged, user_merged) if c is not None]
    return select(
        select(created.c.seq).scalar_subquery().label("seq"),
        scope_state(t.app_states, ("app",), app_merged).label("app_state"),
        scope_state(t.user_states, ("app", "user"), user_merged).label("user_state"),
    ).add_cte(*ctes)


def _lease_allows(s: Table) -> ColumnElement[bool]:
    """No live lease and none held by the call, or the call holds the live one."""
    free = or_(s.c.lease_expires_at.is_(None), s.c.lease_expires_at <= p("now", TZ))
    return or_(
        and_(p("owner", Text()).is_(None), free),
        and_(
            s.c.lease_owner == p("owner", Text()),
            s.c.lease_token == p("token", BigInteger()),
            s.c.lease_expires_at > p("now", TZ),
        ),
    )


def _no_overflow(runs: Table) -> ColumnElement[bool]:
    """The run (if any) can take the deltas: each counter at most ``MAX_COUNTER - delta``."""
    full = or_(*(runs.c[name] > p(f"room_{name}", BigInteger()) for name in COUNTERS))
    return ~exists(
        select(runs.c.run_id).where(
            runs.c.tenant == p("app", Text()), runs.c.run_id == p("run_id", Text()), full
        )
    )


def append_event(t: AdkTables, runs: Table, *, app: bool, user: bool) -> Select[Any]:
    """The event, the three scopes' deltas and the run's counters, if the session is at
    the version held (and the call may write under its lease); returns the new version
    (NULL: nothing written, :func:`append_refusal` says why)."""
    s, e = t.sessions, t.events
    moved = (
        update(s)
        .where(*session_key(s), s.c.version == p("expected", BigInteger()), _lease_allows(s))
        .where(_no_overflow(runs))
        .values(
            version=s.c.version + 1,
            state=merge(s.c.state, jsonb("session_delta")),
            last_update_time=p("ts", Double()),
            first_event_ts=func.coalesce(s.c.first_event_ts, p("ts", Double())),
            updated_at=p("now", TZ),
        )
        .returning(s.c.version)
        .cte("moved")
    )
    added = (
        insert(e)
        .from_select(
            ["app_name", "user_id", "session_id", "seq", "event_id", "timestamp", "op_id", "data"],
            select(
                p("app", Text()),
                p("user", Text()),
                p("session", Text()),
                moved.c.version,
                p("event_id", Text()),
                p("ts", Double()),
                p("op", Text()),
                cast(p("data", Text()), JSON),
            ),
        )
        .cte("added")
    )
    counted = (
        update(runs)
        .where(
            runs.c.tenant == p("app", Text()),
            runs.c.run_id == p("run_id", Text()),
            exists(select(moved)),
        )
        .values(
            input_tokens=runs.c.input_tokens + p("input_tokens", BigInteger()),
            output_tokens=runs.c.output_tokens + p("output_tokens", BigInteger()),
            iterations=runs.c.iterations + p("iterations", BigInteger()),
            cursor=runs.c.cursor + 1,
            version=runs.c.version + 1,
            updated_at=p("now", TZ),
        )
        .cte("counted")
    )
    ctes: list[CTE] = [added, counted]
    if app:
        ctes.append(state_upsert(t.app_states, ("app",), moved, "app_delta"))
    if user:
        ctes.append(state_upsert(t.user_states, ("app", "user"), moved, "user_delta"))
    return select(select(moved.c.version).scalar_subquery().label("version")).add_cte(*ctes)


def append_refusal(t: AdkTables, runs: Table) -> Select[Any]:
    """Why an append wrote nothing, read afresh: the session (no row: it does not exist),
    its lease, whether this very call was applied already (a resend: the seq its event
    got), and the run's counters."""
    s, e = t.sessions, t.events
    replayed = (
        select(e.c.seq)
        .where(
            e.c.app_name == s.c.app_name,
            e.c.user_id == s.c.user_id,
            e.c.session_id == s.c.session_id,
            e.c.seq > p("expected", BigInteger()),
            e.c.op_id == p("op", Text()),
        )
        .limit(1)
        .scalar_subquery()
    )
    counters = [
        select(runs.c[name])
        .where(runs.c.tenant == p("app", Text()), runs.c.run_id == p("run_id", Text()))
        .scalar_subquery()
        .label(name)
        for name in COUNTERS
    ]
    return select(
        s.c.version,
        s.c.lease_owner,
        s.c.lease_token,
        s.c.lease_expires_at,
        replayed.label("replayed"),
        *counters,
    ).where(*session_key(s))


def delete_session(t: AdkTables) -> Select[Any]:
    s, e = t.sessions, t.events
    removed = delete(s).where(*session_key(s)).returning(s.c.seq).cte("removed")
    events = delete(e).where(*session_key(e)).cte("events_removed")
    return select(func.count()).select_from(removed).add_cte(events)
