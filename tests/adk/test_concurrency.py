"""Appends at once, on every backing: one session (a conflict, or turns under a lease, never
a lost or interleaved event) and forty sessions (never a conflict, no update lost)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from statepact.integrations.adk import (
    SessionConflictError,
    SessionLeasedError,
    StatepactSessionService,
)
from statepact.storage import Backing
from tests.adk._contract import APP, USER, event

BACKINGS = ["memory_backing", "redis_backing", "postgres_backing"]


@pytest.fixture(params=BACKINGS)
def backing(request: pytest.FixtureRequest) -> Backing[Any, Any, Any]:
    """Each backing in turn, reached by its fixture's name (as tests/model does)."""
    opened: Backing[Any, Any, Any] = request.getfixturevalue(request.param)
    return opened


@pytest.fixture
async def service(backing: Backing[Any, Any, Any]) -> StatepactSessionService:
    return await StatepactSessionService.open(backing)


async def test_two_appends_to_one_session_at_once_one_conflicts(
    service: StatepactSessionService,
) -> None:
    """Two writers holding the same version append at once: exactly one is stored, the
    other gets SessionConflictError and writes nothing, round after round."""
    await service.create_session(app_name=APP, user_id=USER, session_id="s")
    rounds = 12
    for i in range(rounds):
        read = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert read is not None
        copies = [read.model_copy(deep=True) for _ in range(2)]
        results = await asyncio.gather(
            *(
                service.append_event(copy, event({"round": i, "app:last": f"{i}-{n}"}, ts=float(i)))
                for n, copy in enumerate(copies)
            ),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        assert len(failed) == 1 and isinstance(failed[0], SessionConflictError), results
        winner = next(n for n, r in enumerate(results) if not isinstance(r, BaseException))
        stored = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert stored is not None and stored.state["app:last"] == f"{i}-{winner}"
    final = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert final is not None
    assert [e.actions.state_delta["round"] for e in final.events] == list(range(rounds))


async def test_two_writers_under_the_lease_take_turns_without_losing_an_event(
    service: StatepactSessionService,
) -> None:
    """Two workers that each take the session's lease, read it, append a batch and let it
    go: every event is stored, each batch contiguous, and neither ever conflicts."""
    await service.create_session(app_name=APP, user_id=USER, session_id="s")
    batch, turns = 4, 5

    async def worker(name: str) -> None:
        for turn in range(turns):
            while True:
                async with service.leased(
                    app_name=APP, user_id=USER, session_id="s", owner=name, ttl=30
                ) as leased:
                    if leased is not None:
                        session = await leased.get_session(
                            app_name=APP, user_id=USER, session_id="s"
                        )
                        assert session is not None
                        for n in range(batch):
                            await leased.append_event(
                                session,
                                event({"by": name}, author=name, custom_metadata={"n": [turn, n]}),
                            )
                        break
                await asyncio.sleep(0.001)

    await asyncio.gather(worker("w1"), worker("w2"))
    final = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert final is not None and len(final.events) == 2 * batch * turns
    authors = [e.author for e in final.events]
    for start in range(0, len(authors), batch):
        assert len(set(authors[start : start + batch])) == 1, authors
    assert authors.count("w1") == authors.count("w2") == batch * turns


async def test_an_unleased_writer_is_refused_while_another_holds_the_lease(
    service: StatepactSessionService,
) -> None:
    """While w1 holds the lease, w2's appends (without it) write nothing."""
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    lease = await service.leases.acquire(
        app_name=APP, user_id=USER, session_id="s", owner="w1", ttl=30
    )
    assert lease is not None
    leased = service.with_lease(lease)
    intruder = session.model_copy(deep=True)
    results = await asyncio.gather(
        leased.append_event(session, event({"by": "w1"})),
        service.append_event(intruder, event({"by": "w2"})),
        return_exceptions=True,
    )
    assert not isinstance(results[0], BaseException)
    assert isinstance(results[1], SessionLeasedError)
    final = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert final is not None and final.state == {"by": "w1"} and len(final.events) == 1


async def test_forty_sessions_appended_at_once_never_conflict(
    service: StatepactSessionService,
) -> None:
    """Forty tasks, each appending to its own session (and to the shared app: and user:
    scopes, each its own key): no conflict, every event stored in order, no key lost."""
    sessions = [
        await service.create_session(app_name=APP, user_id=f"u{i % 4}", session_id=f"s{i}")
        for i in range(40)
    ]
    appends = 5

    async def run(index: int) -> None:
        session = sessions[index]
        for n in range(appends):
            delta = {"n": n, f"app:k{index}": n, f"user:k{index}": n}
            await service.append_event(session, event(delta, ts=float(n), usage=(1, 1)))

    await asyncio.gather(*(run(i) for i in range(40)))
    for index, session in enumerate(sessions):
        stored = await service.get_session(
            app_name=APP, user_id=session.user_id, session_id=session.id
        )
        assert stored is not None
        assert [e.actions.state_delta["n"] for e in stored.events] == list(range(appends))
        assert stored.state[f"app:k{index}"] == appends - 1
        assert stored.state[f"user:k{index}"] == appends - 1
    usage = await service.usage(app_name=APP)
    assert (usage.sessions, usage.input_tokens, usage.events) == (40, 200, 200)
