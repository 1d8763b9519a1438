"""The cancellation lane: ``asyncio.wait_for`` timeouts landing at random awaits of every
public call of the three protocols, then an audit of what they left behind.

Cancellation is how asyncio code times out, and a ``CancelledError`` may arrive at any
``await``. The scenario (written once, run on memory, Redis and PostgreSQL) runs
``WORKERS`` tasks that each make ``CALLS`` calls picked at random from every public
call of ``StateStore``, ``WorkQueue`` and ``TransactionManager`` (transactions with
locks, reads, writes and deletes, ``run``, explicit begin/commit/rollback, idempotent
commits, leases and fenced commits, history, the registry), each under a random
``wait_for`` timeout drawn between 0 and 1.5 times how long that kind of call takes,
so that cancellations land at every ``await`` inside it. Then, with nothing running:

- no connection is checked out of any pool (SQLAlchemy ``checkedout()``, redis-py's
  in-use connections), and no driver tore a connection down under a reply (the event
  loop reported no unretrieved error);
- nothing stays locked: a fresh transaction locks every key the scenario could have
  locked, at once (timeout 0);
- nothing stays leased beyond what the calls legitimately hold: once the clock is
  past every ``lease_for``/``ttl`` and ``reap`` ran, no work item is leased and every
  resource lease can be taken with a higher token than any seen;
- nothing is half-written: each run's counters moved together (a patch adds 1
  iteration, 2 input tokens and 1e-9 cost) and its version counts exactly its writes;
  every counter equals the acknowledged increments plus at most the cancelled ones;
  an idempotent commit retried after a cancel landed once; every queue item is in
  exactly one state, the one ``stats()`` counts it in, and every queued one is claimable.

The seed (``STATEPACT_CANCEL_SEED``) fixes each worker's calls and timeouts; the
interleaving with the server's replies is real time, so a replay reproduces the calls,
not necessarily the exact schedule. Figures go to ``fault_figures`` (docs/faults.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import (
    ConflictError,
    DeadlockError,
    FencingError,
    LeaseLostError,
    LockTimeoutError,
    StateConflictError,
)
from statepact.models import ItemStatus, Lease, RunRecord, SessionRecord, WorkItem
from statepact.queue import QueuePolicy, WorkQueue
from statepact.state import StateStore
from statepact.storage.memory import MemoryBackend, MemoryStateStore, MemoryWorkQueue
from statepact.tx import Lease as ResourceLease
from statepact.tx import LockMode, StorageBackend, Transaction, TransactionManager
from tests.faults._proxied import RESENDING, Proxied
from tests.faults.conftest import FaultFigures, lane_server

pytestmark = [pytest.mark.faults]

SEED = int(os.environ.get("STATEPACT_CANCEL_SEED", "20261210"))
WORKERS = 12
CALLS = 100
#: Connections per pool: fewer than WORKERS, as a pool sized below its callers is.
POOL_SIZE = 4
#: A call's wait_for timeout is drawn uniformly from [0, STRETCH x how long that kind of
#: call takes], so cancellations fall at every await of it (a commit's round trip as much
#: as its begin or its release), and some calls finish. MEASURED of the calls run without
#: a timeout and keep a moving average of how long each kind takes.
STRETCH = 1.5
MEASURED = 0.15
#: Of the other calls, AT_START get a timeout of 0: cancelled at their first await, before
#: they run a step. A call that finishes without suspending cannot be reached by a timeout
#: above 0 (its task's step runs before the timer's callback), and on memory most calls
#: never suspend (only lock waits and ``run``'s retries do, a handful of times a run), so
#: without these a run there could end with no call cancelled at all.
AT_START = 0.02
#: Until a kind of call has finished once, its duration is taken as this (seconds).
FIRST_GUESS = 0.005
TENANTS = ("acme", "globex", "initech")
RUNS = [(tenant, f"run-{n}") for tenant in TENANTS for n in range(4)]
SESSIONS = [(tenant, "s1") for tenant in TENANTS]
R = "orders"
COUNTERS = [f"k{n}" for n in range(16)]
LEASED = [f"job-{n}" for n in range(4)]
POLICY = QueuePolicy(max_attempts=3, backoff_base=1.0, backoff_cap=60.0)
LEASE_FOR = (5.0, 30.0)  # seconds, the range of lease_for and of resource lease ttl
PATCH_COST = Decimal("0.000000001")

# Errors a call may raise on purpose in this scenario; anything else fails the lane.
EXPECTED = (
    StateConflictError,
    ConflictError,
    LockTimeoutError,
    DeadlockError,
    LeaseLostError,
    FencingError,
)


# -- one backing, opened for one test ---------------------------------------------------------


@dataclass
class Stores:
    """The three protocols on one backing, with the pools they draw connections from."""

    name: str
    clock: ManualClock
    state: StateStore
    queue: WorkQueue
    backend: StorageBackend
    manager: TransactionManager
    in_use: Callable[[], dict[str, int]]
    #: What was opened for these stores, closed last first by :meth:`close`.
    opened: list[Callable[[], Awaitable[None]]]

    async def close(self) -> None:
        for close in reversed(self.opened):
            await close()


def _redis_in_use(client: Any) -> int:
    """Connections redis-py's pool has handed out and not got back."""
    counts = client.connection_pool.get_connection_count()
    return sum(n for n, attributes in counts if "used" in str(attributes).lower())


