"""The WorkQueue under crashing workers, on real Redis and PostgreSQL servers.

2,000 items across 5 tenants are drained by 4 worker processes
(``_queue_worker.py``, each with its own client or engine and ``SystemClock``)
while the test SIGKILLs a worker every 1-2 s, at most 15 times, and starts a
new one in its place. Three kills in four go to a worker whose log shows it
asleep holding a lease (its "work"); the rest hit any running worker, wherever
it is (inside a claim, a reap, an ack). The leases of the dead come back
through ``reap`` once they lapse (1.5 s). A few times instead, a lease holder
is frozen (SIGSTOP) until another worker has reclaimed its item, then resumed
(SIGCONT): its late ack must raise ``LeaseLostError``.

At the end, from the queue's own record: every item is done, nothing is
queued, leased or dead. From the workers' fsynced logs: no lease token was
issued twice, no item was acked successfully twice, every successful ack
carried the item's last lease token, every frozen worker's stale ack was
refused, every item a kill left mid-lease was claimed again and finished by
another worker, every item without a logged ack had its ack in flight at a
kill, and the kills and freezes really did land mid-lease (so the test cannot
pass vacuously). Bounded: 90 s of draining per backing at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from statepact.models import ItemStatus, WorkItem
from statepact.queue import BaseWorkQueue
from tests._processes import Worker, reap_all, spawn
from tests.integration._queue_worker import open_queue

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKER_MODULE = "tests.integration._queue_worker"
ITEMS = 2_000
TENANTS = 5
WORKERS = 4
LEASE = 1.5  # seconds: short, so a killed worker's items come back quickly
WORK = 0.02  # seconds asleep holding each lease: where most kills land
KILL_EVERY = (1.0, 2.0)  # seconds between kills, drawn uniformly
MAX_KILLS = 15
# Share of kills aimed at a worker whose log shows it holding a lease; the rest land
# anywhere (inside a claim, reap or ack call, or between items).
TARGETED = 0.75
# On turns 2, 2 + FREEZE_EVERY, ... (at most MAX_FREEZES times) a lease holder is frozen
# with SIGSTOP instead, until another worker has reaped and reclaimed its item, then
# resumed: its ack is then stale and must raise LeaseLostError.
FREEZE_EVERY = 4
MAX_FREEZES = 3
TAKEOVER_WAIT = 20.0  # seconds a frozen worker's item may take to be reclaimed
TIME_LIMIT = 90.0  # seconds of draining, whatever the machine's load
# High enough that no number of kills can dead-letter an item.
POLICY = {"max_attempts": 50}
QUEUE = "crash"

Key = tuple[str, str]  # (tenant, item_id)


@pytest.fixture(params=["redis", "postgres"])
def spec(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """How a worker opens the queue: the server URL, and a fresh namespace or database."""
    base = {"queue": QUEUE, "policy": POLICY, "lease": LEASE, "work": WORK}
    if request.param == "postgres":
        yield {**base, "kind": "postgres", "url": request.getfixturevalue("pg_database_url")}
        return
    from redis import Redis

    from statepact.storage.redis._keys import QueueKeys, glob_escape

    url: str = request.getfixturevalue("statepact_redis_url")
    namespace = f"sp-crash-{uuid.uuid4().hex[:10]}"
    yield {**base, "kind": "redis", "url": url, "namespace": namespace}
    # A namespace of its own, so no FLUSHDB: other tests may share this database.
    with Redis.from_url(url) as client:
        pattern = glob_escape(QueueKeys(namespace, QUEUE).prefix) + "*"
        keys = list(client.scan_iter(match=pattern, count=1000))
        for start in range(0, len(keys), 1000):
            client.unlink(*keys[start : start + 1000])


@dataclass
class Incarnation:
    """One worker process in one slot: its log, its stderr, whether the test killed it."""

    slot: int
    number: int
    worker: Worker
    log: Path
    err: Path
    ready: asyncio.Task[dict[str, Any]]
    killed: bool = False
    # (item, token) of each lease this worker held while the test froze it.
    frozen: list[tuple[Key, int]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"w{self.slot}-{self.number}"

    @property
    def running(self) -> bool:
        """Started, queue opened (``ready`` seen) and not exited."""
        return (
            self.worker.process.returncode is None
            and self.ready.done()
            and not self.ready.cancelled()
            and self.ready.exception() is None
        )

    def holds_lease(self) -> bool:
        """Whether its log ends in a claim: it is asleep in its 'work', holding the lease."""
        with contextlib.suppress(FileNotFoundError), self.log.open("rb") as log:
            size = log.seek(0, 2)
            log.seek(max(0, size - 200))
            lines = log.read().splitlines()
            return bool(lines) and lines[-1].startswith(b"claim ")
        return False

    def last_entry(self) -> tuple[str, Key, int] | None:
        entries = self.entries()
        return entries[-1] if entries else None

    def outcome(self, token: int) -> str | None:
        """How this worker's ack of the lease ``token`` ended: ``acked``, ``lost`` or not yet."""
        for kind, _, logged in self.entries():
            if logged == token and kind in ("acked", "lost"):
                return kind
        return None

    def entries(self) -> list[tuple[str, Key, int]]:
        """The log as ``(kind, (tenant, item_id), token)``, oldest first."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            kind, tenant, item_id, token = line.split(" ")
            out.append((kind, (tenant, item_id), int(token)))
        return out


@dataclass
class Fleet:
    """The worker slots, each running its latest incarnation, and every incarnation so far."""

    spec: dict[str, Any]
    directory: Path
    processes: list[Worker]
    files: contextlib.ExitStack
    current: dict[int, Incarnation] = field(default_factory=dict)
    history: list[Incarnation] = field(default_factory=list)

    async def start(self, slot: int) -> Incarnation:
        """A new worker in ``slot``; it becomes ``running`` once it has opened the queue."""
        number = len(self.history)
        log = self.directory / f"w{slot}-{number}.log"
        err = self.directory / f"w{slot}-{number}.err"
        stderr: IO[bytes] = self.files.enter_context(err.open("wb"))
        spec = {**self.spec, "worker_id": f"w{slot}-{number}", "log": str(log)}
        worker = await spawn(self.processes, WORKER_MODULE, spec, stderr=stderr)
        # Started without waiting: the kills go on while a replacement boots.
        ready = asyncio.create_task(worker.expect("ready", 60))
        incarnation = Incarnation(slot, number, worker, log, err, ready)
        self.current[slot] = incarnation
        self.history.append(incarnation)
        return incarnation

    async def pick(self, rng: random.Random) -> Incarnation | None:
        """A running worker to kill: mostly one holding a lease, sometimes any (mid-call)."""
        running = [i for i in self.current.values() if i.running]
        if not running:
            return None
        if rng.random() < TARGETED:
            holder = await self.pick_holder(rng)
            if holder is not None:
                return holder
        return rng.choice(running)

    async def pick_holder(self, rng: random.Random) -> Incarnation | None:
        """A running worker whose log shows it holding a lease, polled for up to 0.5 s."""
        for _ in range(50):
            holding = [i for i in self.current.values() if i.running and i.holds_lease()]
            if holding:
                return rng.choice(holding)
            await asyncio.sleep(0.01)
        return None

    async def freeze(self, incarnation: Incarnation, view: BaseWorkQueue) -> bool:
        """SIGSTOP a lease holder until another worker has reclaimed its item, then SIGCONT
        and wait for its ack's outcome. False when it had moved past its lease first."""
        incarnation.worker.process.send_signal(signal.SIGSTOP)
        try:
            last = incarnation.last_entry()  # stable now: the process cannot write
            if last is None or last[0] != "claim":
                return False
            _, key, token = last
            record = await view.get_item(*key)
            assert record is not None
            attempts = record.attempts
            deadline = time.monotonic() + TAKEOVER_WAIT
            while record is not None and record.attempts <= attempts:
                assert time.monotonic() < deadline, f"{key} not reclaimed: {record}"
                await asyncio.sleep(0.1)
                record = await view.get_item(*key)
            incarnation.frozen.append((key, token))
        finally:
            incarnation.worker.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + TAKEOVER_WAIT
        while incarnation.outcome(token) is None:
            assert time.monotonic() < deadline, f"{incarnation.name}: no ack outcome after resume"
            await asyncio.sleep(0.05)
        return True

    async def kill(self, incarnation: Incarnation) -> None:
        incarnation.worker.process.kill()
        await incarnation.worker.process.wait()
        incarnation.killed = True

    def failure(self, incarnation: Incarnation) -> str:
        code = incarnation.worker.process.returncode
        return f"worker {incarnation.name} exited {code}:\n{incarnation.err.read_text()[-3000:]}"

    def check(self) -> None:
        """Fail at once on a worker that crashed by itself or never got ready."""
        for incarnation in self.current.values():
            code = incarnation.worker.process.returncode
            failed_start = incarnation.ready.done() and incarnation.ready.exception() is not None
            if code not in (None, 0) or failed_start:
                raise AssertionError(self.failure(incarnation))

    async def finish(self, incarnation: Incarnation) -> dict[str, Any]:
        """Wait for a worker to drain and exit 0 by itself; its ``done`` event."""
        try:
            await asyncio.wait_for(asyncio.shield(incarnation.ready), 60)
            done = await incarnation.worker.expect("done", 30)
        except AssertionError:
            await incarnation.worker.process.wait()
            raise AssertionError(self.failure(incarnation)) from None
        code = await asyncio.wait_for(incarnation.worker.process.wait(), 30)
        assert code == 0, self.failure(incarnation)
        return done


