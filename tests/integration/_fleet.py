"""The crash tests' machinery: a fleet of worker processes that drain one real queue while the
test kills, freezes and replaces them, and what both tests check at the end.

``test_queue_crash.py`` runs ``_queue_worker.py`` (claim, sleep, ack) and
``test_worker_crash.py`` runs ``_worker_process.py`` (a ``Worker``); each process
appends fsynced lines ``<kind> <tenant> <item_id> <token>`` to a log of its own, so
the test can read after any SIGKILL what it did. Here: the ``spec`` and ``view``
fixtures (where a worker opens the queue, and the test's own handle on it), the
items both tests enqueue, a :class:`Fleet` of :class:`Member` processes (start,
kill, freeze until another worker has reclaimed an item, finish), the turns of the
kill loop, and the end-state checks. What a test reads in its logs stays in it.

This module must never signal a process it did not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, Generic, TypeVar

import pytest

from statepact.models import ItemStatus, QueueStats, WorkItem
from statepact.queue import BaseWorkQueue
from tests._processes import Worker, reap_all, spawn
from tests.integration._queue_worker import open_queue

ITEMS = 2_000
TENANTS = 5
LEASE = 1.5  # seconds: short, so a killed worker's items come back quickly
# High enough that no number of kills can dead-letter an item.
POLICY = {"max_attempts": 50}
QUEUE = "crash"
TAKEOVER_WAIT = 20.0  # seconds a frozen worker's item may take to be reclaimed
TIME_LIMIT = 90.0  # seconds of draining, whatever the machine's load

Key = tuple[str, str]  # (tenant, item_id)


# -- the queue -------------------------------------------------------------------------------


@pytest.fixture(params=["redis", "postgres"])
def spec(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """How a worker opens the queue: the server URL, and a fresh namespace or database."""
    base = {"queue": QUEUE, "policy": POLICY, "lease": LEASE}
    if request.param == "postgres":
        yield {**base, "kind": "postgres", "url": request.getfixturevalue("pg_database_url")}
        return
    from statepact.testing.namespaces import clear_namespace_at
    from tests.fixtures.postgres import run_in_thread

    url: str = request.getfixturevalue("statepact_redis_url")
    namespace = f"sp-crash-{uuid.uuid4().hex[:10]}"
    yield {**base, "kind": "redis", "url": url, "namespace": namespace}
    # A namespace of its own, so no FLUSHDB: other tests may share this database.
    run_in_thread(lambda: clear_namespace_at(url, namespace))


@pytest.fixture
async def view(spec: dict[str, Any]) -> AsyncIterator[BaseWorkQueue]:
    """The test's own handle on the queue, opened exactly as a worker opens it."""
    queue, close = await open_queue({**spec, "pool_size": 8})
    try:
        yield queue
    finally:
        await close()


async def enqueue_all(queue: BaseWorkQueue) -> list[Key]:
    """``ITEMS`` items over ``TENANTS`` tenants, a few in flight at once (within the pool)."""
    keys = [(f"t{n % TENANTS}", f"item-{n:04d}") for n in range(ITEMS)]
    for start in range(0, ITEMS, 8):
        await asyncio.gather(
            *(
                queue.enqueue(WorkItem(tenant=tenant, item_id=item_id, payload={"n": n}))
                for n, (tenant, item_id) in enumerate(keys[start : start + 8], start)
            )
        )
    return keys


async def records_of(queue: BaseWorkQueue, keys: list[Key]) -> dict[Key, WorkItem | None]:
    records: dict[Key, WorkItem | None] = {}
    for start in range(0, len(keys), 8):
        chunk = keys[start : start + 8]
        found = await asyncio.gather(*(queue.get_item(tenant, item) for tenant, item in chunk))
        records.update(zip(chunk, found, strict=True))
    return records


def assert_all_done(records: dict[Key, WorkItem | None], stats: QueueStats) -> None:
    """The queue's own record: every item done, nothing queued, leased or dead."""
    not_done = [k for k, r in records.items() if r is None or r.status != ItemStatus.DONE]
    assert not_done == [], f"{len(not_done)} not done: {[records[k] for k in not_done[:3]]}"
    assert (stats.queued, stats.leased, stats.dead) == (0, 0, 0)


def assert_issued_once(tokens: Iterable[int]) -> None:
    """A token is issued once: no two leases (or renewals) ever shared one."""
    issued = Counter(tokens)
    assert [t for t, n in issued.items() if n > 1] == []


def reclaimed_count(records: dict[Key, WorkItem | None]) -> int:
    """Items claimed more than once."""
    return sum(1 for r in records.values() if r is not None and r.attempts > 1)


# -- the processes ---------------------------------------------------------------------------


