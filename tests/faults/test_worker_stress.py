"""The worker stress lane: several Workers on one queue, tiny leases, handlers that hold the
CPU, hang or raise ``BaseException``s, workers stopped at random moments and SIGKILLed.

Per backing (memory, Redis, PostgreSQL): a few hundred items over four tenants are
drained by Workers in this process (two or three slots, each stopped now and then
with a random grace period, from none to a second, and replaced) and, on the servers,
by Worker processes (``_stress_worker.py``) SIGKILLed at random and replaced. Every
handler runs :func:`tests.faults._stress_worker.behave`: leases of 0.6 s, CPU-bound
stretches (some past the lease), hangs of seconds, ``Abort`` (a ``BaseException``)
and ``RuntimeError``, drawn from the seed per item and attempt.

Then the audit, from the server and the workers' own records: every item is done and
nothing queued, leased or dead; each item was acked exactly once (an item with no
recorded ack was in flight in a killed process), with the newest token any worker
held for it; no token was issued twice; after each in-process ``stop()`` returned,
every lease that worker held had been settled or found lost, and none of its tokens
(but those it found expired) still holds its item (a heartbeat with it is refused);
and sampled every few milliseconds, ``in_flight`` was never below the number of that
worker's handlers running. The seed is printed; ``STATEPACT_WORKER_STRESS_SEED=<seed>``
replays the same draws (the timing, not being seeded, still varies).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from statepact.errors import LeaseLostError
from statepact.models import WorkItem
from statepact.queue import BaseWorkQueue, QueuePolicy, WorkQueue
from statepact.storage.memory import MemoryWorkQueue
from statepact.worker import Job, Worker, WorkerHooks
from tests.faults._stress_worker import (
    CONCURRENCY,
    HEARTBEAT,
    LEASE,
    POLICY,
    REAP,
    Abort,
    behave,
)
from tests.faults.conftest import FaultFigures
from tests.integration._fleet import (
    Fleet,
    Key,
    Member,
    assert_all_done,
    assert_issued_once,
    fleet_of,
    records_of,
)
from tests.integration._queue_worker import open_queue

pytestmark = [pytest.mark.faults, pytest.mark.slow]

MODULE = "tests.faults._stress_worker"
TENANTS = 4
ITEMS = {"memory": 250, "redis": 200, "postgres": 200}
IN_PROCESS = {"memory": 3, "redis": 2, "postgres": 2}
PROCESSES = {"memory": 0, "redis": 2, "postgres": 2}
MAX_KILLS = 5
MAX_STOPS = 8
TURN = (0.3, 0.7)  # seconds between two turns of the fault loop
TIME_LIMIT = 60.0  # seconds of draining per backing, whatever the machine's load
TERMINAL = ("acked", "lost", "failed", "released")


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def spec(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Where the workers open the queue: the lane's own servers, or nothing (memory)."""
    base = {"queue": "stress", "policy": POLICY, "pool_size": CONCURRENCY + 3}
    if request.param == "memory":
        yield {**base, "kind": "memory"}
    elif request.param == "postgres":
        yield {**base, "kind": "postgres", "url": request.getfixturevalue("fault_pg_url")}
    else:
        from statepact.testing.namespaces import clear_namespace_at
        from tests.fixtures.postgres import run_in_thread

        url: str = request.getfixturevalue("fault_redis_server").url
        namespace = f"sp-stress-{uuid.uuid4().hex[:10]}"
        yield {**base, "kind": "redis", "url": url, "namespace": namespace}
        run_in_thread(lambda: clear_namespace_at(url, namespace))


class Process(Member):
    """A ``_stress_worker.py`` process."""

    prefix = "p"

    def in_flight(self) -> set[Key]:
        """Items whose handler started here and that reached no terminal line."""
        open_: set[Key] = set()
        for kind, key, _ in self.entries():
            if kind in ("claim", "beat"):
                open_.add(key)
            elif kind in TERMINAL:
                open_.discard(key)
        return open_


@dataclass
class Ledger:
    """What every worker recorded: tokens held (claims, heartbeats) and acks landed, per item;
    and what went wrong, to assert on at the end."""

    tokens: dict[Key, list[int]] = field(default_factory=lambda: defaultdict(list))
    acked: dict[Key, list[int]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)
    running: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    aborts: int = 0
    lost: int = 0