async def open_memory(clock: ManualClock) -> Stores:
    backend = MemoryBackend(clock=clock)
    return Stores(
        "memory",
        clock,
        MemoryStateStore(clock=clock),
        MemoryWorkQueue(clock=clock, policy=POLICY),
        backend,
        TransactionManager(backend),
        dict,
        [backend.close],
    )


async def open_redis(clock: ManualClock, port: int) -> Stores:
    from redis.asyncio import BlockingConnectionPool, Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from statepact.settings import RedisStoreSettings
    from statepact.storage.redis import RedisBackend, RedisStateStore, RedisWorkQueue

    tag = f"cx{uuid.uuid4().hex[:8]}"
    settings = RedisStoreSettings(namespace=tag, tx_prefix=tag, durable=False)
    # Fewer connections than workers: calls queue for one, so a cancel also lands there.
    pool = BlockingConnectionPool(
        host="127.0.0.1",
        port=port,
        max_connections=POOL_SIZE,
        timeout=10.0,
        socket_timeout=5.0,
        socket_connect_timeout=5.0,
        retry=Retry(NoBackoff(), 0),
    )
    client = Redis.from_pool(pool)
    backend = RedisBackend(client, clock=clock, settings=settings)
    return Stores(
        "redis",
        clock,
        RedisStateStore(client, clock=clock, settings=settings),
        RedisWorkQueue(client, clock=clock, settings=settings, policy=POLICY),
        backend,
        TransactionManager(backend),
        lambda: {"redis": _redis_in_use(client)},
        [client.aclose, backend.close],
    )


async def open_postgres(clock: ManualClock, url: str) -> Stores:
    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import PostgresBackend, PostgresStateStore, PostgresWorkQueue
    from statepact.storage.postgres._engine import create_engine

    # Fewer connections than workers: calls queue for one, so a cancel also lands there.
    settings = PostgresStoreSettings(dsn=url, pool_size=POOL_SIZE, pool_timeout=10.0)
    engine = create_engine(settings, connect_args={"timeout": 5.0, "command_timeout": 10.0})
    backend = await PostgresBackend.connect(
        url, clock=clock, max_size=POOL_SIZE, create_schema=False
    )
    return Stores(
        "postgres",
        clock,
        PostgresStateStore(engine, clock=clock, settings=settings),
        PostgresWorkQueue(engine, clock=clock, settings=settings, policy=POLICY),
        backend,
        TransactionManager(backend),
        lambda: {
            "state+queue engine": engine.sync_engine.pool.checkedout(),
            "backend engine": backend.engine.sync_engine.pool.checkedout(),
        },
        [engine.dispose, backend.close],
    )


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def backing(request: pytest.FixtureRequest) -> tuple[str, int, str]:
    """Which backing, and where its server is (the lane's own servers)."""
    if request.param == "memory":
        return "memory", 0, ""
    return request.param, *lane_server(request, request.param)


@pytest.fixture
async def stores(backing: tuple[str, int, str], clock: ManualClock) -> AsyncIterator[Stores]:
    kind, port, url = backing
    if kind == "redis":
        opened = await open_redis(clock, port)
    elif kind == "postgres":
        opened = await open_postgres(clock, url)
    else:
        opened = await open_memory(clock)
    try:
        yield opened
    finally:
        await opened.close()


