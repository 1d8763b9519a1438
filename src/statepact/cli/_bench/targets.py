"""Which floors ``statepact bench`` measures beside each scenario, and the ratio asked of
each (docs/benchmarks.md#floors-and-targets).

The transaction scenarios stand beside the minimal transaction designs, the state calls
beside the raw calls of the same shape, with the targets of issue 13; the queue's
``Worker`` drain and ``enqueue_many`` carry the targets of issue 12 against peer queues
that only the peer harness runs (shown, never measured here). Every other scenario
stands beside its backing's write floor, with no target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statepact._cancel import finish
from statepact.cli._bench.floors import (
    Floor,
    LockedDict,
    PostgresSelectOne,
    PostgresUpdate,
    RedisHincrbyOwn,
    RedisIncrScript,
    RedisPing,
    RedisTwoReadsTwoWrites,
    measure_floor,
)
from statepact.cli._bench.measure import RoundTrips
from statepact.cli._bench.report import Against, BenchResult, Progress
from statepact.cli._bench.seed import Design, SeedFloor, design


@dataclass(frozen=True)
class Beside:
    """A floor a scenario is held against, and the least ratio asked of it."""

    floor: str
    target: float | None = None
    #: A peer queue only the peer harness runs: its target is shown, nothing is measured.
    peer: bool = False


#: The floor of every scenario :data:`PLAN` does not name.
WRITE_FLOOR = {
    "memory": "dict+asyncio.Lock",
    "redis": "raw EVALSHA",
    "postgres": "raw one-row UPDATE",
}

PLAN: dict[str, dict[str, tuple[Beside, ...]]] = {
    "memory": {
        "tx.independent": (Beside("seed.memory.independent", 0.3),),
        "tx.hot_key": (Beside("seed.memory.hot"),),
        "tx.read_only": (Beside("seed.memory.readonly"),),
    },
    "redis": {
        "tx.independent": (Beside("seed.redis.independent", 0.8),),
        "tx.hot_key": (Beside("seed.redis.hot", 0.8),),
        "tx.read_only": (Beside("seed.redis.readonly", 0.7),),
        "state.get": (Beside("redis.ping", 0.8),),
        "state.put": (Beside("redis.evalsha_2r2w", 0.8),),
        "state.patch_own": (Beside("redis.hincrby_own", 0.8),),
        "queue.worker.c10": (Beside(WRITE_FLOOR["redis"]), Beside("saq.process", 3.0, peer=True)),
    },
    "postgres": {
        "tx.independent": (
            Beside("seed.pg.txn.independent", 1.0),
            Beside("seed.pg.seedlock.independent", 2.5),
        ),
        "tx.hot_key": (Beside("seed.pg.cas.hot", 0.8),),
        "tx.read_only": (Beside("seed.pg.txn.readonly", 0.7),),
        "state.get": (Beside("pg.sqla.autocommit.select1", 0.7),),
        "state.put": (Beside("pg.sqla.autocommit.update_own", 0.7),),
        "state.patch_own": (Beside("pg.sqla.autocommit.update_own", 0.7),),
        "queue.enqueue_many": (
            Beside(WRITE_FLOOR["postgres"]),
            Beside("pgqueuer.enqueue.batch", 1.0, peer=True),
        ),
        "queue.worker.c10": (
            Beside(WRITE_FLOOR["postgres"]),
            Beside("pgqueuer.process", 1.0, peer=True),
        ),
    },
}


def beside(kind: str, scenario: str) -> tuple[Beside, ...]:
    """The floors (and peers) ``scenario`` is held against on ``kind``, the first the one
    its ``ratio`` uses."""
    return PLAN[kind].get(scenario, (Beside(WRITE_FLOOR[kind]),))


class Floors:
    """The floors of one backing, each measured right after the scenario it stands beside,
    at that scenario's concurrency.

    Measuring a floor next to its scenario, rather than once, means both saw the same
    load: on a shared machine a floor taken minutes earlier would make every ratio drift
    with whatever else was running.
    """

    def __init__(self, kind: str, client: Any, ops: int, tag: str) -> None:
        self.kind = kind
        self.client = client
        self.ops = ops
        self.tag = tag
        self.samples: list[BenchResult] = []
        # The backing's round-trip counter, once the runner started it.
        self.trips: RoundTrips | None = None
        self._floors: dict[str, Floor] = {}
        self._designs: dict[str, Design] = {}

    async def beside(
        self, scenario: str, concurrency: int, rate: float, progress: Progress
    ) -> list[Against]:
        """Measure the floors ``scenario`` stands beside, now: each with ``rate``'s ratio
        to it and its target."""
        held: list[Against] = []
        for one in beside(self.kind, scenario):
            if one.peer:
                held.append(Against(one.floor, None, None, one.target))
                continue
            progress.detail(f"floor {one.floor}")
            floor_rate = await self.measure(one.floor, concurrency, scenario)
            ratio = rate / floor_rate if floor_rate else 0.0
            held.append(Against(one.floor, floor_rate, ratio, one.target))
        return held

    async def measure(self, name: str, concurrency: int, after: str) -> float:
        """The floor ``name``'s ops/s at ``concurrency``, measured now (after ``after``),
        kept as a sample."""
        floor = await self.floor(name)
        ops, seconds, sent, retries = await measure_floor(floor, concurrency, self.ops, self.trips)
        rate = ops / seconds
        extra: dict[str, Any] = {"after": after}
        if isinstance(floor, SeedFloor) and floor.scenario != "readonly":
            extra["retries"] = retries
        self.samples.append(
            BenchResult(
                backing=self.kind,
                scenario=f"floor.{name}",
                label=f"floor: {name}",
                concurrency=concurrency,
                ops=ops,
                seconds=seconds,
                ops_per_s=rate,
                floor=name,
                floor_ops_per_s=rate,
                ratio=1.0,
                extra=extra,
                round_trips_per_op=None if sent is None else sent[0] / ops,
            )
        )
        return rate

    async def floor(self, name: str) -> Floor:
        """The floor ``name``, set up on first use."""
        if name not in self._floors:
            made = self.make(name)
            self._floors[name] = made  # before setup: close() removes what half a setup made
            await made.setup()
        return self._floors[name]

    def make(self, name: str) -> Floor:
        """A new floor ``name`` on this backing (not set up yet)."""
        if name.startswith("seed."):
            kind, scenario = name.removeprefix("seed.").rsplit(".", 1)
            if kind not in self._designs:
                self._designs[kind] = design(self.kind, kind, self.client, self.tag)
            return SeedFloor(self._designs[kind], scenario)
        client, tag = self.client, self.tag
        makers: dict[str, dict[str, Callable[[], Floor]]] = {
            "memory": {"dict+asyncio.Lock": LockedDict},
            "redis": {
                "raw EVALSHA": lambda: RedisIncrScript(client, tag),
                "redis.ping": lambda: RedisPing(client, tag),
                "redis.hincrby_own": lambda: RedisHincrbyOwn(client, tag),
                "redis.evalsha_2r2w": lambda: RedisTwoReadsTwoWrites(client, tag),
            },
            "postgres": {
                "raw one-row UPDATE": lambda: PostgresUpdate(client, tag, held=False),
                "pg.sqla.autocommit.update_own": lambda: PostgresUpdate(client, tag, held=True),
                "pg.sqla.autocommit.select1": lambda: PostgresSelectOne(client),
            },
        }
        if name not in makers[self.kind]:
            raise ValueError(f"no floor {name!r} on {self.kind}")
        return makers[self.kind][name]()

    async def close(self) -> None:
        """Remove what the floors made beside the backing (their PostgreSQL tables)."""
        floors, self._floors = list(self._floors.values()), {}
        for floor in floors:
            await finish(floor.close())
