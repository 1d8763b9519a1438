"""Durable servers SIGKILLed and restarted under load: nothing acknowledged is lost or doubled.

For each backing, a durable server the test owns (Redis with ``appendonly yes``
and ``appendfsync always``; PostgreSQL with ``fsync`` and ``synchronous_commit``
on) is killed with SIGKILL and started again on the same port and data, several
times, while workers:

- create runs (``put_run`` at version 0) and patch shared counters;
- commit transactions with idempotency keys, retrying a failed commit with the
  same key until it is acknowledged;
- take and give up a lease on one resource, again and again;
- drain a queue (claim, ack) while a reaper runs.

Afterwards: every acknowledged run exists; every counter satisfies
``acknowledged <= found <= acknowledged + ambiguous`` (a patch that errored
may or may not have landed). On PostgreSQL a patch carries a call id and the
failover resends it safely, so a counter equals its acknowledged patches
(``found == acknowledged``); only a patch that exhausted the whole failover
budget is ambiguous there, counted apart, and keeps the bound. Every
acknowledged commit is there, once (one version in its history); every queue
item is done exactly once or still pending, and none was acknowledged twice;
lease tokens only went up.

Every loop is bounded in steps and the whole run in time (well under 60 s per
backing). Each target is one ``open_backing`` on the server; its clock is a
``ManualClock`` that stands still during the faults (so no queue lease lapses
under a live worker) and is moved on at the end to let ``reap`` return what lost
acks left leased.

And a Redis that forgets: with RDB snapshots only (``appendonly no``, ``save
"3600 1"``, which ``preflight()`` refuses), a SIGKILL loses every write since
the last snapshot. Fencing must survive even that: a lease token or a queue
lease token issued before the crash and forgotten by it is never issued again,
so its holder is fenced instead of settling or committing over the next one.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.errors import FencingError, LeaseLostError, StatepactError
from statepact.models import ItemStatus, RunRecord, WorkItem
from statepact.queue import QueuePolicy, WorkQueue
from statepact.settings import PostgresStoreSettings, RedisStoreSettings
from statepact.state import StateStore
from statepact.storage import Backing
from statepact.storage.postgres import create_engine
from statepact.storage.postgres import open_backing as open_postgres
from statepact.storage.redis import RedisBackend, RedisWorkQueue
from statepact.storage.redis import open_backing as open_redis
from statepact.testing.plugin import PostgresServerFactory, RedisServerFactory
from statepact.tx import TransactionManager
from tests.faults.conftest import FaultFigure, FaultFigures, fault_redis_client, need_local

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]

WORKLOAD_SECONDS = 8.0
KILLS = 4
ITEMS = 300
TENANTS = ("acme", "globex", "initech")
COUNTERS = 6
# Enough to ride out a restart; a call that still fails is counted as ambiguous.
FAILOVER = RetryPolicy(attempts=10, base_delay=0.05, max_delay=0.5)
POLICY = QueuePolicy(max_attempts=50)


@dataclass
class Target:
    """One backing under test: its stores, and how to crash and restart its server."""

    name: str
    state: StateStore
    queue: WorkQueue
    clock: ManualClock
    manager: TransactionManager
    crash: Callable[[], Awaitable[float]]
    """SIGKILL the server, start it again; returns the seconds it was down."""
    resends_writes: bool = False
    """Whether a state write cut mid-call is resent by the failover and applied once: then
    only a call that exhausted the budget may have landed without being acknowledged."""


def _target(
    name: str,
    backing: Backing[Any, Any, Any],
    clock: ManualClock,
    crash: Callable[[], Awaitable[float]],
    *,
    resends_writes: bool = False,
) -> Target:
    return Target(
        name=name,
        state=backing.state,
        queue=backing.queue,
        clock=clock,
        manager=backing.manager,
        crash=crash,
        resends_writes=resends_writes,
    )


@dataclass
class Tally:
    """What the workers were told, and what they could not be told."""

    created: list[tuple[str, str]] = field(default_factory=list)
    create_ambiguous: int = 0
    patches: Counter[str] = field(default_factory=Counter)
    patch_ambiguous: Counter[str] = field(default_factory=Counter)
    patch_exhausted: Counter[str] = field(default_factory=Counter)
    """Patches that failed because the whole failover budget ran out (among the ambiguous)."""
    commits: dict[str, int] = field(default_factory=dict)
    commit_errors: int = 0
    replays: int = 0
    tokens: list[int] = field(default_factory=list)
    lease_errors: int = 0
    enqueued: list[tuple[str, str]] = field(default_factory=list)
    enqueue_unsure: list[tuple[str, str]] = field(default_factory=list)
    acks: Counter[str] = field(default_factory=Counter)
    ack_ambiguous: set[str] = field(default_factory=set)
    queue_errors: int = 0
    downtime: list[float] = field(default_factory=list)
    slowest: float = 0.0
    """The longest a state call took: at least a restart's length when a kill hit mid-call."""


