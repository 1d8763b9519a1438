"""``create_client(settings)`` on real servers: the DSN, pool size and timeouts take effect.

- a state store and a work queue opened (preflight included) on a client from
  ``create_client`` serve; so does a cluster client from ``cluster=True``;
- ``pool_size`` is the client's connection limit: one call past it raises
  ``PoolExhaustedError`` at once;
- a script's connection is taken from the pool either way the client can take one (the
  pool's own probe, or without it as on redis-py before 8): one the server closed is
  replaced before anything is sent on it, and the pool's limit holds;
- ``socket_timeout`` bounds a reply, and redis-py's own retry is off, so a
  server that is down costs only statepact's failover budget;
- the DSN's password appears in no repr, error (whole cause chain) or log line.

The passwords here are made up; this module must never print a real one.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from typing import Any

import pytest
import redis
from pydantic import SecretStr
from redis import exceptions as rex
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff

from statepact.clock import ManualClock
from statepact.errors import PoolExhaustedError, StatepactError, StatePersistenceError
from statepact.models import RunRecord, WorkItem
from statepact.storage.redis import (
    RedisStateStore,
    RedisStoreSettings,
    RedisWorkQueue,
    _client,
    create_client,
)
from statepact.storage.redis._client import is_pool_exhausted, unprobed_connection
from statepact.testing.cluster import LocalRedisCluster
from statepact.testing.plugin import RedisServerFactory
from statepact.testing.servers import RedisServer, free_port

pytestmark = pytest.mark.integration

SECRET = "Vx7-cl1entPW-q52"
FAST: dict[str, Any] = {
    "failover_attempts": 2,
    "failover_base_delay": 0.01,
    "failover_max_delay": 0.02,
}


def _settings(url: str, **fields: Any) -> RedisStoreSettings:
    """Settings for ``url`` under a namespace of the test's own."""
    namespace = f"cc{uuid.uuid4().hex[:10]}"
    return RedisStoreSettings(dsn=SecretStr(url), namespace=namespace, **fields)


def _chain(exc: BaseException) -> str:
    """str and repr of the error and of every error behind it."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < 40:
        parts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


async def _hold(client: Redis, key: str) -> object:
    """Hold one pooled connection for a second (a blocking pop on a key that stays empty)."""
    popped: object = await client.blpop([key], timeout=1)
    return popped


@pytest.fixture
def durable_server(statepact_redis_server_factory: RedisServerFactory) -> RedisServer:
    """A server of this test's own that preflight accepts (append-only file on)."""
    return statepact_redis_server_factory(["--appendonly", "yes"])


async def test_stores_opened_on_a_created_client_serve(
    statepact_redis_url: str, clock: ManualClock
) -> None:
    """open() (preflight included) works on create_client's client, for state and queue."""
    settings = _settings(statepact_redis_url)
    client = create_client(settings)
    try:
        store = await RedisStateStore.open(client, clock=clock, settings=settings)
        queue = await RedisWorkQueue.open(client, clock=clock, settings=settings)
        run = await store.put_run(RunRecord(tenant="acme", run_id="r1", data={"step": 1}))
        await store.patch_run("acme", "r1", iterations=2)
        found = await store.get_run("acme", "r1")
        assert found is not None
        assert (found.data, found.iterations, found.version) == ({"step": 1}, 2, run.version + 1)
        await queue.enqueue(WorkItem(tenant="acme", item_id="job-1", payload={"run": "r1"}))
        lease = await queue.claim("w1", lease_for=30)
        assert lease is not None and lease.item.payload == {"run": "r1"}
        assert (await queue.ack(lease)).status.value == "done"
        assert await store.delete_run("acme", "r1") is True
    finally:
        await client.aclose()


