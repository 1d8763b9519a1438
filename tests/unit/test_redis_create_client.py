"""``create_client(settings)`` refusals and laziness, with no server (the rest is integration).

A missing DSN and a URL redis-py cannot read are ``ValueError`` naming ``dsn``,
with the password masked; building a client connects to nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr
from redis import exceptions as rex
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

from statepact.settings import RedisStoreSettings
from statepact.storage.redis import create_client
from statepact.storage.redis._client import CallGate, gate_of, is_pool_exhausted, is_transient

SECRET = "Kp4-unitPW-z19"


def test_without_a_dsn_it_refuses() -> None:
    """No dsn: a ValueError naming the field, before anything is built."""
    with pytest.raises(ValueError, match=r"^dsn: RedisStoreSettings\.dsn is needed"):
        create_client(RedisStoreSettings())


@pytest.mark.parametrize(
    "url",
    [
        f"http://app:{SECRET}@127.0.0.1:6379/0",
        f"redis://app:{SECRET}@127.0.0.1:not-a-port/0",
    ],
)
def test_an_unreadable_url_is_refused_without_its_password(url: str) -> None:
    """A URL redis-py cannot read: a ValueError naming dsn, password masked, no cause shown."""
    with pytest.raises(ValueError) as caught:
        create_client(RedisStoreSettings(dsn=SecretStr(url)))
    message = str(caught.value)
    assert message.startswith("dsn: ") and "is not a Redis URL" in message
    assert "app:***@" in message
    assert SECRET not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.parametrize("cluster", [False, True])
async def test_building_a_client_connects_to_nothing(cluster: bool) -> None:
    """A client for a port nothing listens on is built without error, plain or cluster."""
    settings = RedisStoreSettings(dsn=SecretStr("redis://127.0.0.1:1/0"))
    client = create_client(settings, cluster=cluster)
    assert isinstance(client, RedisCluster if cluster else Redis)
    await client.aclose()


@pytest.mark.parametrize(
    ("url", "database"),
    [
        (f"redis://app:{SECRET}@127.0.0.1:6379/x", "'x'"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/1x", "'1x'"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/-1", "'-1'"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/1/2", "'1/2'"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/?db=x", "'x'"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/1?db=2", "both '1' and '2'"),
        (f"unix://app:{SECRET}@/tmp/redis.sock?db=one", "'one'"),
    ],
)
def test_a_database_that_is_not_an_index_is_refused(url: str, database: str) -> None:
    """redis://host/x is not database 0: a ValueError naming the URL's database and the URL,
    password masked, before anything is built."""
    with pytest.raises(ValueError) as caught:
        create_client(RedisStoreSettings(dsn=SecretStr(url)))
    message = str(caught.value)
    assert message.startswith("dsn: ")
    assert f"database {database}" in message
    assert "app:***@" in message
    assert SECRET not in message


@pytest.mark.parametrize(
    ("url", "db"),
    [
        ("redis://127.0.0.1:6379", 0),
        ("redis://127.0.0.1:6379/", 0),
        ("redis://127.0.0.1:6379/7", 7),
        ("redis://127.0.0.1:6379?db=3", 3),
        ("redis://127.0.0.1:6379/3?db=3", 3),
        ("rediss://127.0.0.1:6380/2", 2),
        ("unix:///tmp/redis.sock?db=4", 4),
    ],
)
async def test_a_database_index_is_taken(url: str, db: int) -> None:
    """A URL naming no database is database 0; one naming an index selects it."""
    client = create_client(RedisStoreSettings(dsn=SecretStr(url)))
    assert client.connection_pool.connection_kwargs.get("db", 0) == db
    await client.aclose()


async def test_connect_refuses_a_database_that_is_not_an_index() -> None:
    """RedisBackend.connect("redis://host/x") is a ValueError naming the database, sent nowhere."""
    from statepact._retry import RetryPolicy
    from statepact.storage.redis import RedisBackend

    with pytest.raises(ValueError, match=r"database 'x'") as caught:
        await RedisBackend.connect(
            f"redis://app:{SECRET}@127.0.0.1:1/x", failover=RetryPolicy(attempts=1)
        )
    assert str(caught.value).startswith("url: ")
    assert SECRET not in str(caught.value)


async def test_pool_wait_makes_a_pool_that_waits() -> None:
    """pool_wait: a pool of pool_size behind a CallGate of pool_size calls that waits that
    long (the stores built on the client share it); no wait on a cluster (its per-node pools
    cannot), and never a negative one; without pool_wait, no gate."""
    settings = RedisStoreSettings(dsn=SecretStr("redis://127.0.0.1:1/2"), pool_size=7)
    client = create_client(settings, pool_wait=1.5)
    pool = client.connection_pool
    assert (pool.max_connections, pool.connection_kwargs["db"]) == (7, 2)
    gate = gate_of(client)
    assert isinstance(gate, CallGate)
    assert (gate.size, gate.wait) == (7, 1.5)
    await client.aclose()
    plain = create_client(settings)
    assert gate_of(plain) is None
    await plain.aclose()
    for cluster, wait in ((True, 1.0), (False, -1.0)):
        with pytest.raises(ValueError, match=r"^pool_wait: "):
            create_client(settings, cluster=cluster, pool_wait=wait)


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("redis://127.0.0.1:6379/0", Connection),
        ("rediss://127.0.0.1:6379/0", SSLConnection),
        ("unix:///tmp/statepact-none.sock", UnixDomainSocketConnection),
    ],
)
def test_the_pool_bounds_writes_on_the_connection_class_of_the_url(
    url: str, base: type[Any]
) -> None:
    """Each scheme keeps its own connection class (TLS, a socket file), with the bounded
    write on top: one class per base, shared by every client."""
    client = create_client(RedisStoreSettings(dsn=SecretStr(url)))
    made = client.connection_pool.connection_class
    assert issubclass(made, base)
    assert made is not base
    assert made.send_packed_command is not base.send_packed_command
    assert (
        create_client(RedisStoreSettings(dsn=SecretStr(url))).connection_pool.connection_class
        is made
    )


@pytest.mark.parametrize(
    ("exc", "exhausted"),
    [
        (rex.MaxConnectionsError("Too many connections"), True),
        # redis-py before 8: a full asyncio ConnectionPool raises a plain ConnectionError.
        (rex.ConnectionError("Too many connections"), True),
        (rex.ConnectionError("Connection closed by server."), False),
        (rex.TimeoutError("Too many connections"), False),
    ],
)
def test_a_full_pool_is_told_from_a_dropped_connection(exc: BaseException, exhausted: bool) -> None:
    """A full pool is PoolExhaustedError, never retried as a server problem, on every redis-py."""
    assert is_pool_exhausted(exc) is exhausted
    assert is_transient(exc) is not exhausted