# -- what the calls were told ---------------------------------------------------------------------


@dataclass
class Ledger:
    """What every call was acknowledged, and what was cancelled with its outcome unknown."""

    calls: Counter[str] = field(default_factory=Counter)
    cancelled: Counter[str] = field(default_factory=Counter)
    acked: Counter[Any] = field(default_factory=Counter)
    ambiguous: Counter[Any] = field(default_factory=Counter)
    enqueued: set[tuple[str, str]] = field(default_factory=set)
    maybe_enqueued: set[tuple[str, str]] = field(default_factory=set)
    idempotent: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    took: dict[str, float] = field(default_factory=dict)
    retried: int = 0

    def token(self, lease: ResourceLease) -> None:
        self.tokens[lease.resource] = max(self.tokens.get(lease.resource, 0), lease.token)


class Worker:
    """One task of the scenario: its own random stream, its leases, its item numbers."""

    def __init__(self, number: int, stores: Stores, ledger: Ledger) -> None:
        self.number = number
        self.name = f"w{number}"
        self.rng = random.Random(f"{SEED}-{number}")
        self.s = stores
        self.ledger = ledger
        self.leases: list[Lease] = []
        self.resource_leases: list[ResourceLease] = []
        self.items = 0

    async def call(self, name: str, work: Callable[[], Awaitable[Any]]) -> tuple[bool, Any]:
        """``work()`` under a random wait_for: ``(True, result)``, or ``(False, None)`` when it
        was cancelled or refused on purpose."""
        self.ledger.calls[name] += 1
        # Some calls run uncancelled: they measure how long this kind of call takes.
        measure = self.rng.random() < MEASURED
        limit = STRETCH * self.ledger.took.get(name, FIRST_GUESS)
        if measure:
            timeout = None
        elif self.rng.random() < AT_START:
            timeout = 0.0
        else:
            timeout = self.rng.uniform(0.0, limit)
        began = time.monotonic()
        try:
            result = await asyncio.wait_for(work(), timeout)
        except TimeoutError:
            self.ledger.cancelled[name] += 1
            return False, None
        except EXPECTED:
            return False, None
        except ValueError as exc:
            # Requeueing an item another worker requeued first is refused on purpose.
            if name != "requeue" or "only a dead item" not in str(exc):
                raise
            return False, None
        if measure:
            took = time.monotonic() - began
            self.ledger.took[name] = 0.7 * self.ledger.took.get(name, took) + 0.3 * took
        return True, result

    async def write_call(
        self, name: str, key: Any, work: Callable[[], Awaitable[Any]]
    ) -> tuple[bool, Any]:
        """A call that adds one to ``key``'s count: acknowledged, or ambiguous if cancelled."""
        cancelled = self.ledger.cancelled[name]
        done, result = await self.call(name, work)
        if done:
            self.ledger.acked[key] += 1
        elif self.ledger.cancelled[name] > cancelled:
            self.ledger.ambiguous[key] += 1
        return done, result

    # -- StateStore ----------------------------------------------------------------------------

    async def patch_run(self) -> None:
        tenant, run_id = self.rng.choice(RUNS)
        await self.write_call(
            "patch_run",
            ("patch", tenant, run_id),
            lambda: self.s.state.patch_run(
                tenant, run_id, iterations=1, input_tokens=2, cost=PATCH_COST
            ),
        )

    async def put_run(self) -> None:
        tenant, run_id = self.rng.choice(RUNS)
        current = await self.s.state.get_run(tenant, run_id)
        assert current is not None
        update = {"data": {**current.data, "puts": current.data.get("puts", 0) + 1}}
        await self.write_call(
            "put_run",
            ("put", tenant, run_id),
            lambda: self.s.state.put_run(current.model_copy(update=update)),
        )

    async def scratch_run(self) -> None:
        tenant = self.rng.choice(TENANTS)
        run_id = f"scratch-{self.name}-{self.rng.randrange(3)}"
        found = await self.s.state.get_run(tenant, run_id)
        if found is None:
            record = RunRecord(tenant=tenant, run_id=run_id, session_id="s1")
            await self.call("put_run", lambda: self.s.state.put_run(record))
        else:
            await self.call("delete_run", lambda: self.s.state.delete_run(tenant, run_id))

    async def read_state(self) -> None:
        tenant, run_id = self.rng.choice(RUNS)
        which = self.rng.randrange(4)
        if which == 0:
            await self.call("get_run", lambda: self.s.state.get_run(tenant, run_id))
        elif which == 1:
            await self.call(
                "list_runs",
                lambda: self.s.state.list_runs(
                    tenant, session_id=self.rng.choice([None, "s1"]), limit=3
                ),
            )
        elif which == 2:
            await self.call("get_session", lambda: self.s.state.get_session(tenant, "s1"))
        else:
            await self.call("list_sessions", lambda: self.s.state.list_sessions(tenant, limit=2))

    async def put_session(self) -> None:
        tenant, session_id = self.rng.choice(SESSIONS)
        current = await self.s.state.get_session(tenant, session_id)
        assert current is not None
        await self.call(
            "put_session",
            lambda: self.s.state.put_session(
                current.model_copy(update={"data": {"by": self.name}})
            ),
        )

    # -- WorkQueue ------------------------------------------------------------------------------

    def lease_for(self) -> float:
        return self.rng.uniform(*LEASE_FOR)

    async def enqueue(self) -> None:
        self.items += 1
        item = WorkItem(
            tenant=self.rng.choice(TENANTS), item_id=f"{self.name}-{self.items}", payload={}
        )
        slot = (item.tenant, item.item_id)
        self.ledger.maybe_enqueued.add(slot)
        delay = self.rng.choice([None, None, 1.0])
        done, _ = await self.call("enqueue", lambda: self.s.queue.enqueue(item, delay=delay))
        if done:
            self.ledger.enqueued.add(slot)

    async def claim(self) -> None:
        if self.rng.random() < 0.5:
            done, lease = await self.call(
                "claim", lambda: self.s.queue.claim(self.name, lease_for=self.lease_for())
            )
            if done and lease is not None:
                self.leases.append(lease)
        else:
            done, leases = await self.call(
                "claim_batch",
                lambda: self.s.queue.claim_batch(self.name, lease_for=self.lease_for(), limit=3),
            )
            if done:
                self.leases.extend(leases)

    async def settle(self) -> None:
        if not self.leases:
            await self.claim()
            return
        lease = self.rng.choice(self.leases)
        how = self.rng.choice(["heartbeat", "ack", "fail", "release"])
        queue = self.s.queue
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "heartbeat": lambda: queue.heartbeat(lease),
            "ack": lambda: queue.ack(lease),
            "fail": lambda: queue.fail(lease, "boom", retryable=self.rng.random() < 0.8),
            "release": lambda: queue.release(lease),
        }
        done, result = await self.call(how, calls[how])
        if done:
            self.leases.remove(lease)
            if how == "heartbeat":
                self.leases.append(result)

    async def inspect_queue(self) -> None:
        queue = self.s.queue
        tenant = self.rng.choice(TENANTS)
        which = self.rng.randrange(5)
        if which == 0:
            await self.call("reap", queue.reap)
        elif which == 1:
            await self.call("stats", queue.stats)
        elif which == 2:
            item_id = f"{self.name}-{self.rng.randint(1, max(1, self.items))}"
            await self.call("get_item", lambda: queue.get_item(tenant, item_id))
        else:
            done, dead = await self.call("dead_letters", lambda: queue.dead_letters(tenant))
            if done and dead:
                await self.call("requeue", lambda: queue.requeue(self.rng.choice(dead)))

    # -- TransactionManager -----------------------------------------------------------------------

    async def increment(self, tx: Transaction, key: str) -> None:
        await tx.lock(R, key, timeout=0.05)
        await asyncio.sleep(0)  # the caller's own awaits inside the transaction
        tx.write(R, key, (await tx.read(R, key) or 0) + 1)

    async def tx_run(self) -> None:
        key = self.rng.choice(COUNTERS)
        await self.write_call(
            "manager.run",
            ("counter", key),
            lambda: self.s.manager.run(lambda tx: self.increment(tx, key), retries=3),
        )

    async def tx_explicit(self) -> None:
        key = self.rng.choice(COUNTERS)
        abandon = self.rng.random() < 0.3

        async def explicit() -> None:
            tx = await self.s.manager.begin(self.rng.choice(["read_committed", "serializable"]))
            try:
                await self.increment(tx, key)
                tx.delete(R, f"scratch-{self.name}")
                if abandon:
                    await tx.rollback()
                else:
                    await tx.commit()
            except BaseException:
                await tx.rollback()
                raise

        if abandon:
            await self.call("begin+rollback", explicit)
        else:
            await self.write_call("begin+commit", ("counter", key), explicit)

    async def tx_idempotent(self) -> None:
        key = f"idem-{self.name}-{len(self.ledger.idempotent)}-{self.rng.randrange(10**6)}"

        async def commit() -> Any:
            async with self.s.manager.transaction(idempotency_key=key) as tx:
                tx.write(R, key, {"by": self.name})
            return tx.result

        done, _ = await self.call("idempotent commit", commit)
        if not done:
            # What a caller does after a cancel: send the same change again, uncancelled.
            # It replays if the first one landed, and applies once if it did not.
            await commit()
            self.ledger.retried += 1
        self.ledger.idempotent.append(key)

    async def resource_lease(self) -> None:
        manager = self.s.manager
        which = self.rng.randrange(4)
        if which == 0 or not self.resource_leases:
            resource = self.rng.choice(LEASED)
            ttl = self.lease_for()
            done, lease = await self.call(
                "acquire_lease", lambda: manager.acquire_lease(resource, self.name, ttl)
            )
            if done and lease is not None:
                self.ledger.token(lease)
                self.resource_leases.append(lease)
            return
        lease = self.rng.choice(self.resource_leases)
        if which == 1:
            done, renewed = await self.call("renew_lease", lambda: manager.renew_lease(lease))
            if done:
                self.resource_leases[self.resource_leases.index(lease)] = renewed
        elif which == 2:
            done, _ = await self.call("release_lease", lambda: manager.release_lease(lease))
            if done:
                self.resource_leases.remove(lease)
        else:

            async def fenced() -> None:
                async with manager.transaction(fencing=lease) as tx:
                    tx.write(R, f"fenced-{lease.resource}", {"token": lease.token})

            await self.call("fenced commit", fenced)

    async def tx_inspect(self) -> None:
        manager = self.s.manager
        which = self.rng.randrange(4)
        if which == 0:
            await self.call("history", lambda: manager.history(R, self.rng.choice(COUNTERS), 5))
        elif which == 1:
            await self.call(
                "register_resource",
                lambda: manager.register_resource(R, {"by": self.name}),
            )
        elif which == 2:
            await self.call("resource_info", lambda: manager.resource_info(R))
        else:
            await self.call("health_check", manager.health_check)

    async def run(self) -> None:
        steps: list[tuple[Callable[[], Awaitable[None]], int]] = [
            (self.patch_run, 4),
            (self.put_run, 2),
            (self.scratch_run, 1),
            (self.read_state, 2),
            (self.put_session, 1),
            (self.enqueue, 3),
            (self.claim, 2),
            (self.settle, 3),
            (self.inspect_queue, 1),
            (self.tx_run, 4),
            (self.tx_explicit, 2),
            (self.tx_idempotent, 1),
            (self.resource_lease, 2),
            (self.tx_inspect, 1),
        ]
        functions = [f for f, _ in steps]
        weights = [w for _, w in steps]
        for _ in range(CALLS):
            await self.rng.choices(functions, weights)[0]()


