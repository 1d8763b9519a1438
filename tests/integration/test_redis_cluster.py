"""The Redis backings on a real Redis Cluster: both conformance suites, unchanged, plus preflight.

A three-master cluster of local ``redis-server`` processes is formed once for
this module (``LocalRedisCluster``) and emptied before each test. Tenants of
the state store land in different slots, so the suite exercises scripts routed
to several nodes; a queue is one slot by design.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from statepact.clock import ManualClock
from statepact.errors import PreflightError
from statepact.models import RunRecord, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.redis import RedisStateStore, RedisWorkQueue, preflight
from statepact.storage.redis._keys import StateKeys
from statepact.storage.redis.preflight import read_server_configs
from statepact.testing.cluster import LocalRedisCluster
from statepact.testing.queue_suite import WorkQueueConformance
from statepact.testing.state_suite import StateStoreConformance

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster_client(local_cluster: LocalRedisCluster) -> AsyncIterator[RedisCluster]:
    """A ``redis.asyncio.RedisCluster`` on the cluster, every primary flushed first."""
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in local_cluster.startup_nodes]
    )
    await client.initialize()
    await client.flushdb(target_nodes=RedisCluster.PRIMARIES)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def state_store(cluster_client: RedisCluster, clock: ManualClock) -> RedisStateStore:
    return RedisStateStore(cluster_client, clock=clock)


@pytest.fixture
def work_queue(
    cluster_client: RedisCluster, clock: ManualClock, queue_policy: QueuePolicy
) -> RedisWorkQueue:
    return RedisWorkQueue(cluster_client, clock=clock, policy=queue_policy)


class TestStateStoreOnCluster(StateStoreConformance):
    """StateStoreConformance on RedisStateStore over a RedisCluster client."""


class TestWorkQueueOnCluster(WorkQueueConformance):
    """WorkQueueConformance on RedisWorkQueue over a RedisCluster client."""


async def test_tenants_spread_over_the_nodes(
    cluster_client: RedisCluster, local_cluster: LocalRedisCluster, clock: ManualClock
) -> None:
    """Runs of many tenants live on more than one master; each tenant's keys on one."""
    store = RedisStateStore(cluster_client, clock=clock)
    tenants = [f"tenant-{i}" for i in range(12)]
    for tenant in tenants:
        await store.put_run(RunRecord(tenant=tenant, run_id="r", session_id="s"))
        assert (await store.list_runs(tenant, session_id="s")).items[0].run_id == "r"
    keys = StateKeys()
    owners = set()
    for tenant in tenants:
        slots = {key_slot(key.encode()) for key in (keys.run(tenant, "r"), keys.runs(tenant))}
        assert len(slots) == 1
        owners.add(local_cluster.master_of_slot(slots.pop()).port)
    assert len(owners) > 1


async def test_a_queue_claims_across_tenants_on_a_cluster(
    cluster_client: RedisCluster, clock: ManualClock
) -> None:
    """One claim script serves several tenants of a queue: they share the queue's slot."""
    queue = RedisWorkQueue(cluster_client, clock=clock)
    for tenant in ("a", "b", "c"):
        await queue.enqueue(WorkItem(tenant=tenant, item_id="i"))
    leases = await queue.claim_batch("w", lease_for=30, limit=3)
    assert [lease.item.tenant for lease in leases] == ["a", "b", "c"]


async def test_preflight_reads_every_primary(
    cluster_client: RedisCluster, local_cluster: LocalRedisCluster
) -> None:
    """preflight checks each master; the cluster's AOF nodes pass, and open() works."""
    configs = await read_server_configs(cluster_client)
    assert len(configs) == 3
    assert {config.source for config in configs} == {"CONFIG"}
    assert all(config.appendonly for config in configs)
    await preflight(cluster_client)
    assert isinstance(await RedisStateStore.open(cluster_client), RedisStateStore)


async def test_preflight_is_a_fresh_cluster_clients_first_call(
    local_cluster: LocalRedisCluster,
) -> None:
    """A cluster client that has not met its nodes yet is still checked node by node."""
    fresh = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in local_cluster.startup_nodes]
    )
    try:
        configs = await read_server_configs(fresh)
        assert len(configs) == 3
        await preflight(fresh)
    finally:
        await fresh.aclose()


async def test_preflight_names_the_node_that_would_lose_data(
    cluster_client: RedisCluster, local_cluster: LocalRedisCluster
) -> None:
    """One master switched to allkeys-lru is refused by name; the others are fine."""
    port = local_cluster.ports[1]
    local_cluster.call(port, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(PreflightError) as caught:
            await preflight(cluster_client)
    finally:
        local_cluster.call(port, "CONFIG", "SET", "maxmemory-policy", "noeviction")
    assert len(caught.value.reasons) == 1
    assert f":{port}" in caught.value.reasons[0]
    assert "allkeys-lru" in caught.value.reasons[0]
