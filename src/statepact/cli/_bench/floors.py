"""The floors of ``statepact bench``: raw calls on the bench's own client, each checked to do
what it says, and how one is measured beside a scenario.

A floor is what a scenario cannot beat from Python on that server: a dict behind an
``asyncio.Lock`` (memory); ``PING``, ``HINCRBY`` and one-script ``EVALSHA`` calls on the
bench's redis-py client; ``SELECT 1`` and a one-row ``UPDATE`` on its SQLAlchemy engine,
per checkout or on a connection held by each caller. The minimal transaction designs are
floors too (``seed``). Every key and table a floor makes lives in the bench's namespace
or scratch schema, and :meth:`Floor.close` drops the tables; docs/benchmarks.md#floors-and-targets
lists them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from statepact._cancel import finish
from statepact.cli._bench.measure import RoundTrips, repeated
from statepact.cli._common import CommandError, delete_keys

#: The rows of the PostgreSQL update floors, one per caller, in the bench's scratch schema.
FLOOR_TABLE = "bench_floor"


class Floor:
    """A floor: ``op(caller, i)``, run by ``callers`` tasks at once, and nothing else.

    The bench calls :meth:`setup` once, then for each measurement :meth:`hold` (what each
    caller keeps for the whole measurement, such as its own connection), and before each
    timed repetition :meth:`reset`, after it :meth:`check`, which raises ``CommandError``
    when the floor did not do what it says (a lost update); then :meth:`release`.
    :meth:`close` removes what :meth:`setup` made. Only the ops are timed and counted.
    """

    name = ""
    #: True: a repetition is the scenario itself (its callers x its ops per caller, as
    #: the transaction designs); False: a call repeated ``max(ops, 10)`` times per caller.
    whole_scenario = False

    def __init__(self) -> None:
        #: Operations re-run after a conflict, over the floor's life.
        self.retries = 0

    async def setup(self) -> None:
        """Make what the floor needs (a table, a script), once."""

    async def hold(self, callers: int) -> None:
        """Take what each of ``callers`` keeps through one measurement."""

    async def reset(self, callers: int) -> None:
        """Before a timed repetition: start its state, or note where it starts."""

    async def op(self, caller: int, i: int) -> None:
        raise NotImplementedError

    async def check(self, callers: int, per_caller: int) -> None:
        """After a timed repetition: raise ``CommandError`` unless it did what it says."""

    async def release(self) -> None:
        """Give back what :meth:`hold` took."""

    async def close(self) -> None:
        """Remove what :meth:`setup` made beside the backing."""

    def fail(self, what: str) -> CommandError:
        return CommandError(f"bench: the floor {self.name} {what}")


async def measure_floor(
    floor: Floor, callers: int, ops: int, trips: RoundTrips | None
) -> tuple[int, float, tuple[int, int] | None, int]:
    """Run ``floor`` at ``callers`` until it has run :data:`MIN_SECONDS`: operations,
    seconds, round trips sent while timed (None on memory), re-runs after conflicts.

    One untimed repetition of one op per caller comes first, so connections and
    statements are ready as the scenario's were.
    """
    per_caller = ops if floor.whole_scenario else max(ops, 10)
    try:
        await floor.hold(callers)
        retries_before = [floor.retries]

        def warmed() -> None:
            retries_before[0] = floor.retries  # the warm-up's re-runs are not counted

        done, seconds, sent = await repeated(
            callers,
            per_caller,
            floor.op,
            trips,
            reset=lambda: floor.reset(callers),
            check=lambda each: floor.check(callers, each),
            warmed=warmed,
        )
    finally:
        await finish(floor.release())
    return done, seconds, sent, floor.retries - retries_before[0]


# -- memory -----------------------------------------------------------------------------


class LockedDict(Floor):
    """Memory: one counter per caller in a dict, incremented under one ``asyncio.Lock``."""

    name = "dict+asyncio.Lock"

    def __init__(self) -> None:
        super().__init__()
        self.lock = asyncio.Lock()
        self.table: dict[int, int] = {}

    async def reset(self, callers: int) -> None:
        self.table = {}

    async def op(self, caller: int, i: int) -> None:
        async with self.lock:
            self.table[caller] = self.table.get(caller, 0) + 1

    async def check(self, callers: int, per_caller: int) -> None:
        if self.table != dict.fromkeys(range(callers), per_caller):
            raise self.fail(f"lost an update: {self.table!r}")


# -- Redis ------------------------------------------------------------------------------

#: ``INCR`` of the caller's own counter, in a script (the write floor of every call that
#: is one script).
INCR_SCRIPT = "return redis.call('INCR', KEYS[1])"
#: Two reads and two writes of the caller's own keys: the shape of a state write.
TWO_READS_TWO_WRITES_SCRIPT = """
local a = tonumber(redis.call('GET', KEYS[1]) or '0')
local b = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('SET', KEYS[1], a + 1)
redis.call('SET', KEYS[2], b + tonumber(ARGV[1]))
return a + b
"""


async def delete_matching(redis: Any, prefix: str) -> None:
    """Delete every key starting with ``prefix``: the bench's own keys beside the backing's
    (floors, seed designs), which the backing's namespace cleanup does not know of."""
    from statepact.storage.redis import glob_escape

    await delete_keys(redis, [f"{glob_escape(prefix)}*"])