# -- the audit ------------------------------------------------------------------------------------


async def seed(stores: Stores) -> None:
    for tenant, session_id in SESSIONS:
        await stores.state.put_session(SessionRecord(tenant=tenant, session_id=session_id))
    for tenant, run_id in RUNS:
        await stores.state.put_run(RunRecord(tenant=tenant, run_id=run_id, session_id="s1"))


async def locked_keys(manager: TransactionManager) -> list[str]:
    """Keys a fresh transaction cannot lock at once (timeout 0)."""
    keys = [*COUNTERS, *(f"scratch-w{n}" for n in range(WORKERS))]
    stuck = []
    probe = await manager.begin()
    try:
        for key in keys:
            try:
                await probe.lock(R, key, timeout=0)
            except LockTimeoutError:
                stuck.append(key)
    finally:
        await probe.rollback()
    return stuck


async def audit_state(stores: Stores, ledger: Ledger) -> tuple[int, int, int]:
    """Each run whole and counted right; returns (acknowledged, found, ambiguous) writes."""
    acked = found = ambiguous = 0
    for tenant, run_id in RUNS:
        run = await stores.state.get_run(tenant, run_id)
        assert run is not None, f"{tenant}/{run_id} vanished"
        patches, puts = ("patch", tenant, run_id), ("put", tenant, run_id)
        stored_puts = int(run.data.get("puts", 0))
        # Whole patches: the three counters of one patch moved together.
        assert run.input_tokens == 2 * run.iterations, run
        assert run.cost == run.iterations * PATCH_COST, run
        # Whole writes: every version is one landed put or patch, nothing half-applied.
        assert run.version == 1 + run.iterations + stored_puts, run
        for key, stored in ((patches, run.iterations), (puts, stored_puts)):
            low, high = ledger.acked[key], ledger.acked[key] + ledger.ambiguous[key]
            assert low <= stored <= high, f"{key}: {stored} not within [{low}, {high}]"
            acked, found, ambiguous = (
                acked + ledger.acked[key],
                found + stored,
                ambiguous + ledger.ambiguous[key],
            )
    for tenant in TENANTS:
        listed = {r.run_id for r in (await stores.state.list_runs(tenant, limit=1000)).items}
        in_session = {
            r.run_id
            for r in (await stores.state.list_runs(tenant, session_id="s1", limit=1000)).items
        }
        scratch = {f"scratch-w{n}-{i}" for n in range(WORKERS) for i in range(3)}
        present = {run_id for t, run_id in RUNS if t == tenant}
        for run_id in scratch:
            if await stores.state.get_run(tenant, run_id) is not None:
                present.add(run_id)
        assert listed == present == in_session, (tenant, listed ^ present, in_session ^ present)
    return acked, found, ambiguous