@pytest.fixture(params=["get_connection", "unprobed"])
def connection_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How scripts take their pooled connection: the pool's ``get_connection()`` (a pool
    whose call does more, see ``_pool_does_more``) or :func:`unprobed_connection`, whatever
    the installed redis-py and its settings would choose."""
    path: str = request.param
    monkeypatch.setattr(_client, "_PROBE_HOLDS_THE_POOL", path == "unprobed")
    monkeypatch.setattr(_client, "_pool_does_more", lambda pool: path == "get_connection")
    return path


async def test_a_plain_resp2_pool_hands_out_unprobed_connections_and_resp3_its_own(
    durable_server: RedisServer,
) -> None:
    """With redis-py's observability off, a RESP2 pool's get_connection() does nothing that
    unprobed_connection does not, so statepact takes the cheaper one; a RESP3 pool's may
    have push notifications to hand to its maintenance handler, so it is asked."""
    client = create_client(_settings(durable_server.url))
    resp3 = ConnectionPool.from_url(durable_server.url, protocol=3)
    try:
        await client.ping()  # redis-py looks for its metrics collector on a first call
        assert _client._pool_does_more(client.connection_pool) is False
        assert _client._pool_does_more(resp3) is True
    finally:
        await client.aclose()
        await resp3.aclose()


# Run in a process of its own: it sets OpenTelemetry's global MeterProvider and turns on
# redis-py's observability, neither of which can be undone for the rest of a test session.
_POOL_METRICS_SCRIPT = """
import asyncio, sys, uuid
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis.observability.config import OTelConfig
from redis.observability.providers import get_observability_instance
from statepact import RunRecord
from statepact.settings import RedisStoreSettings
from statepact.storage.redis import RedisStateStore, create_client

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
get_observability_instance().init(OTelConfig())

async def main() -> None:
    settings = RedisStoreSettings(dsn=sys.argv[1], namespace="m" + uuid.uuid4().hex[:8])
    client = create_client(settings)
    store = RedisStateStore(client, settings=settings)
    runs = [RunRecord(tenant="t", run_id=f"r{n}") for n in range(8)]
    await asyncio.gather(*(store.put_run(run) for run in runs))
    await asyncio.gather(*(store.get_run("t", run.run_id) for run in runs))
    await client.aclose()
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name.endswith("connection.count"):
                    for point in metric.data.data_points:
                        state = dict(point.attributes)["db.client.connection.state"]
                        print(state, point.value)

asyncio.run(main())
"""


@pytest.mark.skipif(
    int(redis.__version__.split(".", 1)[0]) < 8, reason="redis-py before 8 has no pool metrics"
)
async def test_redis_py_pool_metrics_stay_balanced_through_statepact_calls(
    durable_server: RedisServer,
) -> None:
    """With redis-py's observability on, its pool counts every connection statepact takes
    and gives back: after concurrent calls none is counted in use, and all are idle.
    (Taking connections past get_connection() would count each release with no take.)"""
    done = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _POOL_METRICS_SCRIPT,
        durable_server.url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(done.communicate(), 60)
    assert done.returncode == 0, err.decode()
    counts = dict(line.split() for line in out.decode().splitlines())
    assert counts["used"] == "0"
    assert int(counts["idle"]) >= 1


async def test_a_connection_its_server_closed_is_replaced_before_a_script_is_sent(
    durable_server: RedisServer, clock: ManualClock, connection_path: str
) -> None:
    """The server closes every idle connection of the pool (CLIENT KILL); the next calls go
    through on new connections with one attempt, no failover retry needed."""
    settings = _settings(durable_server.url, failover_attempts=1)
    client = create_client(settings)
    killer = Redis.from_url(durable_server.url)
    try:
        store = RedisStateStore(client, clock=clock, settings=settings)
        await asyncio.gather(
            *(store.put_run(RunRecord(tenant="t", run_id=f"r{n}")) for n in range(4))
        )
        assert await killer.client_kill_filter(_type="normal", skipme=True) >= 4
        await asyncio.sleep(0.2)  # the end of each stream reaches the client's loop
        found = await asyncio.gather(*(store.get_run("t", f"r{n}") for n in range(4)))
        assert [run.run_id for run in found if run is not None] == ["r0", "r1", "r2", "r3"]
        await store.patch_run("t", "r0", iterations=1)
    finally:
        await killer.aclose()
        await client.aclose()


async def test_unprobed_connections_are_reused_and_the_pool_limit_holds(
    durable_server: RedisServer,
) -> None:
    """unprobed_connection hands back a released connection as it is (no new connection),
    and refuses one past the pool's size as the pool does."""
    client = create_client(_settings(durable_server.url, pool_size=2))
    pool = client.connection_pool
    try:
        first = await unprobed_connection(pool)
        second = await unprobed_connection(pool)
        assert first is not second and first.is_connected and second.is_connected
        with pytest.raises(rex.ConnectionError) as caught:
            await unprobed_connection(pool)
        assert is_pool_exhausted(caught.value)
        await pool.release(first)
        again = await unprobed_connection(pool)
        assert again is first
        await again.send_command("PING")
        assert await again.read_response() in (b"PONG", "PONG")
        await pool.release(again)
        await pool.release(second)
    finally:
        await client.aclose()


