"""Flow control under SIGKILLs: caps and a rate hold across worker processes (issue 35).

Six ``_flow_worker.py`` processes claim from one queue (Redis, then PostgreSQL) with
caps of 3 leased items per tenant and 5 per limit key and a rate of 40 weight per
second on the key ``llm``, while the test SIGKILLs one at random now and then and
starts another in its place (their leases come back through ``reap``, which the test
runs every 100 ms). Every 10 ms the test reads the leased items from the server (the
Redis lease set, PostgreSQL's leased rows) and counts them per tenant and per key
itself; the claims the workers logged (weight and the moment the queue counted it)
give the weight started in every window of one second. Asserted: no sample over a
cap, no window over the rate, and every item done, acked at most once.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statepact.models import ItemStatus, WorkItem
from statepact.queue import QueueLimits, Rate
from statepact.storage.redis._keys import QueueKeys, ref
from tests._processes import Worker, reap_all, spawn
from tests.integration._queue_worker import open_queue

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.integration]

MODULE = "tests.faults._flow_worker"
PROCESSES = 6
TENANTS = 3
PER_TENANT = 40
TENANT_CAP, KEY_CAP = 3, 5
RATE = Rate(weight=40, per=1.0)
KILLS = 6
TIME_LIMIT = 60.0


@pytest.fixture(params=["redis", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    from statepact.testing.namespaces import clear_namespace_at
    from tests.fixtures.postgres import run_in_thread

    policy = {"max_attempts": 100, "backoff_base": 0.05, "backoff_cap": 0.2, "jitter": 0.5}
    common = {
        "queue": "flow",
        "policy": policy,
        "lease": 1.0,
        "concurrency": 4,
        "dir": str(tmp_path),
    }
    if request.param == "postgres":
        url = request.getfixturevalue("fault_pg_url")
        yield {**common, "kind": "postgres", "url": url}
        return
    url = request.getfixturevalue("fault_redis_server").url
    namespace = f"sp-flow-{uuid.uuid4().hex[:10]}"
    yield {**common, "kind": "redis", "url": url, "namespace": namespace}
    run_in_thread(lambda: clear_namespace_at(url, namespace))


async def _leased_reader(queue: Any, spec: dict[str, Any]) -> Any:
    """What reads the leased items' refs from the server itself, once per sample."""
    if spec["kind"] == "redis":
        leases_key = QueueKeys(namespace=spec["namespace"], queue="flow").leases
        redis = queue._redis  # the test reads the server itself

        async def from_redis() -> list[str]:
            members = await redis.zrange(leases_key, 0, -1)
            return [m.decode() if isinstance(m, bytes) else m for m in members]

        return from_redis
    from sqlalchemy import select

    work = queue.tables.work
    statement = select(work.c.tenant, work.c.item_id).where(
        work.c.queue == "flow", work.c.status == "leased"
    )
    engine = queue.client  # the AsyncEngine the queue runs on

    async def from_postgres() -> list[str]:
        async with engine.connect() as conn:
            return [ref(tenant, item_id) for tenant, item_id in await conn.execute(statement)]

    return from_postgres


def _items() -> list[WorkItem]:
    rng = random.Random(35)
    items = []
    for t in range(TENANTS):
        for i in range(PER_TENANT):
            llm = i % 2 == 0
            items.append(
                WorkItem(
                    tenant=f"t{t}",
                    item_id=f"i{i:03d}",
                    limit_key="llm" if llm else "tool",
                    weight=rng.randint(1, 10) if llm else 1,
                )
            )
    return items


def _max_window(claims: list[tuple[int, int]], per_micros: int) -> int:
    """The most weight claimed in any window of ``per``: each claim as a window's end."""
    claims.sort()
    best, start, total = 0, 0, 0
    for end in range(len(claims)):
        total += claims[end][1]
        while claims[start][0] <= claims[end][0] - per_micros:
            total -= claims[start][1]
            start += 1
        best = max(best, total)
    return best


async def test_caps_and_a_rate_hold_across_killed_worker_processes(
    spec: dict[str, Any],
) -> None:
    queue, close = await open_queue({**spec, "pool_size": 4})
    workers: list[Worker] = []
    try:
        items = _items()
        key_of = {ref(i.tenant, i.item_id): (i.tenant, i.limit_key) for i in items}
        await queue.enqueue_many(items)
        await queue.set_limits(
            QueueLimits(per_tenant=TENANT_CAP, per_key=KEY_CAP, key_rates={"llm": RATE})
        )
        logs: list[Path] = []

        async def start() -> Worker:
            log = Path(spec["dir"]) / f"w{len(logs)}.log"
            logs.append(log)
            worker_spec = {**spec, "worker_id": f"w{len(logs)}", "log": str(log)}
            return await spawn(workers, MODULE, worker_spec)

        for _ in range(PROCESSES):
            await start()
        leased = await _leased_reader(queue, spec)
        worst_tenant, worst_key = Counter[str](), Counter[str]()
        samples, kills, rng = 0, 0, random.Random(7)
        started = time.monotonic()
        next_kill = started + 0.8
        next_reap = started
        while time.monotonic() - started < TIME_LIMIT:
            per_tenant, per_key = Counter[str](), Counter[str]()
            for member in await leased():
                tenant, key = key_of[member]
                per_tenant[tenant] += 1
                per_key[key or ""] += 1
            worst_tenant |= per_tenant
            worst_key |= per_key
            samples += 1
            now = time.monotonic()
            if now >= next_reap:
                await queue.reap()
                next_reap = now + 0.1
                stats = await queue.stats()
                if stats.queued == 0 and stats.leased == 0:
                    break
            if kills < KILLS and now >= next_kill:
                alive = [w for w in workers if w.process.returncode is None]
                victim = rng.choice(alive)
                victim.process.send_signal(signal.SIGKILL)
                await victim.process.wait()
                kills += 1
                await start()
                next_kill = now + rng.uniform(0.5, 1.2)
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - started
        await reap_all(workers)

        claims: list[tuple[int, int]] = []
        acked: Counter[tuple[str, str]] = Counter()
        for log in logs:
            if not log.exists():
                continue  # killed before it opened its log (it claimed nothing)
            for entry in log.read_text().splitlines():
                kind, tenant, item_id, *rest = entry.split()
                if kind == "claim" and key_of[ref(tenant, item_id)][1] == "llm":
                    claims.append((int(rest[1]), int(rest[0])))
                elif kind == "acked":
                    acked[(tenant, item_id)] += 1
        window = _max_window(claims, int(RATE.per.total_seconds() * 1_000_000))
        print(
            f"\nflow control under {kills} SIGKILLs, {samples} samples in {elapsed:.1f} s: "
            f"max leased per tenant {max(worst_tenant.values())} (cap {TENANT_CAP}), "
            f"per key {dict(worst_key)} (cap {KEY_CAP}), max llm weight in any 1 s window "
            f"{window} (rate {RATE.weight}), {len(claims)} llm claims logged"
        )
        assert elapsed < TIME_LIMIT, "the queue did not drain in time"
        assert kills == KILLS
        assert max(worst_tenant.values()) <= TENANT_CAP
        assert max(worst_key.values()) <= KEY_CAP
        assert window <= RATE.weight
        statuses: dict[ItemStatus, int] = defaultdict(int)
        for item in items:
            stored = await queue.get_item(item.tenant, item.item_id)
            assert stored is not None
            statuses[stored.status] += 1
        assert statuses == {ItemStatus.DONE: len(items)}
        assert max(acked.values()) == 1
    finally:
        await reap_all(workers)
        await close()
