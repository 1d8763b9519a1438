"""``RedisStateStore``: agent runs and sessions on Redis (standalone or cluster).

It implements the ``_``-methods of :class:`~statepact.state.BaseStateStore`
(the front has validated, encoded and size-checked everything and read the
clock): each call is one script of ``lua/state/``, every key of a tenant in
one slot. Layout, round trips and replays: docs/backings.md#redis.

This module must never format a key (``_keys``), never read a clock, and never
let a redis-py exception out (``_client``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Self

from statepact._codec import decode_json, nanos_to_decimal
from statepact._retry import new_op_id
from statepact.clock import Clock, from_micros, to_micros
from statepact.errors import RunNotFoundError, StateConflictError, StatePersistenceError
from statepact.models import RunRecord, RunStatus, SessionRecord, stored
from statepact.settings import RedisStoreSettings
from statepact.state import (
    BaseStateStore,
    CounterDelta,
    CounterOverflow,
    ListQuery,
    RunPrune,
    RunWrite,
    SessionWrite,
)
from statepact.storage.redis._client import as_text
from statepact.storage.redis._keys import StateKeys
from statepact.storage.redis._scripts import STATE_SCRIPTS, ScriptCalls
from statepact.storage.redis.preflight import check

__all__ = ["RedisStateStore"]

# The order of the fields in a record reply (lua/state/_prelude.lua RUN_FIELDS, SESSION_FIELDS).
_VERSION, _SEQ, _CREATED, _UPDATED = 0, 1, 2, 3
_STATUS, _SESSION, _INPUT, _OUTPUT, _COST, _ITERATIONS, _CURSOR, _RUN_BLOB = range(4, 12)
_SESSION_BLOB = 4
_STATUSES = {status.value: status for status in RunStatus}


def _unavailable(message: str) -> StatePersistenceError:
    return StatePersistenceError(message, reason="unavailable")


class RedisStateStore(BaseStateStore):
    """Runs and sessions in Redis; see the module docstring for the layout.

    ``redis`` is a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``
    the caller owns (and closes). The constructor does not check the server;
    :meth:`open` runs :func:`~statepact.storage.redis.preflight` first.
    """

    def __init__(
        self,
        redis: Any,
        *,
        clock: Clock | None = None,
        settings: RedisStoreSettings | None = None,
    ) -> None:
        settings = settings or RedisStoreSettings()
        super().__init__(clock=clock, max_value_bytes=settings.max_value_bytes)
        self._redis = redis
        self._settings = settings
        self._keys = StateKeys(settings.namespace)
        self._run = ScriptCalls(redis, STATE_SCRIPTS, settings.retry_policy, _unavailable)

    @classmethod
    async def open(
        cls,
        redis: Any,
        *,
        clock: Clock | None = None,
        settings: RedisStoreSettings | None = None,
    ) -> Self:
        """A store on ``redis`` after ``preflight`` (durability as ``settings.durable``)."""
        store = cls(redis, clock=clock, settings=settings)
        await check(redis, durable=store._settings.durable, failover=store._run.failover)
        return store

    @property
    def settings(self) -> RedisStoreSettings:
        return self._settings

    @property
    def client(self) -> Any:
        """The client the calls go through (observability reads where it points)."""
        return self._redis

    def __repr__(self) -> str:
        return f"RedisStateStore(namespace={self._settings.namespace!r})"

    # -- runs ---------------------------------------------------------------

    async def _get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        reply = await self._run(
            f"get_run of run {run_id!r} (tenant {tenant!r})",
            "get_run",
            [self._keys.run_meta(tenant, run_id)],
            [self._keys.prefix(tenant), run_id],
            read=True,
        )
        return None if reply is None else _run_record(tenant, run_id, reply)

    async def _put_run(self, write: RunWrite) -> RunRecord:
        keys = self._keys
        tenant, run_id = write.tenant, write.run_id
        reply = await self._run(
            f"put_run of run {run_id!r} (tenant {tenant!r})",
            "put_run",
            [
                keys.run(tenant, run_id),
                keys.run_meta(tenant, run_id),
                keys.seq(tenant),
                keys.runs(tenant),
                keys.op(tenant, new_op_id()),
            ],
            [
                keys.prefix(tenant),
                run_id,
                write.expected_version,
                write.data,
                write.status.value,
                write.session_id or "",
                to_micros(write.now),
            ],
        )
        if int(reply[0]) == 0:
            raise StateConflictError(
                tenant=tenant,
                record_id=run_id,
                expected=write.expected_version,
                actual=int(reply[1]),
                kind="run",
            )
        return _run_record(tenant, run_id, reply[1:], write.value)

    async def _patch_run(
        self, tenant: str, run_id: str, delta: CounterDelta, now: datetime
    ) -> RunRecord | CounterOverflow:
        reply = await self._run(
            f"patch_run of run {run_id!r} (tenant {tenant!r})",
            "patch_run",
            [
                self._keys.run_meta(tenant, run_id),
                self._keys.run(tenant, run_id),
                self._keys.op(tenant, new_op_id()),
            ],
            [
                self._keys.prefix(tenant),
                run_id,
                to_micros(now),
                str(delta.input_tokens),
                str(delta.output_tokens),
                str(delta.cost_nanos),
                str(delta.iterations),
                str(delta.cursor),
            ],
        )
        code = int(reply[0])
        if code == 0:
            raise RunNotFoundError(tenant=tenant, run_id=run_id)
        if code == 2:
            return CounterOverflow(as_text(reply[1]))
        return _run_record(tenant, run_id, reply[1:])

    async def _list_runs(self, query: ListQuery) -> list[RunRecord]:
        keys, tenant = self._keys, query.tenant
        if query.session_id is not None and query.status is not None:
            index = keys.runs_by_session_status(tenant, query.session_id, query.status)
        elif query.session_id is not None:
            index = keys.runs_by_session(tenant, query.session_id)
        elif query.status is not None:
            index = keys.runs_by_status(tenant, query.status)
        else:
            index = keys.runs(tenant)
        reply = await self._run(
            f"list_runs of tenant {tenant!r}",
            "list_runs",
            [index],
            [keys.prefix(tenant), query.after_seq, query.limit + 1],
            read=True,
        )
        return [
            _run_record(tenant, as_text(reply[i]), reply[i + 1]) for i in range(0, len(reply), 2)
        ]

    async def _first_seq_since(self, tenant: str, since: datetime) -> int | None:
        reply = await self._run(
            f"run_totals of tenant {tenant!r}",
            "first_run_since",
            [self._keys.runs(tenant)],
            [self._keys.prefix(tenant), to_micros(since)],
            read=True,
        )
        seq = int(reply)
        return None if seq < 0 else seq

    async def _delete_run(self, tenant: str, run_id: str) -> bool:
        keys = self._keys
        reply = await self._run(
            f"delete_run of run {run_id!r} (tenant {tenant!r})",
            "delete_run",
            [
                keys.run(tenant, run_id),
                keys.run_meta(tenant, run_id),
                keys.runs(tenant),
                keys.op(tenant, new_op_id()),
            ],
            [keys.prefix(tenant), run_id],
        )
        return int(reply) == 1

    async def _prune_runs(self, prune: RunPrune) -> int:
        tenants = [prune.tenant] if prune.tenant is not None else await self._tenants()
        statuses = sorted(status.value for status in prune.statuses)
        cutoff = to_micros(prune.cutoff)
        deleted = 0
        for tenant in tenants:
            after = 0
            while after >= 0:
                reply = await self._run(
                    f"prune_runs of tenant {tenant!r}",
                    "prune_runs",
                    [self._keys.runs(tenant)],
                    [self._keys.prefix(tenant), after, prune.batch, cutoff, *statuses],
                )
                deleted += int(reply[0])
                after = int(reply[1])
        return deleted

    async def _tenants(self) -> list[str]:
        """Every tenant with a run: a SCAN of the keyspace, one bounded page per call."""

        async def scan() -> list[str]:
            found: set[str] = set()
            async for key in self._redis.scan_iter(match=self._keys.runs_pattern(), count=500):
                tenant = self._keys.tenant_of_runs(key)
                if tenant is not None:
                    found.add(tenant)
            return sorted(found)

        return await self._run.failover.run("prune_runs (listing tenants)", scan, abandonable=True)

    # -- sessions -----------------------------------------------------------

    async def _put_session(self, write: SessionWrite) -> SessionRecord:
        keys = self._keys
        tenant, session_id = write.tenant, write.session_id
        reply = await self._run(
            f"put_session of session {session_id!r} (tenant {tenant!r})",
            "put_session",
            [
                keys.session(tenant, session_id),
                keys.session_meta(tenant, session_id),
                keys.seq(tenant),
                keys.sessions(tenant),
                keys.op(tenant, new_op_id()),
            ],
            [
                keys.prefix(tenant),
                session_id,
                write.expected_version,
                write.data,
                to_micros(write.now),
            ],
        )
        if int(reply[0]) == 0:
            raise StateConflictError(
                tenant=tenant,
                record_id=session_id,
                expected=write.expected_version,
                actual=int(reply[1]),
                kind="session",
            )
        return _session_record(tenant, session_id, reply[1:])

    async def _get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        reply = await self._run(
            f"get_session of session {session_id!r} (tenant {tenant!r})",
            "get_session",
            [self._keys.session_meta(tenant, session_id)],
            [self._keys.prefix(tenant), session_id],
            read=True,
        )
        return None if reply is None else _session_record(tenant, session_id, reply)

    async def _list_sessions(self, tenant: str, limit: int, after_seq: int) -> list[SessionRecord]:
        reply = await self._run(
            f"list_sessions of tenant {tenant!r}",
            "list_sessions",
            [self._keys.sessions(tenant)],
            [self._keys.prefix(tenant), after_seq, limit + 1],
            read=True,
        )
        return [
            _session_record(tenant, as_text(reply[i]), reply[i + 1])
            for i in range(0, len(reply), 2)
        ]

    async def _delete_session(self, tenant: str, session_id: str) -> bool:
        keys = self._keys
        reply = await self._run(
            f"delete_session of session {session_id!r} (tenant {tenant!r})",
            "delete_session",
            [
                keys.session(tenant, session_id),
                keys.session_meta(tenant, session_id),
                keys.sessions(tenant),
                keys.op(tenant, new_op_id()),
            ],
            [session_id],
        )
        return int(reply) == 1


def _run_record(
    tenant: str, run_id: str, fields: Sequence[Any], written: dict[str, Any] | None = None
) -> RunRecord:
    """The record of a reply; ``written`` is the blob a put sent, decoded, which its
    reply leaves out (the blob field is nil) when it wrote it."""
    session = fields[_SESSION]
    blob = fields[_RUN_BLOB]
    return stored(
        RunRecord,
        {
            "tenant": tenant,
            "run_id": run_id,
            "session_id": None if session is None else as_text(session),
            "status": _STATUSES[as_text(fields[_STATUS])],
            "data": written if blob is None and written is not None else decode_json(blob),
            "version": int(fields[_VERSION]),
            "input_tokens": int(fields[_INPUT]),
            "output_tokens": int(fields[_OUTPUT]),
            "cost": nanos_to_decimal(int(fields[_COST])),
            "iterations": int(fields[_ITERATIONS]),
            "cursor": int(fields[_CURSOR]),
            "created_at": from_micros(int(fields[_CREATED])),
            "updated_at": from_micros(int(fields[_UPDATED])),
            "seq": int(fields[_SEQ]),
        },
    )


def _session_record(tenant: str, session_id: str, fields: Sequence[Any]) -> SessionRecord:
    return stored(
        SessionRecord,
        {
            "tenant": tenant,
            "session_id": session_id,
            "data": decode_json(fields[_SESSION_BLOB]),
            "version": int(fields[_VERSION]),
            "created_at": from_micros(int(fields[_CREATED])),
            "updated_at": from_micros(int(fields[_UPDATED])),
            "seq": int(fields[_SEQ]),
        },
    )