@pytest.fixture
async def fleet(spec: dict[str, Any], tmp_path: Path) -> AsyncIterator[Fleet]:
    processes: list[Worker] = []
    with contextlib.ExitStack() as files:
        fleet = Fleet(spec, tmp_path, processes, files)
        try:
            yield fleet
        finally:
            await reap_all(processes)
            for incarnation in fleet.history:
                incarnation.ready.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await incarnation.ready


@pytest.fixture
async def view(spec: dict[str, Any]) -> AsyncIterator[BaseWorkQueue]:
    """The test's own handle on the queue, opened exactly as a worker opens it."""
    queue, close = await open_queue({**spec, "pool_size": 8})
    try:
        yield queue
    finally:
        await close()


@dataclass
class Tally:
    """What the workers' logs say they did, and where each kill landed."""

    claims: dict[Key, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    acked: dict[Key, list[int]] = field(default_factory=lambda: defaultdict(list))
    lost: list[tuple[Key, int]] = field(default_factory=list)
    # A killed worker's log ends in a claim: it died holding that lease (item, token, worker).
    mid_lease: list[tuple[Key, int, str]] = field(default_factory=list)
    # ... or in an ack intent: it died with the ack in flight (it may or may not have applied).
    mid_ack: list[Key] = field(default_factory=list)
    # Each lease whose holder was frozen until another worker reclaimed the item: how its
    # late ack ended (item, token, "acked" | "lost" | None).
    frozen: list[tuple[Key, int, str | None]] = field(default_factory=list)

    @classmethod
    def of(cls, incarnations: list[Incarnation]) -> Tally:
        tally = cls()
        for incarnation in incarnations:
            entries = incarnation.entries()
            for kind, key, token in entries:
                if kind == "claim":
                    tally.claims[key].append((token, incarnation.name))
                elif kind == "acked":
                    tally.acked[key].append(token)
                elif kind == "lost":
                    tally.lost.append((key, token))
            for key, token in incarnation.frozen:
                tally.frozen.append((key, token, incarnation.outcome(token)))
            if incarnation.killed and entries:
                kind, key, token = entries[-1]
                if kind == "claim":
                    tally.mid_lease.append((key, token, incarnation.name))
                elif kind == "ack":
                    tally.mid_ack.append(key)
        return tally


async def _enqueue_all(queue: BaseWorkQueue) -> list[Key]:
    keys = [(f"t{n % TENANTS}", f"item-{n:04d}") for n in range(ITEMS)]
    for start in range(0, ITEMS, 8):  # a few in flight at once, within the pool
        await asyncio.gather(
            *(
                queue.enqueue(WorkItem(tenant=tenant, item_id=item_id, payload={"n": n}))
                for n, (tenant, item_id) in enumerate(keys[start : start + 8], start)
            )
        )
    return keys


async def _records(queue: BaseWorkQueue, keys: list[Key]) -> dict[Key, WorkItem | None]:
    records: dict[Key, WorkItem | None] = {}
    for start in range(0, len(keys), 8):
        chunk = keys[start : start + 8]
        found = await asyncio.gather(*(queue.get_item(tenant, item) for tenant, item in chunk))
        records.update(zip(chunk, found, strict=True))
    return records


async def test_crashing_workers_drain_every_item_exactly_once(
    spec: dict[str, Any], fleet: Fleet, view: BaseWorkQueue
) -> None:
    """4 workers drain 2,000 items while one is SIGKILLed mid-lease every 1-2 s and restarted:
    every item ends done exactly once, none lost, none dead, no stale ack ever applied."""
    began = time.monotonic()
    keys = await _enqueue_all(view)
    enqueued_in = time.monotonic() - began
    assert (await view.stats()).queued == ITEMS

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for slot in range(WORKERS):
        await fleet.start(slot)
    await asyncio.wait_for(asyncio.gather(*(i.ready for i in fleet.history)), 60)
    drain_began = time.monotonic()
    kills = freezes = turn = 0
    while True:
        await asyncio.sleep(rng.uniform(*KILL_EVERY))
        fleet.check()
        stats = await view.stats()
        if stats.queued == 0 and stats.leased == 0:
            break
        elapsed = time.monotonic() - drain_began
        assert elapsed < TIME_LIMIT, f"not drained after {elapsed:.0f} s: {stats} (seed {seed})"
        turn += 1
        if freezes < MAX_FREEZES and turn % FREEZE_EVERY == 2:
            holder = await fleet.pick_holder(rng)
            if holder is not None and await fleet.freeze(holder, view):
                freezes += 1
                continue
        victim = await fleet.pick(rng) if kills < MAX_KILLS else None
        if victim is not None:
            await fleet.kill(victim)
            kills += 1
            await fleet.start(victim.slot)
    for incarnation in fleet.current.values():
        await fleet.finish(incarnation)
    drained_in = time.monotonic() - drain_began

    records = await _records(view, keys)
    stats = await view.stats()
    seen = Tally.of(fleet.history)
    reclaimed = sum(1 for r in records.values() if r is not None and r.attempts > 1)
    print(
        f"\nqueue crash [{spec['kind']}]: {ITEMS} items, {TENANTS} tenants, {WORKERS} workers, "
        f"{len(fleet.history)} processes started; {kills} SIGKILLs: "
        f"{len(seen.mid_lease)} mid-lease, {len(seen.mid_ack)} mid-ack, "
        f"{kills - len(seen.mid_lease) - len(seen.mid_ack)} elsewhere; "
        f"{freezes} SIGSTOPs past the lease; {reclaimed} items claimed more than once; "
        f"{len(seen.lost)} LeaseLostErrors on ack; "
        f"enqueue {enqueued_in:.1f} s, drain {drained_in:.1f} s (seed {seed})"
    )

    # -- the queue's own record ------------------------------------------------------------
    not_done = [k for k, r in records.items() if r is None or r.status != ItemStatus.DONE]
    assert not_done == [], f"{len(not_done)} not done: {[records[k] for k in not_done[:3]]}"
    assert (stats.queued, stats.leased, stats.dead) == (0, 0, 0)
    for tenant in sorted({tenant for tenant, _ in keys}):
        assert await view.dead_letters(tenant) == []

    # -- what the workers did, from their logs ---------------------------------------------
    # A token is issued once: no two leases ever shared one.
    tokens = Counter(token for held in seen.claims.values() for token, _ in held)
    assert [t for t, n in tokens.items() if n > 1] == []
    # The fencing promise: never two successful acks of one item.
    twice = {key: ts for key, ts in seen.acked.items() if len(ts) > 1}
    assert not twice, f"items acked successfully more than once: {twice}"
    # Each successful ack was by the item's last lease: nobody claimed it after it was done.
    for key, (token,) in seen.acked.items():
        assert token == max(t for t, _ in seen.claims[key]), (key, token, seen.claims[key])
    for key, token in seen.lost:
        assert seen.acked.get(key) != [token], f"{key}: one token both acked and lost"
    # A worker frozen past its lease while another reclaimed the item: its late ack is refused.
    assert [f for f in seen.frozen if f[2] != "lost"] == []
    # An item is done with no successful ack logged only when the ack was in flight at a kill.
    unlogged = set(keys) - set(seen.acked)
    assert unlogged <= set(seen.mid_ack), f"never acked: {sorted(unlogged - set(seen.mid_ack))}"
    # Every item a kill left mid-lease came back and was finished by another worker.
    for key, token, name in seen.mid_lease:
        later = [(t, who) for t, who in seen.claims[key] if t > token]
        assert later and all(who != name for _, who in later), (key, token, seen.claims[key])
    # Every claim logged counted an attempt (a claim cut off before its log line did too).
    for key, held in seen.claims.items():
        record = records[key]
        assert record is not None and record.attempts >= len(held), (key, record, held)

    assert kills > 0
    assert freezes > 0 and seen.lost, "no stale ack was ever tried: fencing went unexercised"
    assert seen.mid_lease, "no kill landed while a worker held a lease: the test proved nothing"
    assert reclaimed >= len({key for key, _, _ in seen.mid_lease})
