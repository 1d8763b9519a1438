"""The Redis backings when the server goes away: waited out within the budget, or given up.

Every server here is the test's own (``statepact_redis_server_factory``); the
tests stop, kill and restart it. Clients are built with redis-py's own retry
off, so the failover budget in ``RedisStoreSettings`` is the only one at work.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from statepact.clock import ManualClock
from statepact.errors import PoolExhaustedError, QueueUnavailableError, StatePersistenceError
from statepact.models import RunRecord, WorkItem
from statepact.settings import RedisStoreSettings
from statepact.storage.redis import RedisStateStore, RedisWorkQueue
from statepact.testing.plugin import RedisServerFactory
from statepact.testing.servers import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PASSWORD = "pw-never-printed"
# Up to 40 attempts, 50 ms doubling to 250 ms: about nine seconds of waiting in all.
PATIENT = RedisStoreSettings(
    failover_attempts=40, failover_base_delay=0.05, failover_max_delay=0.25
)
# Four attempts, at most 0.25 s of backoff between them.
IMPATIENT = RedisStoreSettings(
    failover_attempts=4, failover_base_delay=0.05, failover_max_delay=0.1
)


def _client(server: RedisServer, **kwargs: object) -> Redis:
    return Redis(
        host="127.0.0.1",
        port=server.port,
        socket_connect_timeout=1.0,
        socket_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def server(statepact_redis_server_factory: RedisServerFactory) -> RedisServer:
    """A durable server of this test's own: every write fsynced before it is acknowledged."""
    return statepact_redis_server_factory(["--appendonly", "yes", "--appendfsync", "always"])