async def audit_transactions(stores: Stores, ledger: Ledger) -> tuple[int, int, int]:
    acked = found = ambiguous = 0
    manager = stores.manager
    async with manager.transaction() as tx:
        for key in COUNTERS:
            value = await tx.read(R, key) or 0
            low = ledger.acked[("counter", key)]
            high = low + ledger.ambiguous[("counter", key)]
            assert low <= value <= high, f"counter {key}: {value} not within [{low}, {high}]"
            acked, found, ambiguous = (
                acked + low,
                found + value,
                ambiguous + ledger.ambiguous[("counter", key)],
            )
        for key in ledger.idempotent:
            assert await tx.read(R, key) is not None, f"idempotent commit {key} never landed"
    for key in ledger.idempotent:
        history = await manager.history(R, key)
        assert len(history) == 1, f"idempotent commit {key} landed {len(history)} times"
    return acked, found, ambiguous


async def audit_leases(stores: Stores, ledger: Ledger) -> int:
    """Past every ttl, each resource lease can be taken with a higher token; returns how many
    resources were still held by a live lease (must be 0)."""
    held = 0
    for resource in LEASED:
        lease = await stores.manager.acquire_lease(resource, "auditor", 10)
        if lease is None:
            held += 1
            continue
        assert lease.token > ledger.tokens.get(resource, 0), (resource, lease, ledger.tokens)
        assert await stores.manager.release_lease(lease)
    return held


