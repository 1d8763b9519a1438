"""Redis backings behind the fault proxy: ambiguous commits, stalls past the failover budget.

- An ambiguous commit: the server applied a commit and the connection was cut
  before its reply reached the client. With the failover budget at one attempt
  the caller sees the retryable error, retries with the same idempotency key,
  and gets ``replayed=True``: one version in the history. With the default
  budget the backing's own retry recognises the commit (its outcome record,
  kept under its transaction id) and reports it once, without a replay, even
  when more versions of its key than ``history_limit`` keeps were committed
  before the resend arrived (``tests/faults/_resend.py``, on PostgreSQL too).
- A stall longer than the budget ends in ``StatePersistenceError(reason=
  "unavailable")`` / ``QueueUnavailableError`` within ``attempts *
  socket_timeout + budget`` plus a margin. That needs a client socket timeout:
  redis-py 8 defaults to 5 s and its own 10 retries, see docs/faults.md.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.errors import QueueUnavailableError, StatePersistenceError
from statepact.models import RunRecord, WorkItem
from statepact.settings import RedisStoreSettings
from statepact.storage.redis import RedisBackend, RedisStateStore, RedisWorkQueue
from statepact.testing.faults import FaultProxy
from statepact.testing.servers import RedisServer
from statepact.tx import TransactionManager
from tests.faults._resend import OTHER_COMMITS, deposit_resent_after_others_committed
from tests.faults.conftest import (
    FAST_FAILOVER,
    SOCKET_TIMEOUT,
    FaultFigure,
    FaultFigures,
    fault_redis_client,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# Slack for scheduling on a shared two-core machine.
MARGIN = 1.0


def stall_bound(policy: RetryPolicy, socket_timeout: float = SOCKET_TIMEOUT) -> float:
    """The longest a call may take against a stalled server: every attempt waits out the socket
    timeout, and the backoff between attempts is at most the policy's budget."""
    return policy.attempts * socket_timeout + policy.budget + MARGIN


