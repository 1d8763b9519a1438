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
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from statepact.queue import BaseWorkQueue
from tests.integration._fleet import (
    ITEMS,
    TENANTS,
    Fleet,
    Key,
    Member,
    assert_all_done,
    assert_issued_once,
    enqueue_all,
    fleet_of,
    reclaimed_count,
    records_of,
    spec,
    view,
)

__all__ = ["spec", "view"]  # the fleet's fixtures, used here as they are

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKER_MODULE = "tests.integration._queue_worker"
WORKERS = 4
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


class Incarnation(Member):
    """A ``_queue_worker.py`` process: its log says what it claimed and how each ack ended."""

    def holds_lease(self) -> bool:
        """Whether its log ends in a claim: it is asleep in its 'work', holding the lease."""
        with contextlib.suppress(FileNotFoundError), self.log.open("rb") as log:
            size = log.seek(0, 2)
            log.seek(max(0, size - 200))
            lines = log.read().splitlines()
            return bool(lines) and lines[-1].startswith(b"claim ")
        return False

    def outcome(self, token: int) -> str | None:
        """How this worker's ack of the lease ``token`` ended: ``acked``, ``lost`` or not yet."""
        for kind, _, logged in self.entries():
            if logged == token and kind in ("acked", "lost"):
                return kind
        return None


async def last_claim(incarnation: Incarnation) -> tuple[Key, int] | None:
    """The lease a stopped worker holds: its log's last line, when that is a claim."""
    entries = incarnation.entries()
    if not entries or entries[-1][0] != "claim":
        return None
    _, key, token = entries[-1]
    return key, token


async def pick_holder(fleet: Fleet[Incarnation], rng: random.Random) -> Incarnation | None:
    """A running worker whose log shows it holding a lease, polled for up to 0.5 s."""
    for _ in range(50):
        holding = [i for i in fleet.running() if i.holds_lease()]
        if holding:
            return rng.choice(holding)
        await asyncio.sleep(0.01)
    return None


async def pick(fleet: Fleet[Incarnation], rng: random.Random) -> Incarnation | None:
    """A running worker to kill: mostly one holding a lease, sometimes any (mid-call)."""
    running = fleet.running()
    if not running:
        return None
    if rng.random() < TARGETED:
        holder = await pick_holder(fleet, rng)
        if holder is not None:
            return holder
    return rng.choice(running)


async def freeze_past_its_lease(
    fleet: Fleet[Incarnation], holder: Incarnation, view: BaseWorkQueue
) -> bool:
    """SIGSTOP a lease holder until another worker has reclaimed its item, then SIGCONT and
    wait for its ack's outcome. False when it had moved past its lease first."""
    frozen = await fleet.freeze(holder, view, last_claim)
    if frozen is None:
        return False
    _, token = frozen
    await fleet.until(
        lambda: holder.outcome(token) is not None, f"{holder.name}: no ack outcome after resume"
    )
    return True


@pytest.fixture
async def fleet(spec: dict[str, Any], tmp_path: Path) -> AsyncIterator[Fleet[Incarnation]]:
    async with fleet_of(Incarnation, WORKER_MODULE, {**spec, "work": WORK}, tmp_path) as fleet:
        yield fleet


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


async def test_crashing_workers_drain_every_item_exactly_once(
    spec: dict[str, Any], fleet: Fleet[Incarnation], view: BaseWorkQueue
) -> None:
    """4 workers drain 2,000 items while one is SIGKILLed mid-lease every 1-2 s and restarted:
    every item ends done exactly once, none lost, none dead, no stale ack ever applied."""
    began = time.monotonic()
    keys = await enqueue_all(view)
    enqueued_in = time.monotonic() - began
    assert (await view.stats()).queued == ITEMS

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    await fleet.start_all(WORKERS)
    drain_began = time.monotonic()
    kills = freezes = 0
    async for turn in fleet.turns(view, rng, KILL_EVERY, seed):
        if freezes < MAX_FREEZES and turn % FREEZE_EVERY == 2:
            holder = await pick_holder(fleet, rng)
            if holder is not None and await freeze_past_its_lease(fleet, holder, view):
                freezes += 1
                continue
        victim = await pick(fleet, rng) if kills < MAX_KILLS else None
        if victim is not None:
            await fleet.kill(victim)
            kills += 1
    await fleet.finish()
    drained_in = time.monotonic() - drain_began

    records = await records_of(view, keys)
    stats = await view.stats()
    seen = Tally.of(fleet.history)
    reclaimed = reclaimed_count(records)
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
    assert_all_done(records, stats)
    for tenant in sorted({tenant for tenant, _ in keys}):
        assert await view.dead_letters(tenant) == []

    # -- what the workers did, from their logs ---------------------------------------------
    assert_issued_once(token for held in seen.claims.values() for token, _ in held)
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