async def audit_queue(stores: Stores, ledger: Ledger) -> tuple[int, int, int]:
    """Every item in exactly one state, the one stats() counts; returns (acknowledged enqueues,
    found among them, ambiguous enqueues) and checks nothing is leased."""
    queue = stores.queue
    while await queue.reap():
        pass
    by_status: Counter[tuple[str, str]] = Counter()
    found = 0
    for tenant, item_id in sorted(ledger.maybe_enqueued):
        item = await queue.get_item(tenant, item_id)
        if item is None:
            assert (tenant, item_id) not in ledger.enqueued, f"acknowledged {item_id} vanished"
            continue
        found += (tenant, item_id) in ledger.enqueued
        assert item.status in (ItemStatus.QUEUED, ItemStatus.DONE, ItemStatus.DEAD), item
        by_status[(tenant, item.status.value)] += 1
    stats = await queue.stats()
    assert stats.leased == 0, stats
    for tenant in TENANTS:
        counted = stats.tenants.get(tenant)
        queued = 0 if counted is None else counted.queued
        dead = 0 if counted is None else counted.dead
        assert (queued, dead) == (by_status[(tenant, "queued")], by_status[(tenant, "dead")]), (
            tenant,
            counted,
            by_status,
        )
    claimed = []
    while batch := await queue.claim_batch("auditor", lease_for=30, limit=100):
        claimed.extend(batch)
    assert len(claimed) == stats.queued, (len(claimed), stats)
    for lease in claimed:
        await queue.ack(lease)
    after = await queue.stats()
    assert (after.queued, after.leased) == (0, 0), after
    ambiguous = len(ledger.maybe_enqueued - ledger.enqueued)
    return len(ledger.enqueued), found, ambiguous