async def test_pool_size_is_the_connection_limit(
    durable_server: RedisServer, clock: ManualClock, connection_path: str
) -> None:
    """With pool_size connections busy, the next call raises PoolExhaustedError at once; once
    one is back, the same store serves again."""
    settings = _settings(durable_server.url, pool_size=2, socket_timeout=5.0)
    client = create_client(settings)
    try:
        store = RedisStateStore(client, clock=clock, settings=settings)
        await store.put_run(RunRecord(tenant="t", run_id="r"))
        # Two blocking pops hold both connections of the pool for a second.
        holders = [asyncio.create_task(_hold(client, f"nothing-{n}")) for n in range(2)]
        await asyncio.sleep(0.2)
        began = time.monotonic()
        with pytest.raises(PoolExhaustedError) as caught:
            await store.get_run("t", "r")
        assert time.monotonic() - began < 0.2
        assert caught.value.retryable is False
        assert await asyncio.gather(*holders) == [None, None]
        assert await store.get_run("t", "r") is not None
    finally:
        await client.aclose()


async def test_socket_timeout_bounds_a_reply(durable_server: RedisServer) -> None:
    """A reply slower than settings.socket_timeout is a timeout, not a wait without end."""
    client = create_client(_settings(durable_server.url, socket_timeout=0.3))
    try:
        began = time.monotonic()
        with pytest.raises(rex.TimeoutError):
            await client.blpop(["nothing-ever"], timeout=3)
        assert time.monotonic() - began < 2.0
    finally:
        await client.aclose()


# A script that keeps the server from reading anything for two seconds.
_SPIN = """
local function now() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end
local began = now()
while now() - began < 2000000 do end
return 1
"""


async def test_socket_timeout_bounds_a_write(durable_server: RedisServer) -> None:
    """A write the server does not take in within settings.socket_timeout (it is busy in a
    script and the socket buffers are full) is a timeout that drops the connection, not a
    wait without end; the next call on the client goes through on a new one."""
    client = create_client(_settings(durable_server.url, socket_timeout=0.3))
    busy = Redis.from_url(durable_server.url)
    key = f"cc{uuid.uuid4().hex[:10]}:big"
    try:
        await client.ping()
        spinning = asyncio.ensure_future(busy.eval(_SPIN, 0))
        await asyncio.sleep(0.2)  # the script runs: the server reads no socket
        began = time.monotonic()
        with pytest.raises(rex.TimeoutError, match="writing"):
            await client.set(key, b"x" * (64 << 20))
        assert time.monotonic() - began < 1.5
        assert await spinning == 1
        await asyncio.sleep(0.2)
        assert await client.exists(key) == 0  # the half-sent command was dropped with its socket
        assert await client.ping() is True
    finally:
        await busy.aclose()
        await client.aclose()


