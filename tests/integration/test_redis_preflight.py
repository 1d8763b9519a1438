"""preflight() against real redis-server instances with the settings it must refuse or accept.

Every server here is started by the test itself (``statepact_redis_server_factory``),
except the machine's own Redis on 127.0.0.1:6379, which is only read; when it does
not answer, that test skips, or fails under ``STATEPACT_REQUIRE_SERVERS=1``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, RedisError

from statepact.clock import ManualClock
from statepact.errors import PreflightError, StatePersistenceError
from statepact.settings import RedisStoreSettings
from statepact.storage.redis import RedisStateStore, RedisWorkQueue, preflight
from statepact.testing.plugin import RedisServerFactory
from statepact.testing.servers import free_port, missing_server

pytestmark = pytest.mark.integration

DURABLE = ["--appendonly", "yes"]
NOTHING_ON_DISK = ["--appendonly", "no", "--save", ""]
# The machine's own Redis (DESIGN: it keeps nothing on disk); only ever read here.
MACHINE_REDIS = "redis://127.0.0.1:6379/0"


Connect = Callable[..., Redis]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Open clients on given URLs; all closed after the test."""
    clients: list[Redis] = []

    def _connect(url: str, **kwargs: Any) -> Redis:
        client = Redis.from_url(url, **kwargs)
        clients.append(client)
        return client

    yield _connect
    for client in clients:
        await client.aclose()


async def _reasons(client: Redis, *, durable: bool = True) -> tuple[str, ...]:
    with pytest.raises(PreflightError) as caught:
        await preflight(client, durable=durable)
    return caught.value.reasons


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-ttl"])
async def test_an_evicting_policy_is_refused(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect, policy: str
) -> None:
    """maxmemory-policy allkeys-* and volatile-ttl are refused, naming the policy."""
    server = statepact_redis_server_factory([*DURABLE, "--maxmemory-policy", policy])
    reasons = await _reasons(connect(server.url))
    assert len(reasons) == 1
    assert f"maxmemory-policy is {policy!r}" in reasons[0]


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "volatile-lfu"])
async def test_a_policy_that_spares_our_keys_passes(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect, policy: str
) -> None:
    """noeviction and the volatile-* policies other than volatile-ttl are accepted."""
    server = statepact_redis_server_factory([*DURABLE, "--maxmemory-policy", policy])
    await preflight(connect(server.url))


