"""What only the Redis backings have, behind the fault proxy (the scenarios both backings share
are in ``test_proxy_scenarios.py``).

- ``ack_many`` cut after it applied is resent by the failover, and its replay
  key answers each lease as the first run did.
- redis-py 8.1 leaks a write on a connection closed under it as a bare
  ``AttributeError``; the boundary treats it as a dropped connection.
"""

from __future__ import annotations

import pytest

from statepact.errors import StatePersistenceError
from statepact.models import WorkItem
from tests.faults._proxied import ProxiedRedis
from tests.faults.conftest import FAST_FAILOVER

pytestmark = [pytest.mark.integration, pytest.mark.faults]


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
    proxied_redis: ProxiedRedis,
) -> None:
    """An ack_many cut after it applied is resent by the failover, and the resend answers
    what the first run did (its replay key keeps each lease's outcome): the live leases
    acked, the stale one lost. Without it the resend would find every token gone and
    report the acked leases lost."""
    proxy = proxied_redis.proxy
    queue = proxied_redis.queue(FAST_FAILOVER)
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
    checker = proxied_redis.queue()
    for lease, answer in zip(leases, done, strict=True):
        found = await checker.get_item("acme", lease.item.item_id)
        assert found is not None
        if isinstance(answer, WorkItem):
            assert found == answer
            assert found.status.value == "done"
        else:
            assert found.status.value == "leased"
    assert (await checker.ack(stale)).status.value == "done"
