"""The statements of the ADK session service on PostgreSQL, built once per table naming.

Each call is one statement (data-modifying CTEs where it writes several tables), run
in its own implicit transaction, so it is atomic without a BEGIN or COMMIT round
trip. The tables are ``schema.AdkTables``; the session's run is the state store's
``runs`` table (its naming, its schema). Every value is a bound parameter, every
time the caller's clock. Why each is shaped so: docs/agent-frameworks.md#adk-on-postgresql.

Nothing here runs a statement or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Double,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import CTE

from statepact._limits import MAX_COUNTER
from statepact.models import RunStatus
from statepact.storage.postgres.schema import AdkTables

__all__ = ["COUNTERS", "AdkStatements", "statements"]

#: The run counters an append moves, in the order a refusal names the first to overflow.
COUNTERS = ("input_tokens", "output_tokens", "iterations", "cursor")

_TZ = DateTime(timezone=True)


def p(name: str, type_: Any = None) -> Any:
    """A bound parameter; every name starts with ``p_`` so none shadows a column."""
    return bindparam(f"p_{name}", type_=type_)


def _jsonb(name: str) -> Any:
    return cast(p(name, Text()), JSONB)


def _merge(column: Any, delta: Any) -> Any:
    """``column || delta``: a scope's keys replaced one by one, never deep-merged."""
    return column.op("||", return_type=JSONB)(delta)


def _session_key(table: Any) -> list[ColumnElement[bool]]:
    return [
        table.c.app_name == p("app", Text()),
        table.c.user_id == p("user", Text()),
        table.c.session_id == p("session", Text()),
    ]


def _state_upsert(table: Table, keys: tuple[str, ...], after: CTE, delta: str) -> CTE:
    """Merge ``delta`` into a scope's row (made if missing), when ``after`` wrote a row."""
    values = [p(key, Text()) for key in keys]
    columns = [table.c[name] for name in ("app_name", "user_id")[: len(keys)]]
    fresh = select(*values, _jsonb(delta), p("now", _TZ)).where(exists(select(after)))
    upsert = pg_insert(table).from_select([*columns, table.c.state, table.c.updated_at], fresh)
    return (
        upsert.on_conflict_do_update(
            index_elements=columns,
            set_={
                "state": _merge(table.c.state, upsert.excluded.state),
                "updated_at": upsert.excluded.updated_at,
            },
        )
        .returning(table.c.state)
        .cte(f"{table.name}_merged")
    )


def _scope_state(table: Table, keys: tuple[str, ...], merged: CTE | None) -> Any:
    """A scope's state as the statement leaves it: what it merged, else what was there."""
    stored = select(table.c.state).where(
        *(
            table.c[name] == p(key, Text())
            for name, key in zip(("app_name", "user_id"), keys, strict=False)
        )
    )
    if merged is None:
        return stored.scalar_subquery()
    return func.coalesce(select(merged.c.state).scalar_subquery(), stored.scalar_subquery())


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
            state=_jsonb("state"),
            last_update_time=p("lut", Double()),
            created_at=p("now", _TZ),
            updated_at=p("now", _TZ),
        )
        .on_conflict_do_nothing(index_elements=[s.c.app_name, s.c.user_id, s.c.session_id])
        .returning(s.c.seq)
        .cte("created")
    )
    run = (
        pg_insert(runs)
        .from_select(
            [
                "tenant",
                "run_id",
                "session_id",
                "status",
                "data",
                "version",
                "created_at",
                "updated_at",
            ],
            select(
                p("app", Text()),
                p("run_id", Text()),
                p("user", Text()),
                literal(RunStatus.RUNNING.value),
                cast(p("run_data", Text()), JSON),
                literal(1, BigInteger()),
                p("now", _TZ),
                p("now", _TZ),
            ).where(exists(select(created))),
        )
        .on_conflict_do_nothing(index_elements=[runs.c.tenant, runs.c.run_id])
        .cte("run_created")
    )
    app_merged = _state_upsert(t.app_states, ("app",), created, "app_delta") if app else None
    user_merged = (
        _state_upsert(t.user_states, ("app", "user"), created, "user_delta") if user else None
    )
    ctes = [c for c in (run, app_merged, user_merged) if c is not None]
    return select(
        select(created.c.seq).scalar_subquery().label("seq"),
        _scope_state(t.app_states, ("app",), app_merged).label("app_state"),
        _scope_state(t.user_states, ("app", "user"), user_merged).label("user_state"),
    ).add_cte(*ctes)


def _lease_allows(s: Table) -> ColumnElement[bool]:
    """No live lease and none held by the call, or the call holds the live one."""
    free = or_(s.c.lease_expires_at.is_(None), s.c.lease_expires_at <= p("now", _TZ))
    return or_(
        and_(p("owner", Text()).is_(None), free),
        and_(
            s.c.lease_owner == p("owner", Text()),
            s.c.lease_token == p("token", BigInteger()),
            s.c.lease_expires_at > p("now", _TZ),
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
        .where(*_session_key(s), s.c.version == p("expected", BigInteger()), _lease_allows(s))
        .where(_no_overflow(runs))
        .values(
            version=s.c.version + 1,
            state=_merge(s.c.state, _jsonb("session_delta")),
            last_update_time=p("ts", Double()),
            first_event_ts=func.coalesce(s.c.first_event_ts, p("ts", Double())),
            updated_at=p("now", _TZ),
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
            updated_at=p("now", _TZ),
        )
        .cte("counted")
    )
    ctes: list[CTE] = [added, counted]
    if app:
        ctes.append(_state_upsert(t.app_states, ("app",), moved, "app_delta"))
    if user:
        ctes.append(_state_upsert(t.user_states, ("app", "user"), moved, "user_delta"))
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
    ).where(*_session_key(s))


