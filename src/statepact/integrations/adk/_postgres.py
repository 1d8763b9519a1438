"""ADK sessions on PostgreSQL: one statement of ``_postgres_sql`` per call.

The tables are revision ``statepact_0006``'s (``schema.AdkTables``, in the backing's
``db_schema``); the run of a session is a row of the state store's ``runs`` table.
Each call runs through ``EngineExecutor``, the stores' own boundary (an AUTOCOMMIT
connection, the failover of the backing's settings, its error translation): a
statement is its own transaction. An append that wrote nothing is explained by a
second, fresh read; an append sent again after a lost reply finds its own event
by its call id. Round trips and plans: docs/agent-frameworks.md#adk-on-postgresql.

This module must never create or alter a table and never read a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from statepact._codec import decimal_to_nanos, encode_json
from statepact._limits import MAX_COUNTER
from statepact.errors import SchemaVersionError
from statepact.integrations.adk._postgres_sql import COUNTERS, AdkStatements, room, statements
from statepact.integrations.adk._store import (
    RUN_PREFIX,
    Appended,
    CounterOverflow,
    CreatedSession,
    Encoded,
    EventsQuery,
    LeaseHeld,
    LeaseLost,
    LeaseRequest,
    NewEvent,
    NewSession,
    SessionKey,
    SessionsQuery,
    Stale,
    StoredSession,
    UsageTotals,
    unavailable,
)
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import EngineExecutor
from statepact.storage.postgres.schema import Tables, adk_tables_for

__all__ = ["PostgresSessions"]


def _object(values: Mapping[str, str]) -> str:
    """A scope's encoded values as the JSON object text a ``jsonb`` parameter takes."""
    return encode_json("state", values).decode("utf-8")


def _key(key: SessionKey) -> dict[str, str]:
    return {"p_app": key.app, "p_user": key.user, "p_session": key.session}


class _Runner(Protocol):
    """What ``EngineExecutor`` hands a call: something to run statements on."""

    async def execute(self, statement: Any, parameters: Any = None) -> Any: ...


