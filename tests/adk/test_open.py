"""``StatepactSessionService.open``: what it takes, and which store it picks."""

from __future__ import annotations

from typing import Any

import pytest

from statepact.integrations.adk import StatepactSessionService
from statepact.integrations.adk._memory import MemorySessions
from statepact.storage import Backing
from statepact.storage.memory import MemoryStateStore


async def test_open_refuses_what_is_not_a_backing(memory_backing: Backing[Any, Any, Any]) -> None:
    """Anything but a statepact Backing is a TypeError naming the argument."""
    with pytest.raises(TypeError, match="backing"):
        await StatepactSessionService.open(memory_backing.state)  # type: ignore[arg-type]


async def test_open_finds_the_backing_of_a_subclassed_store(
    memory_backing: Backing[Any, Any, Any],
) -> None:
    """A state store subclassed in the application still opens its backing's store."""

    class Audited(MemoryStateStore):
        pass

    audited = Audited(clock=memory_backing.state.clock)
    backing = Backing(
        state=audited,
        queue=memory_backing.queue,
        backend=memory_backing.backend,
        manager=memory_backing.manager,
    )
    service = await StatepactSessionService.open(backing)
    assert isinstance(service._store, MemorySessions)
    session = await service.create_session(app_name="a", user_id="u")
    assert await audited.get_run("a", service.run_id("u", session.id)) is not None