async def test_a_server_that_is_down_costs_only_the_failover_budget(
    durable_server: RedisServer, clock: ManualClock
) -> None:
    """redis-py's own retry is off: a stopped server fails after statepact's two attempts, at
    once, with a retryable StatePersistenceError. A ``retry=`` passed to create_client wins,
    and then its waits come on top (the contrast shows the default really is off)."""
    settings = _settings(durable_server.url, **FAST)
    default = create_client(settings)
    own_retry = create_client(settings, retry=Retry(ConstantBackoff(0.25), 2))
    try:
        await RedisStateStore(default, clock=clock, settings=settings).put_run(
            RunRecord(tenant="t", run_id="r")
        )
        durable_server.stop()
        seconds: list[float] = []
        for client in (default, own_retry):
            store = RedisStateStore(client, clock=clock, settings=settings)
            began = time.monotonic()
            with pytest.raises(StatePersistenceError) as caught:
                await store.get_run("t", "r")
            seconds.append(time.monotonic() - began)
            assert caught.value.retryable is True
        # Two statepact attempts, each with two redis-py retries 0.25 s apart: at least 1 s.
        assert seconds[0] < 0.5 <= 1.0 <= seconds[1]
    finally:
        await default.aclose()
        await own_retry.aclose()


async def test_the_dsn_password_is_never_shown(
    durable_server: RedisServer, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """No repr, error (cause chain included) or log line shows the DSN's password: with the
    right password, a wrong one, an unreachable server, and a URL redis-py cannot read."""
    caplog.set_level(logging.DEBUG)
    admin = create_client(_settings(durable_server.url))
    await admin.config_set("requirepass", SECRET)
    texts: list[str] = []
    try:
        right = _settings(f"redis://:{SECRET}@127.0.0.1:{durable_server.port}/0", **FAST)
        client = create_client(right)
        try:
            store = await RedisStateStore.open(client, clock=clock, settings=right)
            await store.put_run(RunRecord(tenant="t", run_id="r"))
            texts += [repr(client), repr(right), str(right), repr(store)]
        finally:
            await client.aclose()
        for url in (
            f"redis://:wrong-{SECRET}@127.0.0.1:{durable_server.port}/0",
            f"redis://app:{SECRET}@127.0.0.1:{free_port()}/0",
        ):
            settings = _settings(url, **FAST)
            refused = create_client(settings)
            try:
                with pytest.raises(StatepactError) as opening:
                    await RedisStateStore.open(refused, clock=clock, settings=settings)
                with pytest.raises(StatepactError) as calling:
                    await RedisWorkQueue(refused, clock=clock, settings=settings).claim(
                        "w", lease_for=1
                    )
                texts += [repr(refused), _chain(opening.value), _chain(calling.value)]
            finally:
                await refused.aclose()
        with pytest.raises(ValueError) as unreadable:
            create_client(_settings(f"redis://app:{SECRET}@127.0.0.1:not-a-port/0"))
        assert "is not a Redis URL" in str(unreadable.value)
        texts.append(_chain(unreadable.value))
    finally:
        await admin.config_set("requirepass", "")
        await admin.aclose()
    for text in [*texts, caplog.text]:
        assert SECRET not in text, f"a password got out: {text!r}"


@pytest.fixture
def cluster_settings(local_cluster: LocalRedisCluster) -> RedisStoreSettings:
    """Settings naming one node of the cluster; the client finds the others."""
    return _settings(local_cluster.url, pool_size=4)


async def test_cluster_true_builds_a_cluster_client_a_store_serves_on(
    cluster_settings: RedisStoreSettings, clock: ManualClock
) -> None:
    """cluster=True: a RedisCluster from one node's URL, the pool size per node; state for
    tenants in different slots and a queue both serve through it."""
    from redis.asyncio import RedisCluster

    client = create_client(cluster_settings, cluster=True)
    try:
        assert isinstance(client, RedisCluster)
        store = await RedisStateStore.open(client, clock=clock, settings=cluster_settings)
        queue = await RedisWorkQueue.open(client, clock=clock, settings=cluster_settings)
        tenants = [f"tenant-{n}" for n in range(12)]
        for tenant in tenants:
            await store.put_run(RunRecord(tenant=tenant, run_id="r"))
        assert all([await store.get_run(tenant, "r") for tenant in tenants])
        await queue.enqueue(WorkItem(tenant="acme", item_id="job"))
        lease = await queue.claim("w1", lease_for=30)
        assert lease is not None
        await queue.ack(lease)
        for node in client.get_nodes():
            assert node.max_connections == cluster_settings.pool_size
    finally:
        await client.aclose()
