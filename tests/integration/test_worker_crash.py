"""The Worker under crashing processes, on real Redis and PostgreSQL servers.

2,000 items across 5 tenants (enqueued as ``test_queue_crash.py`` does) are
drained by 4 processes each running a ``Worker`` with 4 slots
(``_worker_process.py``: heartbeats every 0.5 s on a 1.5 s lease, its own reaper),
while the test SIGKILLs one every 0.5-1 s (at most 12 times; mostly while its log
shows handlers in flight) and starts a new one in its place. Twice, a process with
a handler in flight is frozen instead (SIGSTOP: its heartbeats stop) until another
worker has reclaimed that item, then resumed: its Worker must find the lease lost
and settle nothing for it.

At the end, from the queue's own record: every item is done, nothing queued,
leased or dead. From the processes' fsynced logs: each item was acked successfully
exactly once, and with the newest token any worker ever held for it (claim or
heartbeat): no settle with a superseded token; an item with no logged ack had its
handler in flight in a killed process; every frozen lease ended "lost"; kills did
land mid-handler. Bounded: 90 s of draining per backing at most.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from statepact.models import ItemStatus
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

MODULE = "tests.integration._worker_process"
PROCESSES = 4
WORKER = {
    "concurrency": 4,
    "lease": 1.5,
    "heartbeat": 0.5,
    "reap": 0.5,
    "work": 0.05,
    "long_every": 25,
    "long_work": 1.2,
}
KILL_EVERY = (0.5, 1.0)
MAX_KILLS = 12
MAX_FREEZES = 2
FREEZE_TURNS = (3, 8)  # the turns on which a freeze is tried instead of a kill
TERMINAL = ("acked", "lost", "failed")


class Process(Member):
    """A ``_worker_process.py`` process: its log says which handlers ran and how they ended."""

    prefix = "p"

    def in_flight(self) -> dict[Key, int]:
        """Items whose handler started here and that reached no terminal line: the latest token."""
        open_: dict[Key, int] = {}
        for kind, key, token in self.entries():
            if kind in ("claim", "beat"):
                open_[key] = token
            elif kind in TERMINAL:
                open_.pop(key, None)
        return open_


def busy(fleet: Fleet[Process]) -> list[Process]:
    return [p for p in fleet.running() if p.in_flight()]


async def freeze_a_handler(fleet: Fleet[Process], process: Process, view: BaseWorkQueue) -> bool:
    """SIGSTOP a process with a handler in flight until another worker has reclaimed that
    item, then SIGCONT; wait for its Worker to log the lease lost."""

    async def handler(stopped: Process) -> tuple[Key, int] | None:
        held = stopped.in_flight()  # stable now: the process cannot write
        if not held:
            return None
        key, token = next(iter(held.items()))
        record = await view.get_item(*key)
        assert record is not None
        if record.status != ItemStatus.LEASED:
            return None  # settled in the moment before the stop; nothing to take over
        return key, token

    frozen = await fleet.freeze(process, view, handler)
    if frozen is None:
        return False
    key, _ = frozen
    await fleet.until(
        lambda: any(k == "lost" and e == key for k, e, _ in process.entries()),
        f"{process.name}: {key} not found lost on resume",
    )
    return True


@pytest.fixture
async def fleet(spec: dict[str, Any], tmp_path: Path) -> AsyncIterator[Fleet[Process]]:
    async with fleet_of(Process, MODULE, {**spec, **WORKER}, tmp_path) as fleet:
        yield fleet


async def test_workers_killed_mid_handler_lose_nothing_and_ack_each_item_once(
    spec: dict[str, Any], fleet: Fleet[Process], view: BaseWorkQueue
) -> None:
    """4 Worker processes drain 2,000 items while one is SIGKILLed mid-handler every 0.5-1 s:
    0 lost, each item acked once, with its newest token; frozen heartbeats end in a lost lease."""
    keys = await enqueue_all(view)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    await fleet.start_all(PROCESSES)
    began = time.monotonic()
    kills = freezes = 0
    # Items in flight in a process at the moment it was killed (their handler or ack cut off).
    cut: set[Key] = set()
    async for turn in fleet.turns(view, rng, KILL_EVERY, seed):
        working = busy(fleet)
        if turn in FREEZE_TURNS and freezes < MAX_FREEZES and working:
            if await freeze_a_handler(fleet, rng.choice(working), view):
                freezes += 1
            continue
        if kills < MAX_KILLS:
            victims = working if working and rng.random() < 0.8 else fleet.running()
            if victims:
                victim = rng.choice(victims)
                await fleet.kill(victim)
                cut |= set(victim.in_flight())
                kills += 1
    await fleet.finish()
    drained_in = time.monotonic() - began

    records = await records_of(view, keys)
    stats = await view.stats()
    tokens: dict[Key, list[int]] = defaultdict(list)
    acked: dict[Key, list[int]] = defaultdict(list)
    killed_mid_handler = 0
    beats = 0
    for process in fleet.history:
        entries = process.entries()
        for kind, key, token in entries:
            if kind in ("claim", "beat"):
                tokens[key].append(token)
                beats += kind == "beat"
            elif kind == "acked":
                acked[key].append(token)
            elif kind == "failed":
                raise AssertionError(f"{process.name} failed {key}: nothing here raises")
        if process.killed and process.in_flight():
            killed_mid_handler += 1
        for key, token in process.frozen:
            lost = [t for k, e, t in entries if k == "lost" and e == key and t >= token]
            assert lost, (process.name, key, token)
            # The frozen lease settled nothing. An ack here can only come from a later claim
            # of the same item by this process (its taker was killed in turn): a newer token.
            late = [t for k, e, t in entries if k == "acked" and e == key and t <= min(lost)]
            assert late == [], (process.name, key, token, lost, late)
    reclaimed = reclaimed_count(records)
    print(
        f"\nworker crash [{spec['kind']}]: {ITEMS} items, {TENANTS} tenants, {PROCESSES} "
        f"processes x {WORKER['concurrency']} slots, {len(fleet.history)} started; {kills} "
        f"SIGKILLs ({killed_mid_handler} mid-handler, {len(cut)} items cut off), {freezes} "
        f"SIGSTOPs past the lease; {beats} heartbeats; {reclaimed} items claimed more than "
        f"once; drain {drained_in:.1f} s (seed {seed})"
    )

    assert_all_done(records, stats)
    assert_issued_once(t for ts in tokens.values() for t in ts)
    # Each item acked once, with the newest token any worker held for it.
    twice = {key: ts for key, ts in acked.items() if len(ts) > 1}
    assert not twice, f"acked more than once: {twice}"
    for key, (token,) in acked.items():
        assert token == max(tokens[key]), (
            f"{key} acked with superseded token {token}: {tokens[key]}"
        )
    unlogged = set(keys) - set(acked)
    assert unlogged <= cut, f"done without a logged ack, not cut off: {sorted(unlogged - cut)[:5]}"
    for key in cut - unlogged:
        assert len(acked[key]) == 1
    assert kills > 0 and killed_mid_handler > 0, "no kill landed mid-handler: proved nothing"
    assert freezes > 0, "no frozen worker: lease loss went unexercised"
    assert beats > 0, "no heartbeat ever landed"