class PostgresSessions:
    """The ADK sessions of one PostgreSQL backing (its engine, settings and run table)."""

    def __init__(self, engine: AsyncEngine, settings: PostgresStoreSettings, runs: Tables) -> None:
        self._tables = adk_tables_for(settings.db_schema)
        self._sql: AdkStatements = statements(self._tables, runs.runs, RUN_PREFIX)
        self._executor = EngineExecutor(
            engine,
            policy=settings.retry_policy,
            unavailable=unavailable,
            what="ADK session service",
        )

    async def _read(self, statement: Any, params: Mapping[str, Any]) -> Any:
        async def work(conn: _Runner) -> Any:
            return (await conn.execute(statement, params)).mappings().all()

        return await self._executor.run(work, idempotent=True, abandonable=True)

    async def _write(
        self, statement: Any, params: Mapping[str, Any], *, idempotent: bool = False
    ) -> Any:
        async def work(conn: _Runner) -> Any:
            return (await conn.execute(statement, params)).mappings().all()

        return await self._executor.run(work, idempotent=idempotent)

    async def check(self) -> None:
        found = await self._read(self._sql.present, {})
        if not all(found[0].values()):
            tables = self._tables
            names = ", ".join(
                t.name
                for t in (tables.sessions, tables.events, tables.app_states, tables.user_states)
            )
            raise SchemaVersionError(
                f"the ADK session service's tables ({names}) do not exist: they come with "
                "statepact's Alembic revision statepact_0006; run `alembic upgrade head` "
                "(or `statepact db upgrade`) first. The service never creates them.",
                expected="statepact_0006",
            )

    async def create(self, new: NewSession) -> CreatedSession | None:
        state = new.state
        statement = self._sql.create[(bool(state.app), bool(state.user))]
        params = {
            **_key(new.key),
            "p_state": _object(state.session),
            "p_lut": new.last_update_time,
            "p_now": new.now,
            "p_run_id": new.key.run_id,
            "p_run_data": new.run_data.decode("utf-8"),
            "p_app_delta": _object(state.app),
            "p_user_delta": _object(state.user),
        }
        row = (await self._write(statement, params))[0]
        if row["seq"] is None:
            return None
        return CreatedSession(
            seq=row["seq"], app_state=row["app_state"] or {}, user_state=row["user_state"] or {}
        )

    async def get(self, query: EventsQuery) -> StoredSession | None:
        params = {**_key(query.key), "p_recent": query.recent, "p_after": query.after}
        rows = await self._read(self._sql.get[query.after is not None], params)
        if not rows:
            return None
        return _stored(query.key, rows[0], rows[0]["events"] or [])

    async def append(
        self, new: NewEvent
    ) -> Appended | Stale | LeaseHeld | LeaseLost | CounterOverflow | None:
        delta = new.delta
        deltas = {
            "input_tokens": new.usage.input_tokens,
            "output_tokens": new.usage.output_tokens,
            "iterations": new.usage.iterations,
            "cursor": 1,
        }
        params: dict[str, Any] = {
            **_key(new.key),
            "p_expected": new.expected,
            "p_owner": None if new.lease is None else new.lease.owner,
            "p_token": None if new.lease is None else new.lease.token,
            "p_now": new.now,
            "p_ts": new.timestamp,
            "p_event_id": new.event_id,
            "p_op": new.op_id,
            "p_data": new.event,
            "p_run_id": new.key.run_id,
            "p_session_delta": _object(delta.session),
            "p_app_delta": _object(delta.app),
            "p_user_delta": _object(delta.user),
            **{f"p_{name}": value for name, value in deltas.items() if name != "cursor"},
            **room(deltas),
        }
        statement = self._sql.append[(bool(delta.app), bool(delta.user))]
        refusal = self._sql.refusal

        async def work(conn: _Runner) -> Any:
            version = (await conn.execute(statement, params)).scalar()
            if version is not None:
                return Appended(version)
            rows = (await conn.execute(refusal, params)).mappings().all()
            return _refused(rows[0] if rows else None, new, deltas)

        # Sent again after a lost reply, the append finds its own event by its call id.
        outcome: Appended | Stale | LeaseHeld | LeaseLost | CounterOverflow | None
        outcome = await self._executor.run(work, idempotent=False, resend_safe=True)
        return outcome

    async def delete(self, key: SessionKey) -> bool:
        rows = await self._write(self._sql.delete, _key(key), idempotent=True)
        return bool(rows[0]["count"])

    async def page(self, query: SessionsQuery) -> list[StoredSession]:
        params = {
            "p_app": query.app,
            "p_user": query.user,
            "p_after": query.after_seq,
            "p_limit": query.limit + 1,
        }
        rows = await self._read(self._sql.page[query.user is not None], params)
        return [
            _stored(SessionKey(query.app, row["user_id"], row["session_id"]), row, [])
            for row in rows
        ]

    async def user_state(self, app: str, user: str) -> Encoded:
        rows = await self._read(self._sql.user_state, {"p_app": app, "p_user": user})
        return dict(rows[0]["state"]) if rows else {}

    async def events(
        self, key: SessionKey, after_seq: int, limit: int
    ) -> list[tuple[int, str]] | None:
        params = {**_key(key), "p_after": after_seq, "p_limit": limit}
        rows = await self._read(self._sql.events, params)
        if not rows:
            return None
        return list(zip(rows[0]["seqs"] or [], rows[0]["events"] or [], strict=True))

    async def usage(self, app: str, user: str | None) -> UsageTotals:
        rows = await self._read(self._sql.usage[user is not None], {"p_app": app, "p_user": user})
        row = rows[0]
        return UsageTotals(
            sessions=int(row["sessions"]),
            input_tokens=int(row["input_tokens"]),
            output_tokens=int(row["output_tokens"]),
            cost_nanos=decimal_to_nanos(row["cost"]),
            iterations=int(row["iterations"]),
            cursor=int(row["cursor"]),
        )

    def _lease(self, request: LeaseRequest) -> dict[str, Any]:
        return {
            **_key(request.key),
            "p_owner": request.owner,
            "p_token": request.token,
            "p_now": request.now,
            "p_expires": request.expires_at,
        }

    async def acquire_lease(self, request: LeaseRequest) -> int | LeaseHeld | None:
        # Sent again, the same owner acquires again: the newer token is the one returned.
        async def work(conn: _Runner) -> Any:
            return (await conn.execute(self._sql.acquire, self._lease(request))).mappings().all()

        rows = await self._executor.run(work, idempotent=False, resend_safe=True)
        if not rows:
            return None
        if rows[0]["token"] is None:
            return LeaseHeld(rows[0]["lease_owner"])
        return int(rows[0]["token"])

    async def renew_lease(self, request: LeaseRequest) -> bool:
        return bool(await self._write(self._sql.renew, self._lease(request), idempotent=True))

    async def release_lease(self, request: LeaseRequest) -> bool:
        return bool(await self._write(self._sql.release, self._lease(request), idempotent=True))

    async def prune_sessions(self, app: str, cutoff: datetime, limit: int) -> int:
        params = {"p_app": app, "p_cutoff": cutoff, "p_limit": limit}
        rows = await self._write(self._sql.prune_sessions, params, idempotent=True)
        return int(rows[0]["count"])

    async def prune_events(self, app: str, cutoff: float, limit: int) -> int:
        params = {"p_app": app, "p_cutoff": cutoff, "p_limit": limit}
        rows = await self._write(self._sql.prune_events, params, idempotent=True)
        return int(rows[0]["count"])


def _stored(key: SessionKey, row: Mapping[str, Any], events: list[str]) -> StoredSession:
    return StoredSession(
        key=key,
        seq=row["seq"],
        version=row["version"],
        last_update_time=row["last_update_time"],
        state=row["state"],
        app_state=row["app_state"] or {},
        user_state=row["user_state"] or {},
        events=events,
    )


def _refused(
    row: Mapping[str, Any] | None, new: NewEvent, deltas: Mapping[str, int]
) -> Appended | Stale | LeaseHeld | LeaseLost | CounterOverflow | None:
    """Why the append wrote nothing (the rules of lua/adk/adk_append.lua, in its order)."""
    if row is None:
        return None
    if row["replayed"] is not None:
        return Appended(row["replayed"])
    expires = row["lease_expires_at"]
    holder = row["lease_owner"] if expires is not None and expires > new.now else None
    if new.lease is not None:
        if holder != new.lease.owner or row["lease_token"] != new.lease.token:
            return LeaseLost()
    elif holder is not None:
        return LeaseHeld(holder)
    if row["version"] != new.expected:
        return Stale(row["version"])
    for name in COUNTERS:
        stored = row[name]
        if stored is not None and stored + deltas[name] > MAX_COUNTER:
            return CounterOverflow(name)
    # Nothing refuses it at this fresh read: a lease or a counter moved between the two
    # statements. Stale, so the caller reloads the session and appends again.
    return Stale(row["version"])