@pytest.fixture
async def proxy(fault_redis_server: RedisServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(fault_redis_server.port) as running:
        yield running


@pytest.fixture
async def proxied(proxy: FaultProxy) -> AsyncIterator[Redis]:
    """A client whose every connection goes through ``proxy``."""
    client = fault_redis_client(proxy.port)
    try:
        yield client
    finally:
        await client.aclose()


def _prefix() -> str:
    return f"faults-{uuid.uuid4().hex[:10]}"


async def _backend(
    client: Redis, clock: ManualClock, policy: RetryPolicy, **options: Any
) -> RedisBackend:
    """A backend whose commit script the server already knows.

    The first EVALSHA of a script the server has not loaded is answered
    NOSCRIPT (then loaded and sent again); cutting that reply would be a cut
    before anything applied, not the ambiguous commit a test means.
    """
    backend = RedisBackend(client, prefix=_prefix(), clock=clock, failover=policy, **options)
    async with TransactionManager(backend).transaction(idempotency_key="warm-up") as tx:
        tx.write("warm-up", "k", 1)
    return backend


# -- ambiguous commits ----------------------------------------------------------------------


async def test_ambiguous_commit_surfaces_then_replays_once(
    proxy: FaultProxy,
    proxied: Redis,
    redis_direct: Redis,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """Cut after the server applied a commit: the caller gets the retryable error, a retry with the
    same idempotency key replays (replayed=True) and the history holds one version."""
    began = time.monotonic()
    backend = await _backend(proxied, clock, RetryPolicy(attempts=1))
    manager = TransactionManager(backend)
    key = f"idem-{uuid.uuid4().hex}"
    armed = proxy.cut_after_reply(key.encode())
    with pytest.raises(StatePersistenceError) as caught:
        async with manager.transaction(idempotency_key=key) as tx:
            tx.write("orders", "o1", {"state": "paid"})
    assert caught.value.reason == "unavailable"
    assert caught.value.retryable is True
    await armed.wait(1.0)
    assert armed.swallowed, "the server answered the commit"

    # What the server holds, seen through a connection the proxy never touched.
    checker = TransactionManager(RedisBackend(redis_direct, prefix=backend.prefix, clock=clock))
    history = await checker.history("orders", "o1")
    assert [v.value for v in history] == [{"state": "paid"}]
    applied = history[0].version

    async with manager.transaction(idempotency_key=key) as retry:
        retry.write("orders", "o1", {"state": "paid"})
    assert retry.result.replayed is True
    assert retry.result.version == applied
    history = await checker.history("orders", "o1")
    assert [(v.version, v.value) for v in history] == [(applied, {"state": "paid"})]
    fault_figures.record(
        FaultFigure(
            scenario="ambiguous commit, caller retries same key",
            backing="redis",
            faults=proxy.stats.cut,
            acknowledged=1,
            found=len(history),
            lost=1 - len(history),
            duplicates=len(history) - 1,
            ambiguous=1,
            seconds=time.monotonic() - began,
            notes={"replayed": retry.result.replayed},
        )
    )
    await backend.clear()


async def test_ambiguous_commit_absorbed_by_failover_applies_once(
    proxy: FaultProxy,
    proxied: Redis,
    redis_direct: Redis,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """With a failover budget, the backing resends the cut commit itself; the script recognises its
    own transaction and the caller sees one commit, once, not a replay."""
    backend = await _backend(proxied, clock, FAST_FAILOVER)
    manager = TransactionManager(backend)
    key = f"idem-{uuid.uuid4().hex}"
    armed = proxy.cut_after_reply(key.encode())
    async with manager.transaction(idempotency_key=key) as tx:
        tx.write("orders", "o2", {"n": 1})
    await armed.wait(1.0)
    assert proxy.stats.cut == 1
    assert tx.result.replayed is False
    checker = TransactionManager(RedisBackend(redis_direct, prefix=backend.prefix, clock=clock))
    history = await checker.history("orders", "o2")
    assert [(v.version, v.value) for v in history] == [(tx.result.version, {"n": 1})]
    fault_figures.outcome(
        "ambiguous commit, resent by the failover",
        "redis",
        acknowledged=1,
        found=len(history),
        faults=proxy.stats.cut,
    )
    await backend.clear()


async def test_ambiguous_patch_is_not_applied_twice_by_the_failover(
    proxy: FaultProxy,
    proxied: Redis,
    redis_direct: Redis,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A patch_run cut after it applied is resent by the failover and counted once."""
    namespace = _prefix()
    settings = RedisStoreSettings(
        namespace=namespace,
        failover_attempts=FAST_FAILOVER.attempts,
        failover_base_delay=FAST_FAILOVER.base_delay,
        failover_max_delay=FAST_FAILOVER.max_delay,
    )
    store = RedisStateStore(proxied, clock=clock, settings=settings)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    # Loads the patch script, so the cut below meets the patch itself, not NOSCRIPT.
    await store.patch_run("acme", "r1")
    # The RESP encoding of the five deltas "7", "0", "0", "0", "0" ends the patch's arguments.
    armed = proxy.cut_after_reply(b"$1\r\n7\r\n" + b"$1\r\n0\r\n" * 4)
    patched = await store.patch_run("acme", "r1", input_tokens=7)
    await armed.wait(1.0)
    assert proxy.stats.cut == 1
    assert patched.input_tokens == 7
    checker = RedisStateStore(redis_direct, clock=clock, settings=settings)
    found = await checker.get_run("acme", "r1")
    assert found is not None
    assert found.input_tokens == 7
    assert found.version == 3
    fault_figures.outcome(
        "ambiguous patch, resent by the failover",
        "redis",
        acknowledged=7,
        found=found.input_tokens,
        faults=proxy.stats.cut,
        unit="tokens",
    )
    await checker.delete_run("acme", "r1")


# -- stalls past the budget --------------------------------------------------------------------


async def test_stalled_state_store_gives_up_within_the_budget(
    proxy: FaultProxy, proxied: Redis, clock: ManualClock, fault_figures: FaultFigures
) -> None:
    """A server that stops answering ends a state call in StatePersistenceError("unavailable")
    after the socket timeouts and the backoff budget, not later."""
    settings = RedisStoreSettings(
        namespace=_prefix(),
        failover_attempts=FAST_FAILOVER.attempts,
        failover_base_delay=FAST_FAILOVER.base_delay,
        failover_max_delay=FAST_FAILOVER.max_delay,
    )
    store = RedisStateStore(proxied, clock=clock, settings=settings)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    proxy.stall(60.0)
    began = time.monotonic()
    with pytest.raises(StatePersistenceError) as caught:
        await store.patch_run("acme", "r1", iterations=1)
    elapsed = time.monotonic() - began
    proxy.heal()
    assert caught.value.reason == "unavailable"
    assert caught.value.retryable is True
    assert "tenant 'acme'" in str(caught.value)
    bound = stall_bound(settings.retry_policy)
    assert SOCKET_TIMEOUT <= elapsed <= bound, (elapsed, bound)
    fault_figures.record(
        FaultFigure(
            scenario="stall past budget: state store",
            backing="redis",
            faults=1,
            acknowledged=0,
            found=0,
            lost=0,
            duplicates=0,
            ambiguous=1,
            seconds=elapsed,
            notes={"bound_s": round(bound, 2), "socket_timeout_s": SOCKET_TIMEOUT},
        )
    )


async def test_stalled_queue_gives_up_within_the_budget(
    proxy: FaultProxy, proxied: Redis, clock: ManualClock, fault_figures: FaultFigures
) -> None:
    """A stalled queue server ends a claim in QueueUnavailableError (retryable) within the
    budget."""
    settings = RedisStoreSettings(
        namespace=_prefix(),
        failover_attempts=FAST_FAILOVER.attempts,
        failover_base_delay=FAST_FAILOVER.base_delay,
        failover_max_delay=FAST_FAILOVER.max_delay,
    )
    queue = RedisWorkQueue(proxied, clock=clock, settings=settings)
    await queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
    proxy.stall(60.0)
    began = time.monotonic()
    with pytest.raises(QueueUnavailableError) as caught:
        await queue.claim("w1", lease_for=30)
    elapsed = time.monotonic() - began
    proxy.heal()
    assert caught.value.retryable is True
    bound = stall_bound(settings.retry_policy)
    assert SOCKET_TIMEOUT <= elapsed <= bound, (elapsed, bound)
    fault_figures.record(
        FaultFigure(
            scenario="stall past budget: queue claim",
            backing="redis",
            faults=1,
            acknowledged=0,
            found=0,
            lost=0,
            duplicates=0,
            ambiguous=1,
            seconds=elapsed,
            notes={"bound_s": round(bound, 2)},
        )
    )


async def test_stalled_backend_gives_up_within_the_budget(
    proxy: FaultProxy, proxied: Redis, clock: ManualClock
) -> None:
    """A stalled transaction server ends a commit in StatePersistenceError("unavailable")."""
    backend = await _backend(proxied, clock, FAST_FAILOVER)
    manager = TransactionManager(backend)
    proxy.stall(60.0)
    began = time.monotonic()
    with pytest.raises(StatePersistenceError) as caught:
        async with manager.transaction() as tx:
            tx.write("orders", "o1", {"n": 1})
    elapsed = time.monotonic() - began
    proxy.heal()
    assert caught.value.reason == "unavailable"
    # begin() and the commit may each wait out the budget.
    bound = 2 * stall_bound(FAST_FAILOVER)
    assert SOCKET_TIMEOUT <= elapsed <= bound, (elapsed, bound)


async def test_blackhole_then_heal_recovers_without_a_new_client(
    proxy: FaultProxy, proxied: Redis, clock: ManualClock
) -> None:
    """After a partition heals, the same store serves again: its client reconnects by itself."""
    settings = RedisStoreSettings(
        namespace=_prefix(),
        failover_attempts=FAST_FAILOVER.attempts,
        failover_base_delay=FAST_FAILOVER.base_delay,
        failover_max_delay=FAST_FAILOVER.max_delay,
    )
    store = RedisStateStore(proxied, clock=clock, settings=settings)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    proxy.blackhole()
    with pytest.raises(StatePersistenceError):
        await store.get_run("acme", "r1")
    proxy.heal()
    found = await store.get_run("acme", "r1")
    assert found is not None
    assert found.version == 1


# -- a retry that waited while others wrote --------------------------------------------------


async def test_patch_retried_after_others_wrote_is_applied_once(
    proxy: FaultProxy,
    proxied: Redis,
    redis_direct: Redis,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A patch cut after it applied, whose failover retry comes after five other patches of the
    same run landed, is still counted once."""
    settings = RedisStoreSettings(
        namespace=_prefix(), failover_attempts=10, failover_base_delay=0.05, failover_max_delay=0.2
    )
    store = RedisStateStore(proxied, clock=clock, settings=settings)
    other = RedisStateStore(redis_direct, clock=clock, settings=settings)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    await store.patch_run("acme", "r1")  # loads the script: the cut meets the patch itself
    # Cut after the patch applied, and keep the failover's retries out until healed.
    armed = proxy.cut_after_reply(b"$1\r\n7\r\n" + b"$1\r\n0\r\n" * 4, then="refuse")
    patch = asyncio.create_task(store.patch_run("acme", "r1", input_tokens=7))
    await armed.wait(2.0)
    for _ in range(5):
        await other.patch_run("acme", "r1", output_tokens=1)
    proxy.heal()
    await asyncio.wait_for(patch, 10.0)
    found = await other.get_run("acme", "r1")
    assert found is not None
    assert found.output_tokens == 5
    assert found.input_tokens == 7
    fault_figures.outcome(
        "ambiguous patch resent after 5 other writes",
        "redis",
        acknowledged=7 + 5,
        found=found.input_tokens + found.output_tokens,
        unit="tokens",
    )


async def test_create_retried_after_others_wrote_reports_success(
    proxy: FaultProxy,
    proxied: Redis,
    redis_direct: Redis,
    clock: ManualClock,
) -> None:
    """A create cut after it applied, retried after five patches of the run, returns the run."""
    settings = RedisStoreSettings(
        namespace=_prefix(), failover_attempts=10, failover_base_delay=0.05, failover_max_delay=0.2
    )
    store = RedisStateStore(proxied, clock=clock, settings=settings)
    other = RedisStateStore(redis_direct, clock=clock, settings=settings)
    await store.put_run(RunRecord(tenant="acme", run_id="warm-up"))  # loads the script
    armed = proxy.cut_after_reply(b"created-by-me", then="refuse")
    put = asyncio.create_task(
        store.put_run(RunRecord(tenant="acme", run_id="r1", data={"who": "created-by-me"}))
    )
    await armed.wait(2.0)
    for _ in range(5):
        await other.patch_run("acme", "r1", iterations=1)
    proxy.heal()
    stored = await asyncio.wait_for(put, 10.0)
    assert stored.data == {"who": "created-by-me"}


# A budget that outlasts the other client's commits while the proxy refuses the resends.
RESENDING = RetryPolicy(attempts=40, base_delay=0.05, max_delay=0.2)


@pytest.mark.parametrize(
    ("isolation", "idempotent"),
    [("read_committed", False), ("snapshot", False), ("snapshot", True)],
    ids=["read_committed", "snapshot", "snapshot-idempotency-expired"],
)
async def test_commit_resent_after_its_history_was_trimmed_applies_once(
    isolation: str,
    idempotent: bool,
    proxy: FaultProxy,
    proxied: Redis,
    redis_direct: Redis,
    clock: ManualClock,
    fault_figures: FaultFigures,
) -> None:
    """A commit cut after it applied, resent after another client committed more versions of
    the key than history_limit keeps (and, with an idempotency key, after its record
    expired), answers its own success: applied once, manager.run's body run once."""
    options = {"idempotency_ttl_seconds": 1} if idempotent else {}
    backend = await _backend(proxied, clock, RESENDING, **options)
    assert backend.history_limit < OTHER_COMMITS
    other = TransactionManager(RedisBackend(redis_direct, prefix=backend.prefix, clock=clock))
    outcome = await deposit_resent_after_others_committed(
        proxy,
        TransactionManager(backend),
        other,
        fault_figures,
        backing="redis",
        isolation=isolation,
        idempotency_key=f"idem-{uuid.uuid4().hex}" if idempotent else None,
        wait_before_heal=1.5 if idempotent else 0.0,
    )
    assert (outcome.balance, outcome.body_runs) == (outcome.expected, 1)
    await backend.clear()


# -- a redis-py race the boundary must translate ------------------------------------------------


async def test_write_on_a_connection_closed_under_it_is_a_dropped_connection() -> None:
    """redis-py 8.1 leaks a write on a connection closed under it as a bare AttributeError
    (seen during a cluster failover; 8.2 raises ConnectionError instead); the boundary
    treats either as a dropped connection."""
    from redis.asyncio.connection import Connection
    from redis.exceptions import ConnectionError as RedisConnectionError

    from statepact.storage.redis._client import Failover, is_transient

    connection = Connection(host="127.0.0.1", port=1)  # never connected: no writer
    with pytest.raises((AttributeError, RedisConnectionError)) as leaked:
        await connection._send_packed_command([b"PING\r\n"])
    assert is_transient(leaked.value)
    # The same error from anywhere but redis-py or asyncio is a bug, not a connection.
    with pytest.raises(AttributeError) as ours:
        getattr(None, "writelines")  # noqa: B009 - raise it from this module
    assert not is_transient(ours.value)

    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await connection._send_packed_command([b"PING\r\n"])
        return "ok"

    failover = Failover(
        FAST_FAILOVER, lambda message: StatePersistenceError(message, reason="unavailable")
    )
    assert await failover.run("a call", flaky) == "ok"
    assert calls == 2


async def test_ambiguous_ack_many_is_answered_as_its_first_run(
    proxy: FaultProxy, proxied: Redis, redis_direct: Redis, clock: ManualClock
) -> None:
    """An ack_many cut after it applied is resent by the failover, and the resend answers
    what the first run did (its replay key keeps each lease's outcome): the live leases
    acked, the stale one lost. Without it the resend would find every token gone and
    report the acked leases lost."""
    settings = RedisStoreSettings(
        namespace=_prefix(),
        failover_attempts=FAST_FAILOVER.attempts,
        failover_base_delay=FAST_FAILOVER.base_delay,
        failover_max_delay=FAST_FAILOVER.max_delay,
    )
    queue = RedisWorkQueue(proxied, clock=clock, settings=settings)
    await queue.enqueue_many([WorkItem(tenant="acme", item_id=f"j{n}") for n in range(5)])
    # Loads the script, so the cut below meets ack_many itself, not NOSCRIPT.
    warm = await queue.claim("w1", lease_for=30)
    assert warm is not None
    assert isinstance((await queue.ack_many([warm]))[0], WorkItem)
    leases = await queue.claim_batch("w1", lease_for=30, limit=4)
    stale = await queue.heartbeat(leases[1])
    assert stale.token != leases[1].token
    last = str(leases[-1].token).encode()
    armed = proxy.cut_after_reply(b"$%d\r\n%s\r\n" % (len(last), last))
    done = await queue.ack_many(leases)
    await armed.wait(1.0)
    assert proxy.stats.cut == 1
    assert [type(d).__name__ for d in done] == [
        "WorkItem",
        "LeaseLostError",
        "WorkItem",
        "WorkItem",
    ]
    checker = RedisWorkQueue(redis_direct, clock=clock, settings=settings)
    for lease, answer in zip(leases, done, strict=True):
        found = await checker.get_item("acme", lease.item.item_id)
        assert found is not None
        if isinstance(answer, WorkItem):
            assert found == answer
            assert found.status.value == "done"
        else:
            assert found.status.value == "leased"
    assert (await checker.ack(stale)).status.value == "done"