async def test_nothing_on_disk_is_refused(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """appendonly no together with save "" is refused; durable=False lifts it."""
    server = statepact_redis_server_factory(NOTHING_ON_DISK)
    client = connect(server.url)
    reasons = await _reasons(client)
    assert len(reasons) == 1
    assert "appendonly is 'no' and save is ''" in reasons[0]
    assert "durable=False" in reasons[0]
    await preflight(client, durable=False)


async def test_rdb_snapshots_alone_are_refused(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """appendonly no with RDB save points is refused: a restart forgets every write since the
    last snapshot; durable=False lifts it."""
    server = statepact_redis_server_factory(["--appendonly", "no", "--save", "3600 1"])
    client = connect(server.url)
    reasons = await _reasons(client)
    assert len(reasons) == 1
    assert "appendonly is 'no' and save is '3600 1'" in reasons[0]
    assert "every write since the last snapshot" in reasons[0]
    assert "durable=False" in reasons[0]
    await client.save()  # a snapshot taken changes nothing: the next writes are still at risk
    assert await _reasons(client) == reasons
    await preflight(client, durable=False)


async def test_aof_left_to_the_kernel_is_refused(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """appendfsync no is refused: an OS crash loses what the kernel had not flushed."""
    server = statepact_redis_server_factory(["--appendonly", "yes", "--appendfsync", "no"])
    client = connect(server.url)
    reasons = await _reasons(client)
    assert len(reasons) == 1
    assert "appendfsync is 'no'" in reasons[0]
    assert "OS crash" in reasons[0]
    await preflight(client, durable=False)


@pytest.mark.parametrize("fsync", ["everysec", "always"])
@pytest.mark.parametrize("save", ["", "60 1"])
async def test_aof_synced_by_redis_passes(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect, fsync: str, save: str
) -> None:
    """AOF with appendfsync everysec or always passes, with or without RDB snapshots."""
    server = statepact_redis_server_factory(
        ["--appendonly", "yes", "--appendfsync", fsync, "--save", save]
    )
    await preflight(connect(server.url))


async def test_every_reason_is_named_at_once(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """An evicting, non-persistent server gets both reasons in one PreflightError."""
    server = statepact_redis_server_factory([*NOTHING_ON_DISK, "--maxmemory-policy", "allkeys-lru"])
    client = connect(server.url)
    with pytest.raises(PreflightError) as caught:
        await preflight(client)
    reasons = caught.value.reasons
    assert len(reasons) == 2
    assert "allkeys-lru" in reasons[0]
    assert "appendonly is 'no'" in reasons[1]
    assert all(reason in str(caught.value) for reason in reasons)
    assert caught.value.retryable is False
    # durable=False lifts the persistence reason only.
    only = await _reasons(client, durable=False)
    assert len(only) == 1 and "allkeys-lru" in only[0]


async def test_the_machines_own_redis_is_refused(connect: Connect) -> None:
    """The machine's Redis on 127.0.0.1:6379 keeps nothing on disk: refused."""
    client = connect(MACHINE_REDIS, socket_connect_timeout=2.0)
    try:
        await client.ping()
    except RedisError as exc:
        # Skipped elsewhere, a failure under STATEPACT_REQUIRE_SERVERS=1 (CI machines have it).
        missing_server(f"no Redis answers on 127.0.0.1:6379 ({type(exc).__name__})")
    reasons = await _reasons(client)
    assert any("keeps nothing on disk" in reason for reason in reasons)


async def test_preflight_only_reads(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """preflight runs CONFIG GET (or INFO) and nothing that sets or rewrites anything."""
    server = statepact_redis_server_factory(NOTHING_ON_DISK)
    client = connect(server.url)
    probe = connect(server.url, decode_responses=True)
    await probe.config_resetstat()
    before = await probe.config_get("*")
    with pytest.raises(PreflightError):
        await preflight(client)
    assert await probe.config_get("*") == before
    stats = await probe.info("commandstats")
    called = {name.removeprefix("cmdstat_") for name in stats}
    assert "config|get" in called
    assert called <= {"config|get", "config|resetstat", "info", "hello", "client|setinfo"}
    assert await probe.dbsize() == 0


async def test_without_config_it_reads_info(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """CONFIG renamed away (managed Redis): INFO memory and persistence decide instead."""
    disabled = ["--rename-command", "CONFIG", ""]
    evicting = statepact_redis_server_factory(
        [*disabled, *DURABLE, "--maxmemory-policy", "allkeys-lru"]
    )
    reasons = await _reasons(connect(evicting.url))
    assert len(reasons) == 1 and "allkeys-lru" in reasons[0]

    aof = statepact_redis_server_factory([*disabled, *DURABLE])
    await preflight(connect(aof.url))

    bare = statepact_redis_server_factory([*disabled, *NOTHING_ON_DISK])
    reasons = await _reasons(connect(bare.url))
    assert len(reasons) == 1
    assert "CONFIG is not available" in reasons[0]
    await preflight(connect(bare.url), durable=False)


async def test_without_config_rdb_alone_is_refused_even_after_a_snapshot(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """From INFO alone, a server without AOF is refused, snapshots taken or not."""
    server = statepact_redis_server_factory(
        ["--rename-command", "CONFIG", "", "--appendonly", "no", "--save", "3600 1"]
    )
    client = connect(server.url)
    reasons = await _reasons(client)
    await client.save()
    assert await _reasons(client) == reasons
    assert len(reasons) == 1
    assert "aof_enabled:0" in reasons[0]
    assert "every write since its last snapshot" in reasons[0]
    await preflight(client, durable=False)


async def test_a_user_without_config_permission_falls_back_to_info(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """NOPERM on CONFIG (an ACL user of a managed service) falls back to INFO too."""
    server = statepact_redis_server_factory(DURABLE)
    admin = connect(server.url)
    await admin.acl_setuser(
        "app", enabled=True, passwords=["+app-secret"], keys="*", commands=["+@all", "-config"]
    )
    app = connect(f"redis://app:app-secret@127.0.0.1:{server.port}/0")
    with pytest.raises(NoPermissionError):
        await app.config_get("appendonly")
    await preflight(app)

    await admin.config_set("maxmemory-policy", "volatile-ttl")
    with pytest.raises(PreflightError) as caught:
        await preflight(app)
    assert "volatile-ttl" in caught.value.reasons[0]
    assert "app-secret" not in str(caught.value)


async def test_open_runs_preflight(
    statepact_redis_server_factory: RedisServerFactory, connect: Connect
) -> None:
    """open() refuses a server preflight refuses; the constructor does not check."""
    bad = connect(statepact_redis_server_factory(NOTHING_ON_DISK).url)
    with pytest.raises(PreflightError):
        await RedisStateStore.open(bad, clock=ManualClock())
    with pytest.raises(PreflightError):
        await RedisWorkQueue.open(bad, clock=ManualClock())
    RedisStateStore(bad)  # skips preflight

    relaxed = RedisStoreSettings(durable=False)
    store = await RedisStateStore.open(bad, clock=ManualClock(), settings=relaxed)
    assert (await store.list_runs("t")).items == []
    queue = await RedisWorkQueue.open(bad, clock=ManualClock(), settings=relaxed)
    assert await queue.claim("w", lease_for=1) is None

    good = connect(statepact_redis_server_factory(DURABLE).url)
    assert isinstance(await RedisStateStore.open(good), RedisStateStore)


async def test_an_unreachable_server_is_unavailable_not_refused(connect: Connect) -> None:
    """A server that never answers is a retryable unavailability, not a PreflightError."""
    client = connect(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    with pytest.raises(StatePersistenceError) as caught:
        await preflight(client)
    assert caught.value.reason == "unavailable"
    assert caught.value.retryable is True
