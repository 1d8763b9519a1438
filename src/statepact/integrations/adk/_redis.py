"""ADK sessions on Redis: each call one script of ``lua/adk/`` (``storage/redis``).

An app's keys (``AdkKeys``) carry the hash tag of the statepact tenant of the same
name, the tag of its runs (``StateKeys``): an append writes the event, the three
state scopes and the run's counters in one script, in one cluster slot. Every
call goes through the backing's ``Failover`` (its retry policy, its errors);
writes carry a call id so a resend after a lost reply applies once. Layout and
round trips: docs/agent-frameworks.md#adk-on-redis.

This module must never format a key (``AdkKeys``, ``StateKeys``) and never read a
clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from statepact.clock import to_micros
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
    StateWrite,
    StoredSession,
    UsageTotals,
    unavailable,
)
from statepact.models import RunStatus
from statepact.settings import RedisStoreSettings
from statepact.storage.redis import (
    ADK_SCRIPTS,
    AdkKeys,
    ScriptCalls,
    StateKeys,
    as_text,
    parse_ref,
    ref,
)

__all__ = ["RedisSessions"]

# lua/adk/_prelude.lua SESSION_FIELDS
_VERSION, _SEQ, _LUT, _HEAD = 0, 1, 2, 3
_FIELDS = 7
_USAGE_PAGE = 1000


def _pairs(reply: Sequence[Any]) -> Encoded:
    """An ``HGETALL`` reply as ``{field: value}``."""
    return {as_text(reply[i]): as_text(reply[i + 1]) for i in range(0, len(reply), 2)}


def _flat(values: Mapping[str, str]) -> list[str]:
    return [part for pair in values.items() for part in pair]


def _state_args(state: StateWrite) -> list[str | int]:
    """ARGV's three pair counts, then the session, app and user pairs."""
    return [
        len(state.session),
        len(state.app),
        len(state.user),
        *_flat(state.session),
        *_flat(state.app),
        *_flat(state.user),
    ]


def _ref(key: SessionKey) -> str:
    return ref(key.user, key.session)