class Audit(WorkerHooks):
    """One in-process worker's runs (one ``Job`` per lease) and what ended each."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.runs: list[Job] = []
        self.ends: dict[int, tuple[str, str]] = {}

    @staticmethod
    def key(job: Job) -> Key:
        return (job.item.tenant, job.item.item_id)

    def started(self, job: Job) -> None:
        self.runs.append(job)
        self.ledger.tokens[self.key(job)].append(job.lease.token)

    def renewed(self, job: Job) -> None:
        self.ledger.tokens[self.key(job)].append(job.lease.token)

    def succeeded(self, job: Job, item: WorkItem) -> None:
        self.ends[id(job)] = ("acked", "")
        self.ledger.acked[self.key(job)].append(job.lease.token)

    def failed(self, job: Job, item: WorkItem, error: str) -> None:
        self.ends[id(job)] = ("failed", error)

    def lease_lost(self, job: Job, reason: str) -> None:
        self.ends[id(job)] = ("lost", reason)
        self.ledger.lost += 1

    def released(self, job: Job, item: WorkItem) -> None:
        self.ends[id(job)] = ("released", "")


@dataclass
class Slot:
    """An in-process worker slot: its queue object and its current Worker."""

    number: int
    queue: WorkQueue
    worker: Worker
    audit: Audit
    generation: int = 0


class Lane:
    """The workers of one run, and how they are started, stopped and audited."""

    def __init__(
        self, seed: int, ledger: Ledger, view: WorkQueue, handler: Callable[[Job], Awaitable[None]]
    ) -> None:
        self.seed = seed
        self.ledger = ledger
        self.view = view
        self.handler = handler
        self.slots: list[Slot] = []
        self.stops = 0

    def worker(self, queue: WorkQueue, number: int, generation: int) -> tuple[Worker, Audit]:
        audit = Audit(self.ledger)
        worker = Worker(
            queue,
            default=self.handler,
            concurrency=CONCURRENCY,
            lease_for=LEASE,
            heartbeat_every=HEARTBEAT,
            reap_every=REAP,
            poll_interval=0.05,
            worker_id=f"in{number}-{generation}",
            hooks=audit,
        )
        return worker, audit

    async def add(self, queue: WorkQueue) -> None:
        number = len(self.slots)
        worker, audit = self.worker(queue, number, 0)
        self.slots.append(Slot(number, queue, worker, audit))
        await worker.start()

    async def stop(self, slot: Slot, grace: float, *, replace: bool) -> None:
        """Stop the slot's worker with ``grace``, audit what it left, start its successor."""
        worker, audit = slot.worker, slot.audit
        await worker.stop(grace_period=grace)
        self.stops += 1
        await self.audit_stopped(worker, audit)
        if replace:
            slot.generation += 1
            slot.worker, slot.audit = self.worker(slot.queue, slot.number, slot.generation)
            await slot.worker.start()

    async def audit_stopped(self, worker: Worker, audit: Audit) -> None:
        """Every lease the stopped worker held was settled or found lost, and none of its
        tokens holds its item now (but those it found expired, which the reaper moves)."""
        if worker.in_flight:
            self.ledger.problems.append(f"{worker.worker_id}: in_flight {worker.in_flight}")
        for job in audit.runs:
            end = audit.ends.get(id(job))
            if end is None:
                self.ledger.problems.append(
                    f"{worker.worker_id}: stop() returned with {Audit.key(job)} unsettled"
                )
                continue
            kind, reason = end
            if kind == "lost" and reason.startswith("lease expired"):
                continue
            try:
                await self.view.heartbeat(job.lease)
            except LeaseLostError:
                continue
            self.ledger.problems.append(
                f"{worker.worker_id}: {Audit.key(job)} still leased with token "
                f"{job.lease.token} after stop() ({kind})"
            )

    async def sample(self) -> None:
        """``in_flight`` against the handlers running, for each in-process worker, until
        cancelled."""
        ledger = self.ledger
        while True:
            for slot in self.slots:
                worker = slot.worker
                ledger.samples += 1
                running = ledger.running[worker.worker_id]
                if worker.in_flight < running:
                    ledger.problems.append(
                        f"{worker.worker_id}: in_flight {worker.in_flight} < {running} running"
                    )
            await asyncio.sleep(0.003)


@contextlib.asynccontextmanager
async def queue_for(spec: dict[str, Any], shared: MemoryWorkQueue | None) -> AsyncIterator[Any]:
    """A queue object of its own on the spec's server (the one memory queue on memory)."""
    if shared is not None:
        yield shared
        return
    queue, close = await open_queue(spec)
    try:
        yield queue
    finally:
        await close()


