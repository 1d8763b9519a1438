"""The minimal transaction designs ``statepact bench`` holds its transaction scenarios
against: the floors ``seed.<design>.<scenario>`` (docs/benchmarks.md#floors-and-targets).

A design keeps a value and a version per key and nothing else (no history, no
idempotency, no fencing, no locks): an agent reads (value, version), then commits value
+ 1 only if the version has not moved, and re-runs at once (no backoff) when it has.
The scenarios are the bench's own: ``independent`` (each agent its own key),
``hot`` (every agent on one key) and ``readonly`` (a read of the agent's key). Each
repetition starts every key at zero and is checked afterwards: a design that loses an
update fails the bench instead of reporting a rate.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Sequence
from typing import Any

from statepact.cli._bench.floors import (
    Floor,
    HeldConnections,
    delete_matching,
    drop_table,
    qualified,
)

#: The key every agent shares in the ``hot`` scenario.
HOT = "hot"
#: The designs' keys on PostgreSQL, in the bench's scratch schema.
SEED_TABLE = "bench_seed"
SCENARIOS = ("independent", "hot", "readonly")
#: Re-runs of one operation before the bench calls it a live-lock (never expected).
MAX_RERUNS = 100_000


class Design:
    """Values and versions per key, read and compare-and-set by agents."""

    name = ""

    async def setup(self) -> None:
        """Make the design's table or script, once."""

    async def hold(self, agents: int) -> None:
        """Take each agent's own connection for one measurement."""

    async def release(self) -> None:
        """Give back what :meth:`hold` took."""

    async def close(self) -> None:
        """Remove what :meth:`setup` made."""

    async def reset(self, keys: Sequence[str]) -> None:
        """Every key at value 0, version 0."""
        raise NotImplementedError

    async def read(self, agent: int, key: str) -> tuple[int, int]:
        """The key's (value, version)."""
        raise NotImplementedError

    async def commit(self, agent: int, key: str, version: int, value: int) -> bool:
        """Set ``value`` if the key is still at ``version``; False when it moved."""
        raise NotImplementedError

    async def values(self, keys: Sequence[str]) -> list[int]:
        raise NotImplementedError


class SeedFloor(Floor):
    """One scenario on one design, as the floor ``seed.<design>.<scenario>``."""

    whole_scenario = True

    def __init__(self, design: Design, scenario: str) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"scenario: {scenario!r} is not one of {', '.join(SCENARIOS)}")
        super().__init__()
        self.design = design
        self.scenario = scenario
        self.name = f"seed.{design.name}.{scenario}"

    @staticmethod
    def keys(agents: int) -> list[str]:
        return [*(f"a{agent}" for agent in range(agents)), HOT]

    async def setup(self) -> None:
        await self.design.setup()

    async def hold(self, callers: int) -> None:
        await self.design.hold(callers)

    async def reset(self, callers: int) -> None:
        await self.design.reset(self.keys(callers))

    async def op(self, caller: int, i: int) -> None:
        key = HOT if self.scenario == "hot" else f"a{caller}"
        if self.scenario == "readonly":
            await self.design.read(caller, key)
            return
        for _ in range(MAX_RERUNS):
            value, version = await self.design.read(caller, key)
            if await self.design.commit(caller, key, version, value + 1):
                return
            self.retries += 1
        raise self.fail(f"re-ran one commit {MAX_RERUNS:,} times on {key!r}")

    async def check(self, callers: int, per_caller: int) -> None:
        keys = self.keys(callers)
        got = dict(zip(keys, await self.design.values(keys), strict=True))
        expected = dict.fromkeys(keys, 0)
        if self.scenario == "independent":
            expected.update(dict.fromkeys(keys[:-1], per_caller))
        elif self.scenario == "hot":
            expected[HOT] = callers * per_caller
        wrong = {k: f"{v} (expected {expected[k]})" for k, v in got.items() if v != expected[k]}
        if wrong:
            raise self.fail(f"lost an update: {wrong}")

    async def release(self) -> None:
        await self.design.release()

    async def close(self) -> None:
        await self.design.close()


class MemoryDesign(Design):
    """``seed.memory``: a dict and one ``asyncio.Lock`` around compare-and-set."""

    name = "memory"

    def __init__(self) -> None:
        self.data: dict[str, tuple[int, int]] = {}
        self.lock = asyncio.Lock()

    async def reset(self, keys: Sequence[str]) -> None:
        self.data = dict.fromkeys(keys, (0, 0))

    async def read(self, agent: int, key: str) -> tuple[int, int]:
        return self.data[key]

    async def commit(self, agent: int, key: str, version: int, value: int) -> bool:
        # An agent always awaits something between its read and its commit: without it
        # no agent would ever see another's write, and nothing could conflict.
        await asyncio.sleep(0)
        async with self.lock:
            if self.data[key][1] != version:
                return False
            self.data[key] = (value, version + 1)
            return True

    async def values(self, keys: Sequence[str]) -> list[int]:
        return [self.data[key][0] for key in keys]


#: KEYS[1]: the key's hash (fields v, ver); ARGV[1]: the version read; ARGV[2]: the new
#: value. Returns the new version, or -1 when the version moved since the read.
COMPARE_AND_SET_SCRIPT = """
local ver = redis.call('HGET', KEYS[1], 'ver') or '0'
if ver ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'ver', tonumber(ver) + 1)
return tonumber(ver) + 1
"""