def _exhausted_the_budget(exc: StatepactError) -> bool:
    """Whether a state call failed because the failover budget ran out (its messages say so)."""
    text = str(exc)
    return "stayed unreachable after" in text or "failover budget ran out" in text


async def _state_worker(target: Target, tally: Tally, number: int, stop: asyncio.Event) -> None:
    rng = random.Random(number)
    for step in range(10_000):
        if stop.is_set():
            return
        tenant = rng.choice(TENANTS)
        began = time.monotonic()
        if step % 3 == 0:
            run_id = f"s{number}-{step}"
            try:
                await target.state.put_run(RunRecord(tenant=tenant, run_id=run_id))
                tally.created.append((tenant, run_id))
            except StatepactError:
                tally.create_ambiguous += 1
        else:
            counter = f"counter-{rng.randrange(COUNTERS)}"
            try:
                await target.state.patch_run(TENANTS[0], counter, iterations=1, input_tokens=3)
                tally.patches[counter] += 1
            except StatepactError as exc:
                tally.patch_ambiguous[counter] += 1
                if _exhausted_the_budget(exc):
                    tally.patch_exhausted[counter] += 1
        tally.slowest = max(tally.slowest, time.monotonic() - began)
        await asyncio.sleep(0)


async def _commit_worker(target: Target, tally: Tally, number: int, stop: asyncio.Event) -> None:
    for step in range(10_000):
        if stop.is_set():
            return
        key = f"c{number}-{step}"
        # Retry the same idempotency key until acknowledged (bounded): a retry after an
        # ambiguous failure replays instead of applying again.
        for _attempt in range(20):
            try:
                async with target.manager.transaction(idempotency_key=key) as tx:
                    tx.write("commits", key, {"step": step})
            except StatepactError:
                tally.commit_errors += 1
                await asyncio.sleep(0.05)
                continue
            tally.commits[key] = step
            tally.replays += int(tx.result.replayed)
            break
        else:
            return


async def _lease_worker(target: Target, tally: Tally, stop: asyncio.Event) -> None:
    for _ in range(10_000):
        if stop.is_set():
            return
        try:
            lease = await target.manager.acquire_lease("fenced", "owner-1", 30)
        except StatepactError:
            tally.lease_errors += 1
            await asyncio.sleep(0.02)
            continue
        assert lease is not None, "the only owner was refused its own resource"
        tally.tokens.append(lease.token)
        try:
            await target.manager.release_lease(lease)
        except StatepactError:
            tally.lease_errors += 1


async def _queue_worker(target: Target, tally: Tally, number: int, stop: asyncio.Event) -> None:
    for _ in range(10_000):
        if stop.is_set():
            return
        try:
            lease = await target.queue.claim(f"w{number}", lease_for=60)
        except StatepactError:
            tally.queue_errors += 1
            await asyncio.sleep(0.02)
            continue
        if lease is None:
            await asyncio.sleep(0.05)
            continue
        item_id = lease.item.item_id
        try:
            await target.queue.ack(lease)
            tally.acks[item_id] += 1
        except StatepactError:
            tally.ack_ambiguous.add(item_id)


async def _producer(target: Target, tally: Tally, stop: asyncio.Event) -> None:
    """Enqueue items all through the faults, so the drain runs across every kill."""
    pace = WORKLOAD_SECONDS / ITEMS
    for number in range(ITEMS):
        if stop.is_set():
            return
        slot = (TENANTS[number % 3], f"i{number}")
        # Enqueue is idempotent on the id: retrying after an ambiguous failure is safe.
        for _attempt in range(20):
            try:
                await target.queue.enqueue(WorkItem(tenant=slot[0], item_id=slot[1]))
            except StatepactError:
                tally.queue_errors += 1
                await asyncio.sleep(0.05)
                continue
            tally.enqueued.append(slot)
            break
        else:
            tally.enqueue_unsure.append(slot)
        await asyncio.sleep(pace)


async def _reaper(target: Target, tally: Tally, stop: asyncio.Event) -> None:
    for _ in range(10_000):
        if stop.is_set():
            return
        try:
            await target.queue.reap()
        except StatepactError:
            tally.queue_errors += 1
        await asyncio.sleep(0.2)


