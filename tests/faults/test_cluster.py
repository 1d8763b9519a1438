"""The Redis backings on a real Redis Cluster (three masters, three replicas, AOF on).

- All three conformance suites run unchanged through ``redis.asyncio.RedisCluster``.
- A tenant's state keys sit in one slot, and 100 tenants spread over every master.
- A queue namespace sits in one slot; two namespaces can sit on two masters,
  and both serve claims.
- A manual failover (``CLUSTER FAILOVER`` on a replica) in the middle of a
  state workload is waited out: no error reaches a caller, no call takes longer
  than the failover budget, and every acknowledged write and patch is there
  afterwards.
- ``WAIT 1`` latency on this cluster, for docs/faults.md.

The cluster is started once per session (``redis_cluster`` in conftest); each
test works under its own namespace or prefix, so tests never see each other's keys.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from statepact.clock import ManualClock, SystemClock
from statepact.errors import StatepactError
from statepact.models import RunRecord, WorkItem
from statepact.queue import QueuePolicy
from statepact.settings import RedisStoreSettings
from statepact.storage.redis import RedisBackend, RedisStateStore, RedisWorkQueue
from statepact.testing.cluster import LocalRedisCluster
from statepact.testing.queue_suite import WorkQueueConformance
from statepact.testing.state_suite import StateStoreConformance
from statepact.testing.tx_suite import TransactionConformance
from tests.faults.conftest import FaultFigure, FaultFigures

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# Redis Cluster clients wait for a paused master during a manual failover; the
# socket timeout must be longer than that pause, or a write times out instead.
CLUSTER_SOCKET_TIMEOUT = 2.0


def cluster_client(cluster: LocalRedisCluster) -> RedisCluster:
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in cluster.startup_nodes],
        socket_timeout=CLUSTER_SOCKET_TIMEOUT,
        socket_connect_timeout=CLUSTER_SOCKET_TIMEOUT,
    )


def _namespace() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def cluster_redis(redis_cluster: LocalRedisCluster) -> AsyncIterator[RedisCluster]:
    """A ``RedisCluster`` client on the session cluster; closed after the test."""
    client = cluster_client(redis_cluster)
    await client.initialize()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def cluster_settings() -> RedisStoreSettings:
    """Settings with a namespace of this test's own: nothing another test wrote is visible."""
    return RedisStoreSettings(namespace=_namespace())


async def _keys_on(port: int, pattern: str) -> list[bytes]:
    """Keys matching ``pattern`` held by the node on ``port`` (asked directly, not via the
    cluster client)."""
    client = Redis(host="127.0.0.1", port=port, socket_timeout=5.0)
    try:
        return [key async for key in client.scan_iter(match=pattern, count=1000)]
    finally:
        await client.aclose()


# -- the conformance suites, on the cluster --------------------------------------------------


@pytest.fixture
def state_store(
    cluster_redis: RedisCluster, clock: ManualClock, cluster_settings: RedisStoreSettings
) -> RedisStateStore:
    return RedisStateStore(cluster_redis, clock=clock, settings=cluster_settings)


@pytest.fixture
def work_queue(
    cluster_redis: RedisCluster,
    clock: ManualClock,
    queue_policy: QueuePolicy,
    cluster_settings: RedisStoreSettings,
) -> RedisWorkQueue:
    return RedisWorkQueue(
        cluster_redis, clock=clock, settings=cluster_settings, policy=queue_policy
    )


@pytest.fixture
async def tx_backend(
    cluster_redis: RedisCluster, clock: ManualClock
) -> AsyncIterator[RedisBackend]:
    backend = RedisBackend(cluster_redis, prefix=f"sp-{_namespace()}", clock=clock)
    try:
        yield backend
    finally:
        await backend.clear()
        await backend.close()


class TestClusterStateStore(StateStoreConformance):
    pass


class TestClusterWorkQueue(WorkQueueConformance):
    pass


class TestClusterTransactions(TransactionConformance):
    pass