class RedisDesign(Design):
    """``seed.redis``: ``HMGET`` of value and version, then ``EVALSHA`` of a
    compare-and-set script: two round trips per attempt. The keys start with
    ``<tag>:seed:``, the bench's unique tag, and :meth:`close` deletes them."""

    name = "redis"

    def __init__(self, redis: Any, tag: str) -> None:
        self.redis = redis
        self.tag = tag

    def key(self, key: str) -> str:
        return f"{self.tag}:seed:{key}"

    async def close(self) -> None:
        await delete_matching(self.redis, f"{self.tag}:seed:")

    async def setup(self) -> None:
        self.sha = await self.redis.script_load(COMPARE_AND_SET_SCRIPT)

    async def reset(self, keys: Sequence[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hset(self.key(key), mapping={"v": 0, "ver": 0})
        await pipe.execute()

    async def read(self, agent: int, key: str) -> tuple[int, int]:
        value, version = await self.redis.hmget(self.key(key), "v", "ver")
        return int(value), int(version)

    async def commit(self, agent: int, key: str, version: int, value: int) -> bool:
        return bool(await self.redis.evalsha(self.sha, 1, self.key(key), version, value) != -1)

    async def values(self, keys: Sequence[str]) -> list[int]:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hget(self.key(key), "v")
        return [int(v) for v in await pipe.execute()]


class _Moved(Exception):
    """The version moved between the read and the commit: roll the transaction back."""


class PostgresTxn(Design):
    """``seed.pg.txn``: the read is a ``SELECT`` in autocommit; the commit is ``BEGIN``;
    ``SELECT ... FOR UPDATE`` of the version; compare; ``UPDATE``; ``COMMIT`` (``ROLLBACK``
    when the version moved), on an asyncpg connection each agent holds.

    ``seedlock=True`` is ``seed.pg.seedlock``: the same, with
    ``pg_advisory_xact_lock(constant)`` first, so every commit waits for the one before
    it (one global commit lock). The constant is drawn from ``tag``, so no other
    session's advisory lock is touched.
    """

    def __init__(self, engine: Any, tag: str, *, seedlock: bool = False) -> None:
        self.engine = engine
        self.table = qualified(tag, SEED_TABLE)
        self.seedlock = seedlock
        self.name = "pg.seedlock" if seedlock else "pg.txn"
        self.lock_key = zlib.crc32(tag.encode())
        self.connections = HeldConnections(engine)
        self.mine: list[Any] = []

    async def setup(self) -> None:
        from sqlalchemy import text

        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS {self.table} "
                    "(k text PRIMARY KEY, v bigint NOT NULL, ver bigint NOT NULL)"
                )
            )

    async def hold(self, agents: int) -> None:
        self.mine = await self.connections.drivers(agents)

    async def release(self) -> None:
        self.mine = []
        await self.connections.give_back()

    async def close(self) -> None:
        await drop_table(self.engine, self.table)

    async def reset(self, keys: Sequence[str]) -> None:
        await self.mine[0].execute(
            f"INSERT INTO {self.table} (k, v, ver) SELECT unnest($1::text[]), 0, 0 "
            "ON CONFLICT (k) DO UPDATE SET v = 0, ver = 0",
            list(keys),
        )

    async def read(self, agent: int, key: str) -> tuple[int, int]:
        row = await self.mine[agent].fetchrow(f"SELECT v, ver FROM {self.table} WHERE k = $1", key)
        return int(row[0]), int(row[1])

    async def commit(self, agent: int, key: str, version: int, value: int) -> bool:
        conn = self.mine[agent]
        try:
            async with conn.transaction():
                if self.seedlock:
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", self.lock_key)
                now = await conn.fetchval(
                    f"SELECT ver FROM {self.table} WHERE k = $1 FOR UPDATE", key
                )
                if now != version:
                    raise _Moved
                await conn.execute(
                    f"UPDATE {self.table} SET v = $2, ver = ver + 1 WHERE k = $1", key, value
                )
        except _Moved:
            return False
        return True

    async def values(self, keys: Sequence[str]) -> list[int]:
        rows = await self.mine[0].fetch(
            f"SELECT k, v FROM {self.table} WHERE k = any($1::text[])", list(keys)
        )
        found = {row[0]: int(row[1]) for row in rows}
        return [found.get(key, -1) for key in keys]


class PostgresCas(PostgresTxn):
    """``seed.pg.cas``: the same read; the commit is one autocommit ``UPDATE ... WHERE
    k = $1 AND ver = $2``: two round trips per attempt."""

    def __init__(self, engine: Any, tag: str) -> None:
        super().__init__(engine, tag)
        self.name = "pg.cas"

    async def commit(self, agent: int, key: str, version: int, value: int) -> bool:
        moved_to = await self.mine[agent].fetchval(
            f"UPDATE {self.table} SET v = $3, ver = ver + 1 WHERE k = $1 AND ver = $2 "
            "RETURNING ver",
            key,
            version,
            value,
        )
        return moved_to is not None


def design(kind: str, name: str, client: Any, tag: str) -> Design:
    """The design ``name`` (``memory``, ``redis``, ``pg.txn``, ``pg.seedlock``,
    ``pg.cas``) on the backing ``kind``'s client."""
    if kind == "memory" and name == "memory":
        return MemoryDesign()
    if kind == "redis" and name == "redis":
        return RedisDesign(client, tag)
    if kind == "postgres" and name in ("pg.txn", "pg.seedlock"):
        return PostgresTxn(client, tag, seedlock=name == "pg.seedlock")
    if kind == "postgres" and name == "pg.cas":
        return PostgresCas(client, tag)
    raise ValueError(f"no transaction design {name!r} on {kind}")
