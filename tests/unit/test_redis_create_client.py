"""``create_client(settings)`` refusals and laziness, with no server (the rest is integration).

A missing DSN and a URL redis-py cannot read are ``ValueError`` naming ``dsn``,
with the password masked; building a client connects to nothing.
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr
from redis.asyncio import Redis, RedisCluster

from statepact.settings import RedisStoreSettings
from statepact.storage.redis import create_client

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
