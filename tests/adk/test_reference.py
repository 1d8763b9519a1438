"""Against ADK's own reference: random scripts of calls replayed on ``InMemorySessionService``
and on ``StatepactSessionService`` (each backing) return the same sessions, events, state,
listings and errors, call after call.

ADK's clock is pointed at the test's ``ManualClock`` (``google.adk.platform.time``), so
both stamp a created session with the same time.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.platform import time as adk_time
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.in_memory_session_service import InMemorySessionService

from statepact.clock import ManualClock
from statepact.integrations.adk import StatepactSessionService
from statepact.storage import Backing
from tests.adk._contract import event

BACKINGS = ["memory_backing", "redis_backing", "postgres_backing"]
APPS, USERS, IDS = ("a1", "a2"), ("u1", "u2", "u3"), ("s1", "s2", " s3 ", "s4")
STEPS = 80


@pytest.fixture(params=BACKINGS)
def backing(request: pytest.FixtureRequest) -> Backing[Any, Any, Any]:
    opened: Backing[Any, Any, Any] = request.getfixturevalue(request.param)
    return opened


@pytest.fixture
def adk_clock(clock: ManualClock) -> Iterator[None]:
    adk_time.set_time_provider(lambda: clock.now().timestamp())
    try:
        yield
    finally:
        adk_time.reset_time_provider()


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(7 if depth < 2 else 5)
    if kind == 0:
        return rng.randrange(-(2**40), 2**40)
    if kind == 1:
        return rng.choice(["", "x", "é✓", "a b"])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.choice([0.5, -1.25, 1e20, 3.0])
    if kind == 4:
        return rng.randrange(10)
    if kind == 5:
        return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randrange(3))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]


def _state(rng: random.Random) -> dict[str, Any]:
    prefixes = ("", "app:", "user:", "temp:")
    return {
        f"{rng.choice(prefixes)}k{rng.randrange(4)}": _value(rng) for _ in range(rng.randrange(4))
    }


async def _call(service: BaseSessionService, op: tuple[Any, ...]) -> Any:
    """One step on one service; its result as plain data, or the ADK error it raised."""
    name, app, user, sid, *rest = op
    try:
        if name == "create":
            created = await service.create_session(
                app_name=app, user_id=user, session_id=sid, state=rest[0]
            )
            return created.model_dump()
        if name == "append":
            session = await service.get_session(app_name=app, user_id=user, session_id=sid)
            if session is None:
                return "no session"
            appended = await service.append_event(session, rest[0].model_copy(deep=True))
            return [appended.model_dump(), session.model_dump()]
        if name == "get":
            got = await service.get_session(
                app_name=app, user_id=user, session_id=sid, config=rest[0]
            )
            return None if got is None else got.model_dump()
        if name == "list":
            listed = await service.list_sessions(app_name=app, user_id=user)
            return [s.model_dump() for s in listed.sessions]
        if name == "user_state":
            return await service.get_user_state(app_name=app, user_id=user)
        await service.delete_session(app_name=app, user_id=user, session_id=sid)
        return "deleted"
    except (AlreadyExistsError, SessionNotFoundError) as exc:
        return type(exc).__name__


def _script(seed: int) -> Iterator[tuple[Any, ...]]:
    rng = random.Random(seed)
    for step in range(STEPS):
        app, user, sid = rng.choice(APPS), rng.choice(USERS), rng.choice(IDS)
        roll = rng.random()
        if roll < 0.25:
            yield ("create", app, user, sid, _state(rng))
        elif roll < 0.6:
            ts = rng.choice([100.0, 200.0, 150.0, 1000.0 + step])
            yield ("append", app, user, sid, event(_state(rng), ts=ts, author=rng.choice("ab")))
        elif roll < 0.8:
            config = rng.choice(
                [
                    None,
                    GetSessionConfig(num_recent_events=rng.randrange(4)),
                    GetSessionConfig(after_timestamp=rng.choice([120.0, 200.0, 1010.0])),
                    GetSessionConfig(num_recent_events=2, after_timestamp=150.0),
                ]
            )
            yield ("get", app, user, sid, config)
        elif roll < 0.88:
            yield ("list", app, rng.choice([*USERS, None]), sid)
        elif roll < 0.95:
            yield ("user_state", app, user, sid)
        else:
            yield ("delete", app, user, sid)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_random_script_reads_as_on_adks_reference(
    backing: Backing[Any, Any, Any], clock: ManualClock, adk_clock: None, seed: int
) -> None:
    """Every call of the script returns on statepact what it returns on
    InMemorySessionService (ADK's own), errors included."""
    reference = InMemorySessionService()
    ours = await StatepactSessionService.open(backing)
    for step, op in enumerate(_script(seed)):
        expected = await _call(reference, op)
        got = await _call(ours, op)
        assert got == expected, f"step {step}: {op[:4]}"
        clock.advance(1)
