"""Transactions across real OS processes, on every server backing.

Each worker is a separate Python process (this module run as a script) that
builds its own backend from a URL with ``SystemClock`` (the processes share
real time, as a fleet of workers does), so nothing is shared but the server:

- hot key: 4 processes x 250 increments of one key through ``manager.run``
  end at exactly 1,000, and every value 1..1,000 was written exactly once;
- fencing under takeover: a lease holder is frozen with SIGSTOP past its TTL
  while others contend for the lease, then resumed with SIGCONT; tokens
  strictly increase, its late fenced commit is refused with ``FencingError``,
  and the history shows it never applied and never a token going backwards.

Both are bounded in processes, operations and time. Workers talk to the test
over JSON lines (stdout) and wait for ``go`` on stdin so they start together.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests._processes import Worker, reap_all, say, spawn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOT_PROCESSES = 4
HOT_INCREMENTS = 250
LEASE_TTL = 1.0
CONTENDERS = 3
TIME_LIMIT = 180.0  # seconds any one scenario may take, whatever the machine's load


# -- the worker side (this module run as a script) -----------------------------------------


async def _build(spec: dict[str, Any]) -> Any:
    """The backend a worker process builds for itself, from the URL the test gave it."""
    from statepact.clock import SystemClock

    if spec["kind"] == "redis":
        from statepact.storage.redis import RedisBackend

        # durable=False: the test server may keep nothing on disk; eviction is still checked.
        return await RedisBackend.connect(
            spec["url"], prefix=spec["prefix"], durable=False, clock=SystemClock()
        )
    from statepact.storage.postgres import PostgresBackend

    return await PostgresBackend.connect(spec["url"], clock=SystemClock(), max_size=2)


async def _wait_for_go() -> None:
    say(event="ready")
    line = await asyncio.to_thread(sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(f"worker: expected 'go', got {line!r}")


async def _hot_key_worker(manager: Any, spec: dict[str, Any]) -> None:
    from statepact.tx import Transaction

    async def increment(tx: Transaction) -> int:
        current = await tx.read("counters", "hot") or 0
        tx.write("counters", "hot", current + 1)
        return int(current + 1)

    await _wait_for_go()
    written = [await manager.run(increment, retries=1000) for _ in range(spec["increments"])]
    say(event="done", written=written)


async def _fenced_write(manager: Any, lease: Any, owner: str, n: int) -> None:
    async with manager.transaction(fencing=lease) as tx:
        tx.write("fenced", "state", {"owner": owner, "token": lease.token, "n": n})


async def _holder_worker(manager: Any, spec: dict[str, Any]) -> None:
    """Holds the lease, writing and renewing, until a write is refused (it was frozen)."""
    from statepact.errors import FencingError, LeaseLostError

    owner = spec["owner"]
    await _wait_for_go()  # the contenders are ready but wait for their own go
    lease = await manager.acquire_lease("job", owner, LEASE_TTL)
    if lease is None:
        raise SystemExit("holder: the lease was not free at the start")
    say(event="acquired", token=lease.token)
    acked: list[int] = []
    refused: list[dict[str, int]] = []
    renew_lost = False
    for n in range(1, 1000):
        await asyncio.sleep(0.05)  # a freeze lands here or in a call; either way the next
        try:  # write after SIGCONT is late
            await _fenced_write(manager, lease, owner, n)
        except FencingError as exc:
            refused.append({"n": n, "highest": exc.highest})
            if len(refused) >= 2:
                break
            continue
        acked.append(n)
        if len(acked) == 1:
            say(event="holding", token=lease.token)
        try:
            lease = await manager.renew_lease(lease)
        except LeaseLostError:
            renew_lost = True  # keep the old lease: the next write must be refused
    say(event="done", token=lease.token, acked=acked, refused=refused, renew_lost=renew_lost)


async def _contender_worker(manager: Any, spec: dict[str, Any]) -> None:
    """Tries for the lease until told to stop; each time it wins, a few fenced writes."""
    from statepact.errors import FencingError, LeaseLostError

    owner = spec["owner"]
    await _wait_for_go()
    tokens: list[int] = []
    acked: list[int] = []
    refused: list[int] = []
    stop = asyncio.create_task(asyncio.to_thread(sys.stdin.readline))
    n = 0
    while not stop.done() and len(tokens) < 20:
        lease = await manager.acquire_lease("job", owner, LEASE_TTL)
        if lease is None:
            await asyncio.sleep(0.02)
            continue
        tokens.append(lease.token)
        say(event="acquired", token=lease.token)
        for _ in range(3):
            n += 1
            try:
                await _fenced_write(manager, lease, owner, n)
                acked.append(n)
                lease = await manager.renew_lease(lease)
            except (FencingError, LeaseLostError):
                refused.append(n)  # lost it while the machine was slow: legal, and counted
                break
            await asyncio.sleep(0.02)
        await manager.release_lease(lease)
        await asyncio.sleep(0.05)
    await stop
    say(event="done", tokens=tokens, acked=acked, refused=refused)


async def _worker_main(spec: dict[str, Any]) -> None:
    from statepact.tx import TransactionManager

    backend = await _build(spec)
    manager = TransactionManager(backend)
    try:
        role = spec["role"]
        if role == "hot":
            await _hot_key_worker(manager, spec)
        elif role == "holder":
            await _holder_worker(manager, spec)
        else:
            await _contender_worker(manager, spec)
    finally:
        await manager.close()


# -- the test side --------------------------------------------------------------------------


@pytest.fixture(params=["redis", "postgres"])
def spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    """How a worker builds its backend: the server URL (and a fresh prefix or database)."""
    if request.param == "redis":
        url: str = request.getfixturevalue("statepact_redis_url")
        return {"kind": "redis", "url": url, "prefix": f"sp-proc-{uuid.uuid4().hex[:10]}"}
    url = request.getfixturevalue("pg_database_url")
    return {"kind": "postgres", "url": url}


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    """Started workers; any still running at the end is resumed and killed."""
    started: list[Worker] = []
    yield started
    await reap_all(started)


async def _start(workers: list[Worker], spec: dict[str, Any], **extra: Any) -> Worker:
    return await spawn(workers, "tests.integration.test_tx_processes", {**spec, **extra})


async def _finish(worker: Worker) -> dict[str, Any]:
    done = await worker.expect("done", TIME_LIMIT)
    assert await asyncio.wait_for(worker.process.wait(), 30) == 0
    return done


@pytest.fixture
async def view(spec: dict[str, Any]) -> AsyncIterator[Any]:
    """The test's own manager on the same data, built like a worker's; clears it afterwards."""
    from statepact.tx import TransactionManager

    manager = TransactionManager(await _build(spec))
    try:
        yield manager
    finally:
        await manager.backend.clear()
        await manager.close()


async def test_hot_key_increments_from_four_processes_all_land(
    spec: dict[str, Any], workers: list[Worker], view: Any
) -> None:
    """4 processes x 250 increments of one key via manager.run end at exactly 1,000, each value
    written once: no lost update across processes."""
    began = time.monotonic()
    for _ in range(HOT_PROCESSES):
        await _start(workers, spec, role="hot", increments=HOT_INCREMENTS)
    for worker in workers:
        await worker.expect("ready")
    for worker in workers:
        await worker.send("go")
    written = [value for worker in workers for value in (await _finish(worker))["written"]]
    assert sorted(written) == list(range(1, HOT_PROCESSES * HOT_INCREMENTS + 1))
    async with view.transaction() as tx:
        assert await tx.read("counters", "hot") == HOT_PROCESSES * HOT_INCREMENTS
    history = await view.history("counters", "hot", limit=5)
    assert [e.value for e in history] == [1000, 999, 998, 997, 996]
    assert time.monotonic() - began < TIME_LIMIT


async def test_a_frozen_lease_holders_late_commit_is_fenced(
    spec: dict[str, Any], workers: list[Worker], view: Any
) -> None:
    """A holder frozen (SIGSTOP) past its lease TTL while others take the lease over is refused
    with FencingError when it resumes (SIGCONT); tokens strictly increase and the history never
    shows its late write nor a token going backwards."""
    holder = await _start(workers, spec, role="holder", owner="holder")
    contenders = [
        await _start(workers, spec, role="contend", owner=f"contender-{i}")
        for i in range(CONTENDERS)
    ]
    for worker in [holder, *contenders]:
        await worker.expect("ready")
    # The holder takes the free lease and is writing under it before anyone contends.
    await holder.send("go")
    first = await holder.expect("acquired")
    await holder.expect("holding")
    for contender in contenders:
        await contender.send("go")
    await asyncio.sleep(LEASE_TTL / 2)  # contenders asking, refused: the holder renews
    assert not any(e["event"] == "done" for e in holder.events)

    holder.process.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    # Wait for a takeover: some contender acquires once the frozen holder's lease lapses.
    takeover = await asyncio.wait_for(
        asyncio.wait(
            [asyncio.create_task(c.expect("acquired")) for c in contenders],
            return_when=asyncio.FIRST_COMPLETED,
        ),
        TIME_LIMIT,
    )
    taken_token = next(iter(takeover[0])).result()["token"]
    for pending in takeover[1]:
        pending.cancel()
    frozen_for = time.monotonic() - frozen_at
    assert frozen_for >= LEASE_TTL * 0.5  # the lease ran out on the holder's own clock too
    assert taken_token > first["token"]
    holder.process.send_signal(signal.SIGCONT)

    held = await _finish(holder)
    for contender in contenders:
        await contender.send("stop")
    results = [await _finish(contender) for contender in contenders]

    assert held["refused"], "the resumed holder's fenced commit was not refused"
    assert all(r["highest"] > first["token"] for r in held["refused"])
    # Tokens: every one issued once, strictly increasing per process.
    tokens = [first["token"]] + [t for r in results for t in r["tokens"]]
    assert len(tokens) == len(set(tokens))
    for result in results:
        assert result["tokens"] == sorted(result["tokens"])
    assert min(t for r in results for t in r["tokens"]) > first["token"]

    history = await view.history("fenced", "state", limit=1000)
    entries = [e.value for e in reversed(history)]  # oldest first
    assert len(entries) < 500  # all of it retained (Redis keeps 512)
    # Exactly the acknowledged writes are there: the refused late ones never applied.
    by_owner: dict[str, list[int]] = {}
    for value in entries:
        by_owner.setdefault(value["owner"], []).append(value["n"])
    assert by_owner["holder"] == held["acked"]
    assert not {r["n"] for r in held["refused"]} & set(by_owner["holder"])
    for i, result in enumerate(results):
        assert by_owner.get(f"contender-{i}", []) == result["acked"]
    # Fencing in commit order: once a token was seen, no lower token ever wrote again.
    seen = [value["token"] for value in entries]
    assert seen == sorted(seen)
    assert seen[-1] > first["token"]


if __name__ == "__main__":
    asyncio.run(_worker_main(json.loads(sys.argv[1])))