async def test_cancelled_calls_leave_nothing_behind(
    stores: Stores, fault_figures: FaultFigures
) -> None:
    """Every public call of the three protocols, cancelled at random awaits by wait_for,
    leaves no lock, lease, connection or half-written record behind."""
    await seed(stores)
    ledger = Ledger()
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    began = time.monotonic()
    try:
        await asyncio.gather(*(Worker(n, stores, ledger).run() for n in range(WORKERS)))
        await asyncio.sleep(0.05)  # let what the calls left scheduled run (and report)
    finally:
        loop.set_exception_handler(previous)
    seconds = time.monotonic() - began
    where = f"seed {SEED} on {stores.name}"
    # A request in flight is answered, never torn down under the driver: asyncpg reports
    # "unexpected connection_lost()" futures nobody retrieved when it is.
    assert not reported, f"{where}: the loop reported {[c.get('message') for c in reported]}"

    # Connections first: nothing may still be out of the pool once every call has returned.
    in_use = stores.in_use()
    assert not any(in_use.values()), f"{where}: connections still checked out: {in_use}"
    stuck = await locked_keys(stores.manager)
    assert not stuck, f"{where}: keys still locked after the calls ended: {stuck}"
    state = await audit_state(stores, ledger)
    txs = await audit_transactions(stores, ledger)
    # Past every lease_for and ttl (and every retry backoff): only expiry holds anything now.
    stores.clock.advance(3600)
    held = await audit_leases(stores, ledger)
    assert held == 0, f"{where}: {held} resource leases still held past their ttl"
    items = await audit_queue(stores, ledger)
    in_use = stores.in_use()
    assert not any(in_use.values()), f"{where}: connections checked out after the audit: {in_use}"
    assert sum(ledger.cancelled.values()) > 0, f"{where}: no call was cancelled"

    fault_figures.outcome(
        "cancellation: wait_for over every call",
        stores.name,
        acknowledged=state[0] + txs[0] + items[0],
        found=state[1] + txs[1] + items[1],
        ambiguous=state[2] + txs[2] + items[2],
        faults=sum(ledger.cancelled.values()),
        seconds=seconds,
        seed=SEED,
        calls=sum(ledger.calls.values()),
        cancelled=sum(ledger.cancelled.values()),
        locks_left=len(stuck),
        leases_left=held,
        connections_left=sum(in_use.values()),
        idempotent_commits=len(ledger.idempotent),
        idempotent_retries=ledger.retried,
    )


# -- a backing's own bookkeeping, when the release itself is cancelled ---------------------------


@pytest.mark.integration
async def test_an_end_cancelled_before_its_unlock_went_out_can_be_repeated(
    proxied: Proxied,
) -> None:
    """``end`` cancelled while it waits out a failover (the unlock never reached the server)
    keeps the transaction's lock bookkeeping, so the next ``end`` releases the locks; before,
    the bookkeeping was dropped first and the keys stayed locked for lock_ttl_seconds."""
    # A budget the poll below cannot outlast: with three attempts and a jittered delay of a
    # millisecond, end() could give up (and forget its keys) before the cancel landed.
    through, direct, proxy = proxied.backend(RESENDING), proxied.backend(), proxied.proxy
    await through.begin("t1")
    assert await through.try_lock("t1", R, "o1", LockMode.EXCLUSIVE, 0)
    proxy.refuse()
    proxy.cut()
    refused = proxy.stats.refused
    ending = asyncio.ensure_future(through.end("t1"))
    # The proxy counts, it does not signal: poll until end's first attempt was refused.
    while proxy.stats.refused == refused and not ending.done():  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    ending.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ending
    proxy.heal()
    # Still held: the unlock never went out.
    assert not await direct.try_lock("probe", R, "o1", LockMode.EXCLUSIVE, 0)
    await through.end("t1")
    assert await direct.try_lock("probe", R, "o1", LockMode.EXCLUSIVE, 0)
    await direct.end("probe")
