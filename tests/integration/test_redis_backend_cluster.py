"""RedisBackend on a real Redis Cluster (three masters): connect, one slot, atomic scripts.

The whole transaction conformance suite also runs on a cluster in the fault
lane (``tests/faults/test_cluster.py``); this module checks what ``connect``
and the key layout promise there: ``RedisBackend.connect(url, cluster=True)``
preflights every primary, and every key of one backend lands in one slot, so
each script's keys are local to one node.
"""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import RedisCluster
from redis.crc import key_slot

from statepact.clock import ManualClock
from statepact.errors import PreflightError
from statepact.storage.redis import RedisBackend
from statepact.storage.redis._keys import TxKeys
from statepact.testing.cluster import LocalRedisCluster
from statepact.tx import TransactionManager

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_connect_preflights_and_keeps_a_backend_in_one_slot(
    local_cluster: LocalRedisCluster,
) -> None:
    """connect(cluster=True) checks every primary; all keys share the prefix's slot and
    commits, snapshots, locks, leases and clear work across resources."""
    clock = ManualClock()
    prefix = f"sp-cl-{uuid.uuid4().hex[:8]}"
    backend = await RedisBackend.connect(
        local_cluster.url, cluster=True, prefix=prefix, clock=clock
    )
    manager = TransactionManager(backend)
    probe = RedisCluster.from_url(local_cluster.url)
    try:
        async with manager.transaction("serializable", idempotency_key="k1") as tx:
            for i in range(12):  # resources and keys that hash to every node
                assert await tx.read(f"res-{i}", f"key-{i}") is None
                tx.write(f"res-{i}", f"key-{i}", {"i": i})
        assert tx.result.version == 1
        snapshot = await manager.begin("snapshot")
        async with manager.transaction() as tx:
            tx.delete("res-3", "key-3")
        assert await snapshot.read("res-3", "key-3") == {"i": 3}
        await snapshot.rollback()
        lease = await manager.acquire_lease("job", "w1", 10)
        assert lease is not None
        holder = await manager.begin()
        await holder.lock("res-1", "key-1")

        keys = [key async for key in probe.scan_iter(match=TxKeys(prefix).match_all)]
        assert len(keys) > 30
        assert {key_slot(key) for key in keys} == {key_slot(TxKeys(prefix).seq.encode())}
        # The keys' own spread would have crossed slots without the hash tag.
        assert len({key_slot(key.replace(b"{", b"").replace(b"}", b"")) for key in keys}) > 3

        await holder.rollback()
        await backend.clear()
        assert [key async for key in probe.scan_iter(match=TxKeys(prefix).match_all)] == []
        assert (await backend.begin("t")).sequence == 0
    finally:
        await probe.aclose()
        await backend.close()


async def test_connect_refuses_a_cluster_with_an_evicting_primary(
    local_cluster: LocalRedisCluster,
) -> None:
    """One primary set to evict keys is enough for connect(cluster=True) to refuse, naming it."""
    port = local_cluster.ports[1]
    local_cluster.call(port, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(PreflightError) as caught:
            await RedisBackend.connect(local_cluster.url, cluster=True)
        assert len(caught.value.reasons) == 1
        assert str(port) in caught.value.reasons[0]
        assert "maxmemory-policy" in caught.value.reasons[0]
    finally:
        local_cluster.call(port, "CONFIG", "SET", "maxmemory-policy", "noeviction")