async def _add_user(server: RedisServer) -> None:
    """A user ``app`` with ``PASSWORD`` (the server's test harness itself needs no password)."""
    admin = Redis(host="127.0.0.1", port=server.port)
    try:
        await admin.acl_setuser(
            "app", enabled=True, passwords=[f"+{PASSWORD}"], keys="*", commands=["+@all"]
        )
    finally:
        await admin.aclose()


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., Redis]]:
    made: list[Redis] = []

    def make(server: RedisServer, **kwargs: object) -> Redis:
        client = _client(server, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


async def _start_later(server: RedisServer, seconds: float) -> None:
    await asyncio.sleep(seconds)
    await asyncio.to_thread(server.start)


@pytest.mark.parametrize("down", ["stop", "kill"])
async def test_a_server_back_within_the_budget_serves_the_call(
    server: RedisServer, clients: Callable[..., Redis], clock: ManualClock, down: str
) -> None:
    """Stopped (or killed) and started again within the budget: the calls succeed, once each."""
    client = clients(server)
    store = RedisStateStore(client, clock=clock, settings=PATIENT)
    queue = RedisWorkQueue(client, clock=clock, settings=PATIENT)
    await store.put_run(RunRecord(tenant="t", run_id="r"))
    await queue.enqueue(WorkItem(tenant="t", item_id="before"))

    await asyncio.to_thread(server.stop if down == "stop" else server.kill)
    back = asyncio.create_task(_start_later(server, 0.7))
    began = time.monotonic()
    patched = await store.patch_run("t", "r", input_tokens=5)
    enqueued = await queue.enqueue(WorkItem(tenant="t", item_id="after"))
    waited = time.monotonic() - began
    await back
    assert waited >= 0.5
    assert (patched.input_tokens, patched.version) == (5, 2)
    assert enqueued.item_id == "after"
    leases = await queue.claim_batch("w", lease_for=30, limit=5)
    assert sorted(lease.item.item_id for lease in leases) == ["after", "before"]


class _Doorman:
    """A plain TCP listener on a dead server's port: it accepts each connection, counts it and
    closes it at once, so every connection attempt of a client is seen (a refused port would
    leave no trace of them)."""

    def __init__(self) -> None:
        self.accepted = 0
        self._server: asyncio.Server | None = None

    async def open(self, port: int) -> None:
        # reuse_address (asyncio's default on POSIX) binds past the stopped server's TIME_WAIT.
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)

    async def _accept(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_a_server_that_stays_down_ends_in_retryable_errors(
    server: RedisServer, clients: Callable[..., Redis], clock: ManualClock
) -> None:
    """Past the budget: StatePersistenceError("unavailable") and QueueUnavailableError, both
    retryable, after exactly failover_attempts connection attempts each, within the budget,
    naming the call and never the password."""
    await _add_user(server)
    # _client turns redis-py's own retry off (Retry(NoBackoff(), 0)): one connection per
    # attempt of the failover policy, so the count below is the policy's alone. With
    # redis-py's default retry each attempt would open 1 + its retries connections.
    client = clients(server, username="app", password=PASSWORD)
    store = RedisStateStore(client, clock=clock, settings=IMPATIENT)
    queue = RedisWorkQueue(client, clock=clock, settings=IMPATIENT)
    await store.put_run(RunRecord(tenant="acme", run_id="r"))
    await queue.enqueue(WorkItem(tenant="acme", item_id="i"))
    # Drop the pooled connection so every attempt has to connect and the listener sees it:
    # redis-py would send the first attempt on the pooled connection the stopped server
    # closed, and that attempt would fail without a connection the listener could count.
    await client.connection_pool.disconnect()
    await asyncio.to_thread(server.stop)
    doorman = _Doorman()
    await doorman.open(server.port)
    try:
        began = time.monotonic()
        with pytest.raises(StatePersistenceError) as state_error:
            await store.get_run("acme", "r")
        state_seconds = time.monotonic() - began
        state_attempts = doorman.accepted
        began = time.monotonic()
        with pytest.raises(QueueUnavailableError) as queue_error:
            await queue.claim("w", lease_for=30)
        queue_seconds = time.monotonic() - began
        queue_attempts = doorman.accepted - state_attempts
    finally:
        await doorman.close()

    # Each call tried as often as the settings promise, no more and no fewer.
    assert IMPATIENT.failover_attempts == 4
    assert state_attempts == IMPATIENT.failover_attempts
    assert queue_attempts == IMPATIENT.failover_attempts
    assert state_error.value.reason == "unavailable"
    assert state_error.value.retryable is True
    assert queue_error.value.retryable is True
    assert "run 'r' (tenant 'acme')" in str(state_error.value)
    assert "4 attempts" in str(state_error.value)
    for error in (state_error.value, queue_error.value):
        assert PASSWORD not in str(error)
        assert PASSWORD not in repr(error.__cause__)
    # Connections closed at once fail fast: the time is the backoff, bounded by the budget
    # (0.25 s here) plus a generous margin for a noisy machine.
    budget = IMPATIENT.retry_policy.budget
    assert state_seconds < budget + 2.0
    assert queue_seconds < budget + 2.0


async def test_an_exhausted_pool_is_reported_at_once(
    server: RedisServer, clients: Callable[..., Redis], clock: ManualClock
) -> None:
    """A pool at max_connections raises PoolExhaustedError at once, without retrying."""
    pool = ConnectionPool(
        host="127.0.0.1",
        port=server.port,
        max_connections=1,
        retry=Retry(NoBackoff(), 0),
    )
    client = Redis(connection_pool=pool)
    try:
        store = RedisStateStore(client, clock=clock, settings=PATIENT)
        queue = RedisWorkQueue(client, clock=clock, settings=PATIENT)
        await store.put_run(RunRecord(tenant="t", run_id="r"))
        # A blocking pop holds the pool's only connection for a second.
        holder = asyncio.create_task(client.blpop(["nothing-ever"], timeout=1))
        await asyncio.sleep(0.2)
        began = time.monotonic()
        with pytest.raises(PoolExhaustedError) as caught:
            await store.get_run("t", "r")
        with pytest.raises(PoolExhaustedError):
            await queue.claim("w", lease_for=30)
        assert time.monotonic() - began < 0.2
        assert caught.value.retryable is False
        assert await holder is None
        # Once the connection is back, the same store serves again.
        assert await store.get_run("t", "r") is not None
    finally:
        await client.aclose()
        await pool.aclose()  # a pool handed to a client is not closed with it


async def test_a_blocking_pool_that_times_out_is_not_retried(
    server: RedisServer, clock: ManualClock
) -> None:
    """A BlockingConnectionPool that waited its timeout raises PoolExhaustedError after one wait,
    although the failover budget would allow forty attempts."""
    pool = BlockingConnectionPool(
        host="127.0.0.1",
        port=server.port,
        max_connections=1,
        timeout=0.3,
        retry=Retry(NoBackoff(), 0),
    )
    client = Redis(connection_pool=pool)
    try:
        store = RedisStateStore(client, clock=clock, settings=PATIENT)
        await store.put_run(RunRecord(tenant="t", run_id="r"))
        holder = asyncio.create_task(client.blpop(["nothing-ever"], timeout=2))
        await asyncio.sleep(0.2)
        began = time.monotonic()
        with pytest.raises(PoolExhaustedError):
            await store.patch_run("t", "r", iterations=1)
        waited = time.monotonic() - began
        assert 0.25 <= waited < 1.0
        await holder
        found = await store.get_run("t", "r")
        assert found is not None
        assert found.iterations == 0
    finally:
        await client.aclose()
        await pool.aclose()


async def test_wrong_credentials_are_not_waited_out(
    server: RedisServer, clock: ManualClock
) -> None:
    """Refused credentials are no failover: the unavailable error comes at once, no password."""
    await _add_user(server)
    client = Redis(
        host="127.0.0.1",
        port=server.port,
        username="app",
        password="wrong-" + PASSWORD,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        store = RedisStateStore(client, clock=clock, settings=PATIENT)
        began = time.monotonic()
        with pytest.raises(StatePersistenceError) as caught:
            await store.get_run("t", "r")
        assert time.monotonic() - began < 1.0
        assert "credentials" in str(caught.value)
        assert PASSWORD not in str(caught.value)
    finally:
        await client.aclose()