@dataclass
class Member:
    """One worker process in one slot: its log and stderr, whether it was killed, and each
    lease (item, token) it held while the test froze it."""

    prefix: ClassVar[str] = "w"

    slot: int
    number: int
    worker: Worker
    log: Path
    err: Path
    ready: asyncio.Task[dict[str, Any]]
    killed: bool = False
    frozen: list[tuple[Key, int]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.prefix}{self.slot}-{self.number}"

    @property
    def running(self) -> bool:
        """Started, queue opened (``ready`` seen) and not exited."""
        return (
            self.worker.process.returncode is None
            and self.ready.done()
            and not self.ready.cancelled()
            and self.ready.exception() is None
        )

    def entries(self) -> list[tuple[str, Key, int]]:
        """The log as ``(kind, (tenant, item_id), token)``, oldest first."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            kind, tenant, item_id, token = line.split(" ")
            out.append((kind, (tenant, item_id), int(token)))
        return out


M = TypeVar("M", bound=Member)


@dataclass
class Fleet(Generic[M]):
    """The worker slots, each running its latest member, and every member so far."""

    member: type[M]
    module: str
    spec: dict[str, Any]
    directory: Path
    processes: list[Worker]
    files: contextlib.ExitStack
    current: dict[int, M] = field(default_factory=dict)
    history: list[M] = field(default_factory=list)

    async def start(self, slot: int) -> M:
        """A new process in ``slot``; it becomes ``running`` once it has opened the queue."""
        number = len(self.history)
        name = f"{self.member.prefix}{slot}-{number}"
        log = self.directory / f"{name}.log"
        err = self.directory / f"{name}.err"
        stderr: IO[bytes] = self.files.enter_context(err.open("wb"))
        spec = {**self.spec, "worker_id": name, "log": str(log)}
        worker = await spawn(self.processes, self.module, spec, stderr=stderr)
        # Started without waiting: the kills go on while a replacement boots.
        ready = asyncio.create_task(worker.expect("ready", 60))
        member = self.member(slot, number, worker, log, err, ready)
        self.current[slot] = member
        self.history.append(member)
        return member

    async def start_all(self, slots: int) -> None:
        """``slots`` processes, each ready."""
        for slot in range(slots):
            await self.start(slot)
        await asyncio.wait_for(asyncio.gather(*(m.ready for m in self.history)), 60)

    def running(self) -> list[M]:
        return [m for m in self.current.values() if m.running]

    def failure(self, member: M) -> str:
        code = member.worker.process.returncode
        return f"worker {member.name} exited {code}:\n{member.err.read_text()[-3000:]}"

    def check(self) -> None:
        """Fail at once on a process that crashed by itself or never got ready."""
        for member in self.current.values():
            code = member.worker.process.returncode
            failed_start = member.ready.done() and member.ready.exception() is not None
            if code not in (None, 0) or failed_start:
                raise AssertionError(self.failure(member))

    async def turns(
        self, view: BaseWorkQueue, rng: random.Random, every: tuple[float, float], seed: int
    ) -> AsyncIterator[int]:
        """Turn 1, 2, ... every ``every`` seconds (drawn), until nothing is queued or leased;
        fails on a crashed process and after ``TIME_LIMIT`` seconds of draining."""
        began = time.monotonic()
        turn = 0
        while True:
            await asyncio.sleep(rng.uniform(*every))
            self.check()
            stats = await view.stats()
            if stats.queued == 0 and stats.leased == 0:
                return
            elapsed = time.monotonic() - began
            assert elapsed < TIME_LIMIT, f"not drained after {elapsed:.0f} s: {stats} (seed {seed})"
            turn += 1
            yield turn

    async def kill(self, member: M) -> None:
        """SIGKILL ``member`` and start a new process in its slot."""
        member.worker.process.kill()
        await member.worker.process.wait()
        member.killed = True
        await self.start(member.slot)

    async def freeze(
        self,
        member: M,
        view: BaseWorkQueue,
        held: Callable[[M], Awaitable[tuple[Key, int] | None]],
    ) -> tuple[Key, int] | None:
        """SIGSTOP ``member`` until another worker has reclaimed the item of the lease
        ``held(member)`` names (read while it cannot write), then SIGCONT. Returns that
        lease, also kept in ``member.frozen``; ``None`` when there was none to take over
        (``held`` found nothing, or the item's own ack landed just before the stop)."""
        member.worker.process.send_signal(signal.SIGSTOP)
        try:
            lease = await held(member)
            if lease is None:
                return None
            key, _ = lease
            record = await view.get_item(*key)
            assert record is not None
            attempts = record.attempts
            deadline = time.monotonic() + TAKEOVER_WAIT
            while record is not None and record.attempts <= attempts:
                if record.status == ItemStatus.DONE:
                    return None
                assert time.monotonic() < deadline, f"{key} not reclaimed: {record}"
                await asyncio.sleep(0.1)
                record = await view.get_item(*key)
            member.frozen.append(lease)
            return lease
        finally:
            member.worker.process.send_signal(signal.SIGCONT)

    async def until(self, done: Callable[[], bool], what: str) -> None:
        """Poll ``done`` until it holds, for ``TAKEOVER_WAIT`` seconds at most."""
        deadline = time.monotonic() + TAKEOVER_WAIT
        while not done():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)

    async def finish(self) -> None:
        """Wait for every current process to drain and exit 0 by itself."""
        for member in self.current.values():
            try:
                await asyncio.wait_for(asyncio.shield(member.ready), 60)
                await member.worker.expect("done", 60)
            except AssertionError:
                await member.worker.process.wait()
                raise AssertionError(self.failure(member)) from None
            code = await asyncio.wait_for(member.worker.process.wait(), 30)
            assert code == 0, self.failure(member)


@contextlib.asynccontextmanager
async def fleet_of(
    member: type[M], module: str, spec: dict[str, Any], directory: Path
) -> AsyncIterator[Fleet[M]]:
    """A fleet of ``python -m module`` processes; every one is reaped at the end."""
    processes: list[Worker] = []
    with contextlib.ExitStack() as files:
        fleet = Fleet(member, module, spec, directory, processes, files)
        try:
            yield fleet
        finally:
            await reap_all(processes)
            for started in fleet.history:
                started.ready.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await started.ready