def get_session(t: AdkTables, *, after: bool) -> Select[Any]:
    """The session, its scopes' state and its most recent events (``p_recent``, NULL: all)
    in one round trip, read backwards from the newest through the primary key. With
    ``after``: only the events after the newest one below ``p_after`` (within the
    recent window), found by the same backward scan, which stops there."""
    s, e = t.sessions, t.events
    wanted = _session_key(e)
    if after:
        older = e.alias("older")
        version = select(s.c.version).where(*_session_key(s)).scalar_subquery()
        window = version - func.coalesce(p("recent", BigInteger()), version)
        cut = (
            select(older.c.seq)
            .where(*_session_key(older), older.c.seq > window)
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
        _scope_state(t.app_states, ("app",), None).label("app_state"),
        _scope_state(t.user_states, ("app", "user"), None).label("user_state"),
        events.label("events"),
    ).where(*_session_key(s))


def delete_session(t: AdkTables) -> Select[Any]:
    s, e = t.sessions, t.events
    removed = delete(s).where(*_session_key(s)).returning(s.c.seq).cte("removed")
    events = delete(e).where(*_session_key(e)).cte("events_removed")
    return select(func.count()).select_from(removed).add_cte(events)


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
            _scope_state(t.app_states, ("app",), None).label("app_state"),
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
        .where(*_session_key(e), e.c.seq > p("after", BigInteger()))
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
    ).where(*_session_key(s))


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


def acquire_lease(t: AdkTables) -> Select[Any]:
    """A new token for ``p_owner`` unless another owner holds a live lease; returns the
    token (NULL: refused) and the holder as the statement found it (no row: no session)."""
    s = t.sessions
    free = or_(
        s.c.lease_expires_at.is_(None),
        s.c.lease_expires_at <= p("now", _TZ),
        s.c.lease_owner == p("owner", Text()),
    )
    granted = (
        update(s)
        .where(*_session_key(s), free)
        .values(
            lease_owner=p("owner", Text()),
            lease_token=s.c.lease_token + 1,
            lease_expires_at=p("expires", _TZ),
        )
        .returning(s.c.lease_token)
        .cte("granted")
    )
    return select(
        select(granted.c.lease_token).scalar_subquery().label("token"), s.c.lease_owner
    ).where(*_session_key(s))


def _held(s: Table) -> list[ColumnElement[bool]]:
    """The session's lease is the call's (owner and token), live or not."""
    return [
        *_session_key(s),
        s.c.lease_owner == p("owner", Text()),
        s.c.lease_token == p("token", BigInteger()),
    ]


def renew_lease(t: AdkTables) -> Any:
    s = t.sessions
    return (
        update(s)
        .where(*_held(s), s.c.lease_expires_at > p("now", _TZ))
        .values(lease_expires_at=p("expires", _TZ))
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


def prune_sessions(t: AdkTables) -> Select[Any]:
    """Delete up to ``p_limit`` sessions of the app last written before ``p_cutoff``,
    oldest first, with their events (sessions locked by another call are skipped)."""
    s, e = t.sessions, t.events
    idle = (
        select(s.c.user_id, s.c.session_id)
        .where(s.c.app_name == p("app", Text()), s.c.updated_at < p("cutoff", _TZ))
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


def present(t: AdkTables) -> Any:
    """Whether each of the four tables exists (revision ``statepact_0006``)."""
    names = (t.sessions, t.events, t.app_states, t.user_states)
    return select(
        *(
            func.to_regclass(literal(f"{n.schema}.{n.name}" if n.schema else n.name)).is_not(None)
            for n in names
        )
    )


@dataclass(frozen=True, slots=True)
class AdkStatements:
    """Every statement of the service for one naming, built once (``statements``)."""

    create: dict[tuple[bool, bool], Select[Any]]
    append: dict[tuple[bool, bool], Select[Any]]
    refusal: Select[Any]
    get: dict[bool, Select[Any]]
    delete: Select[Any]
    page: dict[bool, Select[Any]]
    user_state: Select[Any]
    events: Select[Any]
    usage: dict[bool, Select[Any]]
    acquire: Select[Any]
    renew: Any
    release: Any
    prune_sessions: Select[Any]
    prune_events: Select[Any]
    present: Any


@cache
def statements(t: AdkTables, runs: Table, run_prefix: str) -> AdkStatements:
    both = [(a, u) for a in (False, True) for u in (False, True)]
    return AdkStatements(
        create={(a, u): create_session(t, runs, app=a, user=u) for a, u in both},
        append={(a, u): append_event(t, runs, app=a, user=u) for a, u in both},
        refusal=append_refusal(t, runs),
        get={after: get_session(t, after=after) for after in (False, True)},
        delete=delete_session(t),
        page={by_user: page_sessions(t, by_user=by_user) for by_user in (False, True)},
        user_state=user_state(t),
        events=list_events(t),
        usage={by: usage(runs, by_user=by, prefix=run_prefix) for by in (False, True)},
        acquire=acquire_lease(t),
        renew=renew_lease(t),
        release=release_lease(t),
        prune_sessions=prune_sessions(t),
        prune_events=prune_events(t),
        present=present(t),
    )


def room(deltas: dict[str, int]) -> dict[str, int]:
    """``p_room_<counter>``: the highest value each counter may hold before the deltas."""
    return {f"p_room_{name}": MAX_COUNTER - deltas[name] for name in COUNTERS}