async def _killer(target: Target, tally: Tally, stop: asyncio.Event) -> None:
    gap = WORKLOAD_SECONDS / (KILLS + 1)
    for _ in range(KILLS):
        await asyncio.sleep(gap)
        tally.downtime.append(await target.crash())
    await asyncio.sleep(gap / 2)
    stop.set()


async def _drain_rest(target: Target, tally: Tally) -> None:
    """After the faults: let lapsed leases go back and finish every item (bounded)."""
    target.clock.advance(3600)
    await target.queue.reap()
    for _ in range(ITEMS * 2):
        lease = await target.queue.claim("drainer", lease_for=60)
        if lease is None:
            return
        await target.queue.ack(lease)
        tally.acks[lease.item.item_id] += 1


async def exercise(target: Target, fault_figures: FaultFigures) -> None:
    """Run the workload with kills, then check everything acknowledged is there, once."""
    tally = Tally()
    for counter in range(COUNTERS):
        await target.state.put_run(RunRecord(tenant=TENANTS[0], run_id=f"counter-{counter}"))

    stop = asyncio.Event()
    began = time.monotonic()
    async with asyncio.timeout(WORKLOAD_SECONDS + 40):
        await asyncio.gather(
            _killer(target, tally, stop),
            _producer(target, tally, stop),
            *(_state_worker(target, tally, n, stop) for n in range(3)),
            *(_commit_worker(target, tally, n, stop) for n in range(2)),
            _lease_worker(target, tally, stop),
            *(_queue_worker(target, tally, n, stop) for n in range(3)),
            _reaper(target, tally, stop),
        )
        await _drain_rest(target, tally)
    workload = time.monotonic() - began

    # Runs: every acknowledged creation is there.
    missing_runs = [
        (tenant, run_id)
        for tenant, run_id in tally.created
        if await target.state.get_run(tenant, run_id) is None
    ]
    # Counters: acknowledged <= found <= acknowledged + ambiguous; where writes are resent
    # safely, found == acknowledged unless a patch exhausted the budget (bounded by those).
    counter_found = 0
    counter_lost = 0
    counter_extra = 0
    for counter in range(COUNTERS):
        run_id = f"counter-{counter}"
        run = await target.state.get_run(TENANTS[0], run_id)
        assert run is not None
        acked, unsure = tally.patches[run_id], tally.patch_ambiguous[run_id]
        if target.resends_writes:
            unsure = tally.patch_exhausted[run_id]
        counter_found += run.iterations
        counter_lost += max(0, acked - run.iterations)
        counter_extra += max(0, run.iterations - acked - unsure)
        assert run.input_tokens == 3 * run.iterations, run_id
        assert acked <= run.iterations <= acked + unsure, (run_id, acked, unsure, run.iterations)
        if target.resends_writes and unsure == 0:
            assert run.iterations == acked, (run_id, acked, run.iterations)
    # Commits: each acknowledged one is there, with exactly one version.
    commits_missing = 0
    commits_doubled = 0
    for key, step in tally.commits.items():
        history = await target.manager.history("commits", key)
        if not history or history[0].value != {"step": step}:
            commits_missing += 1
        if len(history) > 1:
            commits_doubled += 1
    # Queue: every item done; none acknowledged twice; done without an ack only if an ack
    # errored ambiguously.
    queue_lost = 0
    not_done = 0
    for tenant, item_id in tally.enqueued:
        item = await target.queue.get_item(tenant, item_id)
        if item is None:
            queue_lost += 1
        elif item.status is not ItemStatus.DONE:
            not_done += 1
        elif tally.acks[item_id] == 0:
            assert item_id in tally.ack_ambiguous, f"{item_id} is done but no ack was sent"
    queue_doubled = sum(1 for count in tally.acks.values() if count > 1)
    # Fencing: tokens only go up.
    backwards = sum(1 for a, b in zip(tally.tokens, tally.tokens[1:], strict=False) if b <= a)

    acknowledged = (
        len(tally.created) + sum(tally.patches.values()) + len(tally.commits) + len(tally.enqueued)
    )
    found = (
        len(tally.created)
        - len(missing_runs)
        + counter_found
        + len(tally.commits)
        - commits_missing
        + len(tally.enqueued)
        - queue_lost
        - not_done
    )
    lost = len(missing_runs) + counter_lost + commits_missing + queue_lost + not_done
    duplicates = counter_extra + commits_doubled + queue_doubled + backwards
    fault_figures.record(
        FaultFigure(
            scenario=f"SIGKILL x{len(tally.downtime)} under load",
            backing=target.name,
            faults=len(tally.downtime),
            acknowledged=acknowledged,
            found=found,
            lost=lost,
            duplicates=duplicates,
            ambiguous=(
                tally.create_ambiguous
                + sum(
                    (
                        tally.patch_exhausted if target.resends_writes else tally.patch_ambiguous
                    ).values()
                )
                + len(tally.ack_ambiguous)
            ),
            seconds=workload,
            notes={
                "runs_created": len(tally.created),
                "patches": sum(tally.patches.values()),
                "patch_errors": sum(tally.patch_ambiguous.values()),
                "patches_budget_exhausted": sum(tally.patch_exhausted.values()),
                "commits": len(tally.commits),
                "commit_retries": tally.commit_errors,
                "replays": tally.replays,
                "lease_tokens": len(tally.tokens),
                "lease_errors": tally.lease_errors,
                "queue_items_done": len(tally.enqueued) - not_done - queue_lost,
                "queue_items_enqueue_unsure": len(tally.enqueue_unsure),
                "queue_errors": tally.queue_errors,
                "down_s": [round(d, 2) for d in tally.downtime],
                "slowest_state_call_s": round(tally.slowest, 2),
            },
        )
    )
    assert missing_runs == []
    assert commits_missing == 0
    assert commits_doubled == 0
    assert queue_lost == 0
    assert not_done == 0
    assert queue_doubled == 0
    assert backwards == 0
    assert len(tally.downtime) == KILLS
    assert tally.tokens, "the lease worker never got a lease"
    assert len(tally.commits) > 0
    assert sum(tally.patches.values()) > 0
    assert len(tally.enqueued) >= 50, "the producer barely ran: the queue saw no faults"