class RedisFloor(Floor):
    """A floor on the bench's redis-py client; its keys start with ``{<tag>:floor:``, the
    bench's unique tag, and :meth:`close` deletes them."""

    def __init__(self, redis: Any, tag: str) -> None:
        super().__init__()
        self.redis = redis
        self.tag = tag
        self.counts: list[int] = []

    def key(self, caller: int, part: str = "") -> str:
        # One hash slot per caller ({...}), so a two-key script runs on a cluster too.
        return f"{{{self.tag}:floor:{caller}}}{part}"

    async def close(self) -> None:
        await delete_matching(self.redis, f"{{{self.tag}:floor:")

    async def counters(self, keys: Sequence[str]) -> list[int]:
        return [int(v or 0) for v in await self.redis.mget(list(keys))]

    async def check_counted(self, keys: Sequence[str], each: int) -> None:
        """Each of ``keys`` grew by exactly ``each`` since :meth:`note`."""
        now = await self.counters(keys)
        if [b - a for a, b in zip(self.counts, now, strict=True)] != [each] * len(keys):
            raise self.fail(f"lost an update: {self.counts} -> {now}, expected +{each} each")

    async def note(self, keys: Sequence[str]) -> None:
        self.counts = await self.counters(keys)


class RedisIncrScript(RedisFloor):
    """``EVALSHA`` of a one-line ``INCR`` of the caller's own counter."""

    name = "raw EVALSHA"

    async def setup(self) -> None:
        self.sha = await self.redis.script_load(INCR_SCRIPT)

    async def reset(self, callers: int) -> None:
        await self.note([self.key(c) for c in range(callers)])

    async def op(self, caller: int, i: int) -> None:
        await self.redis.evalsha(self.sha, 1, self.key(caller))

    async def check(self, callers: int, per_caller: int) -> None:
        await self.check_counted([self.key(c) for c in range(callers)], per_caller)


class RedisPing(RedisFloor):
    """``PING``: one round trip that touches nothing."""

    name = "redis.ping"

    async def op(self, caller: int, i: int) -> None:
        if await self.redis.ping() is not True:
            raise self.fail("got no PONG")


class RedisHincrbyOwn(RedisFloor):
    """``HINCRBY`` of a field of the caller's own hash: one command that writes."""

    name = "redis.hincrby_own"

    async def hashes(self, callers: int) -> list[int]:
        return [int(await self.redis.hget(self.key(c, ":h"), "c") or 0) for c in range(callers)]

    async def reset(self, callers: int) -> None:
        self.counts = await self.hashes(callers)

    async def op(self, caller: int, i: int) -> None:
        await self.redis.hincrby(self.key(caller, ":h"), "c", 1)

    async def check(self, callers: int, per_caller: int) -> None:
        now = await self.hashes(callers)
        if [b - a for a, b in zip(self.counts, now, strict=True)] != [per_caller] * callers:
            raise self.fail(f"lost an update: {self.counts} -> {now}")


class RedisTwoReadsTwoWrites(RedisFloor):
    """``EVALSHA`` of a script that reads two of the caller's keys and writes both."""

    name = "redis.evalsha_2r2w"

    async def setup(self) -> None:
        self.sha = await self.redis.script_load(TWO_READS_TWO_WRITES_SCRIPT)

    def pair(self, caller: int) -> list[str]:
        return [self.key(caller, ":a"), self.key(caller, ":b")]

    async def reset(self, callers: int) -> None:
        await self.note([k for c in range(callers) for k in self.pair(c)])

    async def op(self, caller: int, i: int) -> None:
        await self.redis.evalsha(self.sha, 2, *self.pair(caller), 2)

    async def check(self, callers: int, per_caller: int) -> None:
        keys = [k for c in range(callers) for k in self.pair(c)]
        now = await self.counters(keys)
        grew = [b - a for a, b in zip(self.counts, now, strict=True)]
        if grew != [per_caller, 2 * per_caller] * callers:
            raise self.fail(f"lost an update: {self.counts} -> {now}")


# -- PostgreSQL -------------------------------------------------------------------------