# -- where the keys land -------------------------------------------------------------------------


async def test_state_for_100_tenants_lands_on_every_master(
    redis_cluster: LocalRedisCluster, state_store: RedisStateStore
) -> None:
    """Each tenant's keys share one slot (one master); 100 tenants cover all three masters."""
    namespace = state_store.settings.namespace
    for number in range(100):
        tenant = f"tenant-{number}"
        await state_store.put_run(RunRecord(tenant=tenant, run_id="r1", session_id="s1"))
        await state_store.patch_run(tenant, "r1", input_tokens=1)
    masters = redis_cluster.masters()
    assert len(masters) == 3
    where: dict[str, set[int]] = {}
    per_master: Counter[int] = Counter()
    for master in masters:
        for key in await _keys_on(master.port, f"{namespace}:state:*"):
            tag = key.split(b"{", 1)[1].split(b"}", 1)[0].decode()
            where.setdefault(tag, set()).add(master.port)
            per_master[master.port] += 1
    assert len(where) == 100
    assert all(len(ports) == 1 for ports in where.values()), "a tenant's keys span masters"
    assert set(per_master) == {m.port for m in masters}, per_master


async def test_queue_namespace_sits_in_one_slot_and_two_can_sit_on_two_masters(
    redis_cluster: LocalRedisCluster, cluster_redis: RedisCluster, clock: ManualClock
) -> None:
    """Every key of a queue namespace is in one slot; two namespaces chosen for different masters
    each hold their own items there, and both serve claims."""
    masters = redis_cluster.masters()
    chosen: dict[int, str] = {}
    for _ in range(500):
        namespace = _namespace()
        master = redis_cluster.master_of_slot(key_slot(f"{{{namespace}:queue}}".encode()))
        chosen.setdefault(master.port, namespace)
        if len(chosen) >= 2:
            break
    assert len(chosen) >= 2, "500 random namespaces all hashed to one master"
    (port_a, ns_a), (port_b, ns_b) = list(chosen.items())[:2]
    queues = {
        ns: RedisWorkQueue(cluster_redis, clock=clock, settings=RedisStoreSettings(namespace=ns))
        for ns in (ns_a, ns_b)
    }
    for ns, queue in queues.items():
        for number in range(5):
            await queue.enqueue(WorkItem(tenant=f"t{number % 2}", item_id=f"{ns}-{number}"))
    for ns, port in ((ns_a, port_a), (ns_b, port_b)):
        slots = set()
        for master in masters:
            keys = await _keys_on(master.port, f"{{{ns}:queue}}*")
            if master.port == port:
                assert keys, f"namespace {ns} has no keys on its master {port}"
            else:
                assert keys == [], f"namespace {ns} has keys on {master.port}, not only {port}"
            slots |= {key_slot(key) for key in keys}
        assert len(slots) == 1
    for ns, queue in queues.items():
        leases = await queue.claim_batch("w1", lease_for=30, limit=10)
        assert sorted(lease.item.item_id for lease in leases) == [f"{ns}-{n}" for n in range(5)]
        for lease in leases:
            await queue.ack(lease)


# -- WAIT ----------------------------------------------------------------------------------------