# -- Redis ---------------------------------------------------------------------------------------


@pytest.fixture
async def redis_target(
    statepact_redis_server_factory: RedisServerFactory,
) -> AsyncIterator[Target]:
    need_local("redis")
    server = statepact_redis_server_factory(["--appendonly", "yes", "--appendfsync", "always"])
    client: Redis = fault_redis_client(server.port, socket_timeout=1.0)
    name = f"r{uuid.uuid4().hex[:8]}"
    settings = RedisStoreSettings(namespace=name, tx_prefix=name).replace(failover=FAILOVER)
    clock = ManualClock()

    async def crash() -> float:
        began = time.monotonic()
        await asyncio.to_thread(server.kill)
        await asyncio.sleep(0.2)
        await asyncio.to_thread(server.start)
        return time.monotonic() - began

    try:
        async with await open_redis(settings, clock=clock, policy=POLICY, client=client) as b:
            yield _target("redis", b, clock, crash)
    finally:
        await client.aclose()


async def test_redis_sigkill_under_load_loses_nothing_acknowledged(
    redis_target: Target, fault_figures: FaultFigures
) -> None:
    """SIGKILLs of an AOF (appendfsync always) Redis under load lose no acknowledged write,
    double no patch, commit, or ack, and never move a fencing token back."""
    await exercise(redis_target, fault_figures)


# -- Redis that forgets writes: fencing tokens must not repeat -----------------------------------

RDB_ONLY = ["--appendonly", "no", "--save", "3600 1"]


@pytest.fixture
async def forgetful_redis(
    statepact_redis_server_factory: RedisServerFactory,
) -> AsyncIterator[tuple[Redis, Callable[[], Awaitable[None]]]]:
    """A client on an RDB-only Redis of the test's own, and a crash that forgets everything
    written since the last SAVE (SIGKILL, start again on the same data directory)."""
    need_local("redis")
    server = statepact_redis_server_factory(RDB_ONLY)
    client: Redis = fault_redis_client(server.port, socket_timeout=1.0)

    async def crash() -> None:
        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.start)

    try:
        yield client, crash
    finally:
        await client.aclose()


