"""The Worker announces itself in the worker registry (the dashboard's workers page) on the
memory queue: listed once started, with its concurrency, in-flight count and failures;
removed once stopped; a registry that fails never stops it; ``import statepact.worker``
loads no web framework."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from statepact.clock import ManualClock
from statepact.dashboard.workers import WorkerInfo, WorkerRegistry, registry_for, start_presence
from statepact.models import WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.memory import MemoryWorkQueue
from statepact.worker import Job, Worker, WorkerHooks
from tests.unit.test_worker import FAST, put, until


@pytest.fixture
def queue(clock: ManualClock) -> MemoryWorkQueue:
    return MemoryWorkQueue(clock=clock, policy=QueuePolicy(max_attempts=1, jitter=0))


async def test_a_started_worker_is_listed_and_a_stopped_one_removed(
    queue: MemoryWorkQueue,
) -> None:
    release = asyncio.Event()
    worker = Worker(queue, worker_id="w-presence", concurrency=3, **FAST)

    @worker.task("hold")
    async def hold(job: Job) -> None:
        await release.wait()

    registry = registry_for(queue)
    assert await registry.live() == []
    await worker.start()
    try:
        await until(lambda: _listed(registry, ["w-presence"]))
        (info,) = await registry.live()
        assert (info.concurrency, info.queues, info.in_flight) == (3, (queue.name,), 0)
        await put(queue, "h", task="hold")
        await until(lambda: worker.in_flight == 1)
    finally:
        release.set()
        await worker.stop()
    assert await registry.live() == []


async def test_the_listing_carries_in_flight_and_failures(queue: MemoryWorkQueue) -> None:
    """A beat reads ``in_flight()`` and the failures the worker's hooks saw."""
    registry = registry_for(queue)
    in_flight = 0
    hooks = _Hooks()
    presence = start_presence(
        queue, "w-beats", concurrency=2, in_flight=lambda: in_flight, hooks=hooks, ttl=0.06
    )
    try:
        await until(lambda: _listed(registry, ["w-beats"]))
        in_flight = 2
        await until(lambda: _any(registry, lambda info: info.in_flight == 2))
        (counting,) = hooks.added
        item = WorkItem(tenant="t", item_id="i")
        counting.failed(None, item, "RuntimeError: boom")
        counting.lease_lost(None, "reaped")
        await until(lambda: _any(registry, lambda info: info.failures == 2))
        (info,) = await registry.live()
        assert info.last_error == "lease lost: reaped"
    finally:
        presence.cancel()
        await asyncio.wait({presence})
    assert await registry.live() == []


class _Hooks:
    """Where the presence adds its failure counter (the worker's ``HookSet`` has ``add``)."""

    def __init__(self) -> None:
        self.added: list[WorkerHooks] = []

    def add(self, hooks: WorkerHooks) -> None:
        self.added.append(hooks)


class _Down:
    """A registry whose server is down: every call raises."""

    def __init__(self) -> None:
        self.beats = 0

    async def beat(self, info: WorkerInfo) -> None:
        self.beats += 1
        raise ConnectionError("registry down")

    async def leave(self, worker_id: str) -> None:
        raise ConnectionError("registry down")

    async def live(self) -> list[WorkerInfo]:
        raise ConnectionError("registry down")


async def test_a_failed_beat_never_stops_the_presence(
    queue: MemoryWorkQueue, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failed beat is logged and tried again; leaving fails quietly too."""
    down = _Down()
    presence = start_presence(
        queue, "w-down", concurrency=1, in_flight=lambda: 0, ttl=0.03, registry=down
    )
    try:
        await until(lambda: down.beats >= 3)
        assert not presence.done()
    finally:
        presence.cancel()
        await asyncio.wait({presence})
    assert presence.cancelled()
    assert "registry beat failed: registry down" in caplog.text
    assert "leaving the registry failed: registry down" in caplog.text


def test_a_queue_of_no_known_backing_has_no_registry() -> None:
    """The worker catches this refusal (logged), so an application's own queue still runs."""
    with pytest.raises(TypeError, match="queue: no worker registry for a object"):
        registry_for(object())  # type: ignore[arg-type]


def test_import_statepact_worker_loads_no_web_framework() -> None:
    probe = (
        "import json, sys, statepact.worker, statepact.dashboard.workers\n"
        "web = ('starlette', 'jinja2', 'redis', 'sqlalchemy', 'asyncpg')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in web)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


async def _listed(registry: WorkerRegistry, ids: list[str]) -> bool:
    return [info.worker_id for info in await registry.live()] == ids


async def _any(registry: WorkerRegistry, check: Callable[[WorkerInfo], bool]) -> bool:
    return any(check(info) for info in await registry.live())