async def test_stressed_workers_ack_every_item_once_and_leave_nothing_leased(
    spec: dict[str, Any], tmp_path: Path, fault_figures: FaultFigures
) -> None:
    kind = spec["kind"]
    seed = int(os.environ.get("STATEPACT_WORKER_STRESS_SEED") or random.randrange(1 << 30))
    print(f"\nworker stress [{kind}]: seed {seed} (STATEPACT_WORKER_STRESS_SEED={seed} replays)")
    rng = random.Random(seed)
    ledger = Ledger()
    shared = (
        MemoryWorkQueue(policy=QueuePolicy(**POLICY), name=spec["queue"])
        if kind == "memory"
        else None
    )

    async def handler(job: Job) -> None:
        ledger.running[job.worker_id] += 1
        try:
            await behave(seed, job)
        except Abort:
            ledger.aborts += 1
            raise
        finally:
            ledger.running[job.worker_id] -= 1

    keys = [(f"t{n % TENANTS}", f"item-{n:04d}") for n in range(ITEMS[kind])]
    kills = 0
    cut: set[Key] = set()
    async with contextlib.AsyncExitStack() as stack:
        view: BaseWorkQueue = await stack.enter_async_context(queue_for(spec, shared))
        await view.enqueue_many([WorkItem(tenant=t, item_id=i) for t, i in keys])
        fleet: Fleet[Process] = await stack.enter_async_context(
            fleet_of(Process, MODULE, {**spec, "seed": seed}, tmp_path)
        )
        lane = Lane(seed, ledger, view, handler)
        began = time.monotonic()
        for _ in range(IN_PROCESS[kind]):
            await lane.add(await stack.enter_async_context(queue_for(spec, shared)))
        if PROCESSES[kind]:
            await fleet.start_all(PROCESSES[kind])
        sampler = asyncio.create_task(lane.sample())
        try:
            while True:
                await asyncio.sleep(rng.uniform(*TURN))
                fleet.check()
                stats = await view.stats()
                if stats.queued == 0 and stats.leased == 0:
                    break
                elapsed = time.monotonic() - began
                assert elapsed < TIME_LIMIT, f"not drained: {elapsed:.0f} s, {stats} (seed {seed})"
                action = rng.random()
                running = fleet.running()
                # The first turn with a process running kills one: a fast drain must not
                # end before the lane has SIGKILLed anything.
                if (kills == 0 or action < 0.35) and kills < MAX_KILLS and running:
                    busy = [p for p in running if p.in_flight()]
                    victim = rng.choice(busy or running)
                    cut |= victim.in_flight()
                    await fleet.kill(victim)
                    kills += 1
                elif action < 0.8 and lane.stops < MAX_STOPS:
                    grace = rng.choice([0.0, rng.uniform(0.0, 0.3), 1.0])
                    await lane.stop(rng.choice(lane.slots), grace, replace=True)
            for slot in lane.slots:
                await lane.stop(slot, 1.0, replace=False)
            await fleet.finish()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        drained_in = time.monotonic() - began
        records = await records_of(view, keys)
        stats = await view.stats()

    tokens, acked = ledger.tokens, ledger.acked
    for process in fleet.history:
        for entry, key, token in process.entries():
            if entry in ("claim", "beat"):
                tokens[key].append(token)
            elif entry == "acked":
                acked[key].append(token)
            elif entry == "lost":
                ledger.lost += 1
    reclaimed = sum(1 for r in records.values() if r is not None and r.attempts > 1)
    print(
        f"worker stress [{kind}]: {len(keys)} items, {IN_PROCESS[kind]} in-process slots "
        f"({lane.stops} stops) and {PROCESSES[kind]} processes ({len(fleet.history)} started, "
        f"{kills} SIGKILLs, {len(cut)} items cut off); {ledger.aborts} Aborts in-process, "
        f"{ledger.lost} leases lost, {reclaimed} items tried more than once; "
        f"{ledger.samples} in_flight samples; drained in {drained_in:.1f} s (seed {seed})"
    )
    fault_figures.outcome(
        "worker stress: stops, kills, aborts",
        kind,
        acknowledged=len(keys),
        found=sum(1 for r in records.values() if r is not None and r.status == "done"),
        faults=kills + lane.stops,
        seconds=drained_in,
        seed=seed,
        kills=kills,
        stops=lane.stops,
        lost_leases=ledger.lost,
        samples=ledger.samples,
    )

    assert ledger.problems == [], f"{ledger.problems[:5]} (seed {seed})"
    assert_all_done(records, stats)
    assert_issued_once(t for ts in tokens.values() for t in ts)
    twice = {key: ts for key, ts in acked.items() if len(ts) > 1}
    assert not twice, f"acked more than once: {twice} (seed {seed})"
    for key, (token,) in acked.items():
        assert token == max(tokens[key]), f"{key} acked with {token}: {tokens[key]} (seed {seed})"
    unlogged = set(keys) - set(acked)
    assert unlogged <= cut, f"done with no recorded ack: {sorted(unlogged - cut)[:5]} (seed {seed})"
    assert ledger.samples > 100 and lane.stops > 0
    assert ledger.lost > 0, "no lease was ever lost: the tiny leases proved nothing"
    if PROCESSES[kind]:
        assert kills > 0