class RedisSessions:
    """The ADK sessions of one Redis backing (its client, its settings' namespace)."""

    def __init__(self, redis: Any, settings: RedisStoreSettings) -> None:
        self._redis = redis
        self._keys = AdkKeys(settings.namespace)
        self._runs = StateKeys(settings.namespace)
        self._run = ScriptCalls(redis, ADK_SCRIPTS, settings.retry_policy, unavailable)

    async def check(self) -> None:
        return None  # the backing's open() ran the preflight; nothing of ours to check

    def _session_keys(self, key: SessionKey) -> list[str]:
        k = self._keys
        return [
            k.session(key.app, key.user, key.session),
            k.state(key.app, key.user, key.session),
            k.events(key.app, key.user, key.session),
            k.timestamps(key.app, key.user, key.session),
        ]

    def _stored(
        self,
        key: SessionKey,
        meta: Sequence[Any],
        *,
        state: Sequence[Any],
        app: Sequence[Any],
        user: Sequence[Any],
        events: Sequence[Any],
    ) -> StoredSession:
        return StoredSession(
            key=key,
            seq=int(meta[_SEQ]),
            version=int(meta[_VERSION]),
            last_update_time=float(as_text(meta[_LUT])),
            state=_pairs(state),
            app_state=_pairs(app),
            user_state=_pairs(user),
            events=[as_text(event) for event in events],
        )

    async def create(self, new: NewSession) -> CreatedSession | None:
        key, k, runs = new.key, self._keys, self._runs
        status = RunStatus.RUNNING
        reply = await self._run(
            f"create_session of session {key.session!r} (app {key.app!r})",
            "adk_create",
            [
                k.session(key.app, key.user, key.session),
                k.state(key.app, key.user, key.session),
                k.app_state(key.app),
                k.user_state(key.app, key.user),
                k.seq(key.app),
                k.sessions(key.app),
                k.user_sessions(key.app, key.user),
                runs.run_meta(key.app, key.run_id),
                runs.run(key.app, key.run_id),
                runs.seq(key.app),
                runs.runs(key.app),
                runs.runs_by_status(key.app, status),
                runs.runs_by_session(key.app, key.user),
                runs.runs_by_session_status(key.app, key.user, status),
                k.idle(key.app),
                k.op(key.app, new.op_id),
            ],
            [
                _ref(key),
                to_micros(new.now),
                repr(new.last_update_time),
                new.run_data,
                status.value,
                key.user,
                key.run_id,
                *_state_args(new.state),
            ],
        )
        if int(reply[0]) == 0:
            return None
        return CreatedSession(
            seq=int(reply[1]), app_state=_pairs(reply[2]), user_state=_pairs(reply[3])
        )

    async def get(self, query: EventsQuery) -> StoredSession | None:
        key, k = query.key, self._keys
        reply = await self._run(
            f"get_session of session {key.session!r} (app {key.app!r})",
            "adk_get",
            [*self._session_keys(key), k.app_state(key.app), k.user_state(key.app, key.user)],
            [
                -1 if query.recent is None else query.recent,
                "" if query.after is None else repr(float(query.after)),
            ],
            read=True,
        )
        if reply is None:
            return None
        meta = reply[:_FIELDS]
        state, app, user, events = reply[_FIELDS:]
        return self._stored(key, meta, state=state, app=app, user=user, events=events)

    async def append(
        self, new: NewEvent
    ) -> Appended | Stale | LeaseHeld | LeaseLost | CounterOverflow | None:
        key, k = new.key, self._keys
        lease = new.lease
        reply = await self._run(
            f"append_event to session {key.session!r} (app {key.app!r})",
            "adk_append",
            [
                *self._session_keys(key),
                k.app_state(key.app),
                k.user_state(key.app, key.user),
                k.heads(key.app),
                self._runs.run_meta(key.app, key.run_id),
                k.op(key.app, new.op_id),
                k.idle(key.app),
            ],
            [
                _ref(key),
                new.expected,
                "" if lease is None else lease.owner,
                "" if lease is None else lease.token,
                to_micros(new.now),
                new.event,
                repr(new.timestamp),
                new.usage.input_tokens,
                new.usage.output_tokens,
                new.usage.iterations,
                *_state_args(new.delta),
            ],
        )
        code = int(reply[0])
        if code == 1:
            return Appended(int(reply[1]))
        if code == 0:
            return None
        if code == 2:
            return Stale(int(reply[1]))
        if code == 3:
            return LeaseHeld(as_text(reply[1]))
        if code == 4:
            return LeaseLost()
        return CounterOverflow(as_text(reply[1]))

    async def delete(self, key: SessionKey) -> bool:
        k = self._keys
        reply = await self._run(
            f"delete_session of session {key.session!r} (app {key.app!r})",
            "adk_delete",
            [
                *self._session_keys(key),
                k.sessions(key.app),
                k.user_sessions(key.app, key.user),
                k.heads(key.app),
                k.idle(key.app),
            ],
            [_ref(key)],
        )
        return int(reply) == 1

    async def page(self, query: SessionsQuery) -> list[StoredSession]:
        k, app = self._keys, query.app
        index = k.sessions(app) if query.user is None else k.user_sessions(app, query.user)
        reply = await self._run(
            f"list_sessions of app {app!r}",
            "adk_page",
            [index, k.app_state(app)],
            [k.prefix(app), query.after_seq, query.limit + 1],
            read=True,
        )
        app_state = reply[0]
        return [
            self._stored(
                SessionKey(app, *parse_ref(reply[i])),
                reply[i + 1],
                state=reply[i + 2],
                app=app_state,
                user=reply[i + 3],
                events=[],
            )
            for i in range(1, len(reply), 4)
        ]

    async def user_state(self, app: str, user: str) -> Encoded:
        key = self._keys.user_state(app, user)
        reply = await self._run.failover.run(
            f"get_user_state of user {user!r} (app {app!r})",
            lambda: self._redis.hgetall(key),
            abandonable=True,
        )
        return {as_text(name): as_text(value) for name, value in reply.items()}

    async def events(
        self, key: SessionKey, after_seq: int, limit: int
    ) -> list[tuple[int, str]] | None:
        k = self._keys
        reply = await self._run(
            f"list_events of session {key.session!r} (app {key.app!r})",
            "adk_events",
            [k.session(key.app, key.user, key.session), k.events(key.app, key.user, key.session)],
            [after_seq, limit],
            read=True,
        )
        if reply is None:
            return None
        first = int(reply[0])
        return [(first + i, as_text(data)) for i, data in enumerate(reply[1:])]

    async def usage(self, app: str, user: str | None) -> UsageTotals:
        runs = self._runs
        index = runs.runs(app) if user is None else runs.runs_by_session(app, user)
        sessions = input_tokens = output_tokens = cost = iterations = cursor = 0
        after = 0
        while True:
            reply = await self._run(
                f"usage of app {app!r}",
                "adk_usage",
                [index],
                [runs.prefix(app), after, _USAGE_PAGE, RUN_PREFIX],
                read=True,
            )
            for fields in reply[1:]:
                if fields[0] is None:
                    continue  # deleted between the index read and its hash read: not there
                sessions += 1
                input_tokens += int(fields[0])
                output_tokens += int(fields[1])
                cost += int(fields[2])
                iterations += int(fields[3])
                cursor += int(fields[4])
            after = int(float(as_text(reply[0])))
            if after == 0:
                break
        return UsageTotals(
            sessions=sessions,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_nanos=cost,
            iterations=iterations,
            cursor=cursor,
        )

    async def _lease(self, mode: str, request: LeaseRequest) -> Any:
        key = request.key
        return await self._run(
            f"{mode}_lease of session {key.session!r} (app {key.app!r})",
            "adk_lease",
            [self._keys.session(key.app, key.user, key.session)],
            [
                mode,
                request.owner,
                request.token,
                to_micros(request.now),
                to_micros(request.expires_at),
            ],
        )

    async def acquire_lease(self, request: LeaseRequest) -> int | LeaseHeld | None:
        reply = await self._lease("acquire", request)
        code = int(reply[0])
        if code == 0:
            return None
        if code == 2:
            return LeaseHeld(as_text(reply[1]))
        return int(reply[1])

    async def renew_lease(self, request: LeaseRequest) -> bool:
        return int((await self._lease("renew", request))[0]) == 1

    async def release_lease(self, request: LeaseRequest) -> bool:
        return int((await self._lease("release", request))[0]) == 1

    async def prune_sessions(self, app: str, cutoff: datetime, limit: int) -> int:
        k = self._keys
        return int(
            await self._run(
                f"prune_sessions of app {app!r}",
                "adk_prune_sessions",
                [k.idle(app), k.sessions(app), k.heads(app)],
                [k.prefix(app), to_micros(cutoff), limit],
            )
        )

    async def prune_events(self, app: str, cutoff: float, limit: int) -> int:
        k = self._keys
        return int(
            await self._run(
                f"prune_events of app {app!r}",
                "adk_prune_events",
                [k.heads(app)],
                [k.prefix(app), repr(cutoff), limit],
            )
        )