async def test_wait_for_one_replica_latency(
    redis_cluster: LocalRedisCluster, fault_figures: FaultFigures
) -> None:
    """Measures SET against SET + WAIT 1 on one master; WAIT 1 answers 1 (its replica acked)."""
    master = redis_cluster.masters()[0]
    # A key whose slot this master owns.
    key = next(
        f"{{w{n}}}:k" for n in range(10_000) if master.owns(key_slot(f"{{w{n}}}:k".encode()))
    )
    client = Redis(
        host="127.0.0.1", port=master.port, socket_timeout=5.0, single_connection_client=True
    )
    rounds = 200
    plain: list[float] = []
    waited: list[float] = []
    try:
        for number in range(rounds):
            began = time.perf_counter()
            await client.set(key, number)
            plain.append(time.perf_counter() - began)
        for number in range(rounds):
            began = time.perf_counter()
            await client.set(key, number)
            acked = await client.execute_command("WAIT", 1, 1000)
            waited.append(time.perf_counter() - began)
            assert acked == 1
        await client.delete(key)
    finally:
        await client.aclose()

    def ms(values: list[float], q: float) -> float:
        return round(statistics.quantiles(values, n=100)[int(q) - 1] * 1000, 3)

    fault_figures.record(
        FaultFigure(
            scenario="WAIT 1 latency (SET vs SET+WAIT 1)",
            backing="cluster",
            faults=0,
            acknowledged=rounds,
            found=rounds,
            lost=0,
            duplicates=0,
            notes={
                "set_p50_ms": ms(plain, 50),
                "set_p99_ms": ms(plain, 99),
                "set_wait1_p50_ms": ms(waited, 50),
                "set_wait1_p99_ms": ms(waited, 99),
            },
        )
    )


# -- failover under load -------------------------------------------------------------------------


async def test_manual_failover_during_state_workload_is_waited_out(
    redis_cluster: LocalRedisCluster,
    cluster_redis: RedisCluster,
    fault_figures: FaultFigures,
) -> None:
    """A replica takes over a master mid-workload, and hands it back: no error escapes, no call
    outlasts the failover budget, and every acknowledged put and patch is found afterwards."""
    settings = RedisStoreSettings(
        namespace=_namespace(), failover_attempts=8, failover_base_delay=0.05
    )
    policy = settings.retry_policy
    budget = policy.attempts * CLUSTER_SOCKET_TIMEOUT + policy.budget
    store = RedisStateStore(cluster_redis, clock=SystemClock(), settings=settings)
    tenants = [f"tenant-{n}" for n in range(30)]
    for tenant in tenants:
        await store.put_run(RunRecord(tenant=tenant, run_id="counter"))

    patched: Counter[str] = Counter()
    created: list[tuple[str, str]] = []
    errors: list[BaseException] = []
    slowest = 0.0
    stop = asyncio.Event()
    calls = 0

    async def worker(number: int) -> None:
        nonlocal slowest, calls
        rng = random.Random(number)
        for step in range(5000):
            if stop.is_set():
                return
            tenant = rng.choice(tenants)
            began = time.monotonic()
            try:
                if step % 5 == 4:
                    run_id = f"w{number}-{step}"
                    await store.put_run(RunRecord(tenant=tenant, run_id=run_id))
                    created.append((tenant, run_id))
                else:
                    await store.patch_run(tenant, "counter", iterations=1)
                    patched[tenant] += 1
            except StatepactError as exc:
                errors.append(exc)
            slowest = max(slowest, time.monotonic() - began)
            calls += 1

    # Fail over the master that holds the most of this test's tenants.
    by_master = Counter(
        redis_cluster.master_of_slot(key_slot(f"{{{len(t)}:{t}}}".encode())).node_id
        for t in tenants
    )
    target = next(m for m in redis_cluster.masters() if m.node_id == by_master.most_common(1)[0][0])
    replica = redis_cluster.replicas_of(target)[0]

    began = time.monotonic()
    async with asyncio.timeout(60):
        workers = [asyncio.create_task(worker(n)) for n in range(6)]
        await asyncio.sleep(0.5)
        # Over to the replica, then back: two failovers under the same load.
        took = [await asyncio.to_thread(redis_cluster.failover, replica.port, timeout=30.0)]
        await asyncio.sleep(0.5)
        assert redis_cluster.master_of_slot(target.slots[0][0]).port == replica.port
        took.append(await asyncio.to_thread(redis_cluster.failover, target.port, timeout=30.0))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*workers)
    elapsed = time.monotonic() - began

    assert redis_cluster.master_of_slot(target.slots[0][0]).port == target.port
    assert errors == [], errors[:3]
    assert slowest <= budget, (slowest, budget)
    found_patches = 0
    lost = 0
    for tenant in tenants:
        run = await store.get_run(tenant, "counter")
        assert run is not None
        found_patches += run.iterations
        # No patch errored, so none is ambiguous: the counter is exactly what was acknowledged.
        assert run.iterations == patched[tenant], tenant
    for tenant, run_id in created:
        if await store.get_run(tenant, run_id) is None:
            lost += 1
    assert lost == 0
    acknowledged = sum(patched.values()) + len(created)
    fault_figures.record(
        FaultFigure(
            scenario="manual failover x2 under state load",
            backing="cluster",
            faults=len(took),
            acknowledged=acknowledged,
            found=found_patches + len(created) - lost,
            lost=lost,
            duplicates=found_patches - sum(patched.values()),
            ambiguous=len(errors),
            seconds=elapsed,
            notes={
                "failover_s": [round(t, 3) for t in took],
                "slowest_call_s": round(slowest, 3),
                "budget_s": round(budget, 2),
                "calls": calls,
            },
        )
    )