def qualified(tag: str, table: str) -> str:
    """``table`` in the bench's scratch schema, ``"tag".table``.

    ``tag`` is ``bench`` and hex digits (``run_bench`` makes it), so quoting it as an
    identifier is safe; anything else is refused rather than interpolated.
    """
    if not tag.isascii() or not tag.replace("_", "").isalnum():
        raise ValueError(f"tag: {tag!r} is not a plain schema name")
    return f'"{tag}".{table}'


class HeldConnections:
    """One pooled connection of the bench's engine per caller, held through a
    measurement (returned to the pool whatever ends it)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.connections: list[Any] = []

    async def take(self, count: int, *, autocommit: bool) -> list[Any]:
        for _ in range(count):
            conn = await self.engine.connect()
            self.connections.append(conn)
            if autocommit:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
        return self.connections

    async def drivers(self, count: int) -> list[Any]:
        """``count`` held connections' own asyncpg connections."""
        held = await self.take(count, autocommit=False)
        return [(await conn.get_raw_connection()).driver_connection for conn in held]

    async def give_back(self) -> None:
        held, self.connections = self.connections, []
        for conn in held:
            await finish(conn.close())


class PostgresUpdate(Floor):
    """A one-row ``UPDATE`` of the caller's own row in AUTOCOMMIT (one statement), on a
    connection checked out for each call (``held=False``, as a library call does) or
    held by the caller through the measurement (``held=True``).

    The rows live in :data:`FLOOR_TABLE`, named with the bench's scratch schema
    (``tag``) rather than left to ``search_path``, so it is created nowhere else;
    :meth:`close` drops it. It cannot be a ``TEMPORARY`` table: the callers run on
    different pooled connections.
    """

    def __init__(self, engine: Any, tag: str, *, held: bool) -> None:
        super().__init__()
        self.engine = engine
        self.table = qualified(tag, FLOOR_TABLE)
        self.held = held
        self.name = "pg.sqla.autocommit.update_own" if held else "raw one-row UPDATE"
        self.connections = HeldConnections(engine)
        self.mine: list[Any] = []
        self.total = 0

    async def setup(self) -> None:
        from sqlalchemy import text

        self.update = text(f"UPDATE {self.table} SET n = n + 1 WHERE id = :id")
        self.sum = text(f"SELECT coalesce(sum(n), 0) FROM {self.table} WHERE id < :callers")
        async with self.engine.begin() as conn:
            await conn.execute(
                text(f"CREATE TABLE IF NOT EXISTS {self.table} (id integer PRIMARY KEY, n bigint)")
            )

    async def hold(self, callers: int) -> None:
        from sqlalchemy import text

        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    f"INSERT INTO {self.table} (id, n) "
                    "SELECT g, 0 FROM generate_series(0, :last) g ON CONFLICT DO NOTHING"
                ),
                {"last": callers - 1},
            )
        if self.held:
            self.mine = await self.connections.take(callers, autocommit=True)

    async def counted(self, callers: int) -> int:
        async with self.engine.connect() as conn:
            return int((await conn.execute(self.sum, {"callers": callers})).scalar_one())

    async def reset(self, callers: int) -> None:
        self.total = await self.counted(callers)

    async def op(self, caller: int, i: int) -> None:
        if self.held:
            await self.mine[caller].execute(self.update, {"id": caller})
            return
        async with self.engine.connect() as conn:
            auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await auto.execute(self.update, {"id": caller})

    async def check(self, callers: int, per_caller: int) -> None:
        now = await self.counted(callers)
        if now - self.total != callers * per_caller:
            raise self.fail(f"counted {now - self.total} updates of {callers * per_caller}")

    async def release(self) -> None:
        await self.connections.give_back()

    async def close(self) -> None:
        await drop_table(self.engine, self.table)


class PostgresSelectOne(Floor):
    """``SELECT 1`` in AUTOCOMMIT on a connection each caller holds: one round trip."""

    name = "pg.sqla.autocommit.select1"

    def __init__(self, engine: Any) -> None:
        super().__init__()
        self.connections = HeldConnections(engine)
        self.mine: list[Any] = []

    async def setup(self) -> None:
        from sqlalchemy import text

        self.select = text("SELECT 1")

    async def hold(self, callers: int) -> None:
        self.mine = await self.connections.take(callers, autocommit=True)

    async def op(self, caller: int, i: int) -> None:
        if (await self.mine[caller].execute(self.select)).scalar_one() != 1:
            raise self.fail("did not answer 1")

    async def release(self) -> None:
        await self.connections.give_back()


async def drop_table(engine: Any, table: str) -> None:
    """Drop a floor's table (a no-op when it was never made)."""
    from sqlalchemy import text

    async with engine.begin() as conn:
        await conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