async def test_redis_lease_tokens_never_repeat_after_a_restart_that_lost_writes(
    forgetful_redis: tuple[Redis, Callable[[], Awaitable[None]]], fault_figures: FaultFigures
) -> None:
    """A lease granted after the last snapshot is forgotten by the crash; the next grant still
    gets a higher token, and the forgotten holder's commit is fenced."""
    client, crash = forgetful_redis
    clock = ManualClock()
    settings = RedisStoreSettings(tx_prefix="fence").replace(failover=FAILOVER)
    manager = TransactionManager(RedisBackend(client, clock=clock, settings=settings))
    first = await manager.acquire_lease("job", "w1", 10)
    assert first is not None
    await client.save()  # the snapshot the server comes back with
    clock.advance(11)
    forgotten = await manager.acquire_lease("job", "w2", 10)
    assert forgotten is not None and forgotten.token > first.token
    async with manager.transaction(fencing=forgotten) as tx:
        tx.write("jobs", "j1", "by w2")
    await crash()
    async with manager.transaction() as check:
        assert await check.read("jobs", "j1") is None, "the server kept what it should forget"
    clock.advance(11)
    taken = await manager.acquire_lease("job", "w3", 10)
    assert taken is not None
    with pytest.raises(FencingError):
        async with manager.transaction(fencing=forgotten) as stale:
            stale.write("jobs", "j1", "stale write by w2")
    fault_figures.outcome(
        "RDB-only restart, lease token after it",
        "redis",
        acknowledged=1,
        found=int(taken.token > forgotten.token),
        unit="fresh tokens",
        tokens=[first.token, forgotten.token, taken.token],
    )
    assert taken.token > forgotten.token


async def test_redis_queue_tokens_never_repeat_after_a_restart_that_lost_writes(
    forgetful_redis: tuple[Redis, Callable[[], Awaitable[None]]], fault_figures: FaultFigures
) -> None:
    """A claim and a heartbeat made after the last snapshot are forgotten by the crash; the
    item's next claim and heartbeat get tokens never issued before, so the crashed worker's ack
    is refused and the new worker keeps its lease."""
    client, crash = forgetful_redis
    clock = ManualClock()
    settings = RedisStoreSettings(namespace="fence").replace(failover=FAILOVER)
    queue = RedisWorkQueue(client, clock=clock, settings=settings, policy=QueuePolicy())
    await queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
    await client.save()
    crashed = await queue.claim("w1", lease_for=30)
    assert crashed is not None
    await crash()
    again = await queue.claim("w2", lease_for=30)
    assert again is not None and again.item.item_id == "i1", "the claim was not forgotten"
    with pytest.raises(LeaseLostError):
        await queue.ack(crashed)
    item = await queue.get_item("acme", "i1")
    assert item is not None and item.status is ItemStatus.LEASED

    await client.save()
    beat = await queue.heartbeat(again)
    await crash()
    beat_again = await queue.heartbeat(again)
    with pytest.raises(LeaseLostError):
        await queue.ack(beat)
    tokens = [crashed.token, again.token, beat.token, beat_again.token]
    fault_figures.outcome(
        "RDB-only restart, queue tokens after it",
        "redis",
        acknowledged=len(tokens),
        found=len(set(tokens)),
        unit="distinct tokens",
        tokens=tokens,
    )
    assert len(set(tokens)) == len(tokens), tokens
    assert (await queue.ack(beat_again)).status is ItemStatus.DONE


# -- PostgreSQL ----------------------------------------------------------------------------------


@pytest.fixture
async def postgres_target(
    statepact_postgres_server_factory: PostgresServerFactory,
) -> AsyncIterator[Target]:
    need_local("postgres")
    from statepact.storage.postgres import migrate
    from tests.fixtures.postgres import create_database

    server = statepact_postgres_server_factory(durable=True)
    assert server.durable
    url = await create_database(server.url, "restarts")
    await migrate.upgrade(url)
    settings = PostgresStoreSettings(dsn=SecretStr(url), pool_size=16, pool_timeout=5).replace(
        failover=FAILOVER
    )
    # Client timeouts, so a call on a connection the kill left half-open cannot hang; the
    # checkout listener replaces connections the crash closed before a write is sent on one.
    engine = create_engine(settings, connect_args={"timeout": 2.0, "command_timeout": 5.0})
    clock = ManualClock()

    async def crash() -> float:
        began = time.monotonic()
        await asyncio.to_thread(server.kill)
        await asyncio.sleep(0.2)
        await asyncio.to_thread(server.start)
        return time.monotonic() - began

    try:
        async with await open_postgres(settings, clock=clock, policy=POLICY, client=engine) as b:
            yield _target("postgres", b, clock, crash, resends_writes=True)
    finally:
        await engine.dispose()


async def test_postgres_sigkill_under_load_loses_nothing_acknowledged(
    postgres_target: Target, fault_figures: FaultFigures
) -> None:
    """SIGKILLs of a durable PostgreSQL (fsync, synchronous_commit on) under load lose no
    acknowledged write, double no patch, commit, or ack, and never move a fencing token back."""
    await exercise(postgres_target, fault_figures)