# -- what asynchronous replication can lose (kept last: it crashes a master) -------------------


async def test_forced_takeover_after_a_master_crash_loses_unreplicated_writes(
    redis_cluster: LocalRedisCluster, fault_figures: FaultFigures
) -> None:
    """The limit docs/faults.md states: writes a master acknowledged before its replica had them
    are gone after the replica takes over; WAIT 1 would have said so (it answers 0)."""
    master = redis_cluster.masters()[0]
    replica = redis_cluster.replicas_of(master)[0]
    key = next(
        f"{{lost{n}}}" for n in range(10_000) if master.owns(key_slot(f"{{lost{n}}}".encode()))
    )
    client = Redis(
        host="127.0.0.1", port=master.port, socket_timeout=5.0, single_connection_client=True
    )
    replica_server = redis_cluster.server(replica.port)
    master_server = redis_cluster.server(master.port)
    assert replica_server.pid is not None
    try:
        await client.set(f"{key}:0", "replicated")
        assert await client.execute_command("WAIT", 1, 2000) == 1
        # Freeze the replica (our own process) and drop its link, so nothing the master
        # writes next reaches it, not even its socket buffer; the master goes on acknowledging.
        os.kill(replica_server.pid, signal.SIGSTOP)
        try:
            await client.execute_command("CLIENT", "KILL", "TYPE", "replica")
            for number in range(1, 11):
                assert await client.set(f"{key}:{number}", "acknowledged") is True
            unreplicated = await client.execute_command("WAIT", 1, 200)
        finally:
            await client.aclose()
            await asyncio.to_thread(master_server.kill)
            os.kill(replica_server.pid, signal.SIGCONT)
        assert unreplicated == 0
        took = await asyncio.to_thread(
            redis_cluster.call, replica.port, "CLUSTER", "FAILOVER", "TAKEOVER"
        )
        assert took == "OK"
        survivor = Redis(host="127.0.0.1", port=replica.port, socket_timeout=5.0)
        try:
            for _ in range(200):
                role = (await survivor.info("replication"))["role"]
                if role == "master":
                    break
                await asyncio.sleep(0.05)
            assert role == "master"
            found = [await survivor.get(f"{key}:{n}") for n in range(11)]
        finally:
            await survivor.aclose()
    finally:
        # The crashed master comes back as the new master's replica; the cluster settles.
        await asyncio.to_thread(master_server.start)
        await asyncio.to_thread(redis_cluster.wait_ok, 30.0)
    assert found[0] == b"replicated"
    lost = sum(1 for value in found[1:] if value is None)
    assert lost == 10, found
    fault_figures.record(
        FaultFigure(
            scenario="forced takeover after master crash (limit)",
            backing="cluster",
            faults=1,
            acknowledged=11,
            found=11 - lost,
            lost=lost,
            duplicates=0,
            notes={"wait_1_answered": unreplicated, "expected": "async replication loses these"},
        )
    )
