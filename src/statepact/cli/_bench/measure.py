"""How ``statepact bench`` measures: callers spread over tasks and timed, and the round
trips a backing's client sent meanwhile (docs/benchmarks.md#round-trips).

The counting hooks wrap the bench's own redis-py client and SQLAlchemy engine only;
they never change what is sent.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from statepact.cli._bench.report import Progress
from statepact.tx import CommitRequest, CommitResult, Refusal, StorageBackend


async def spread(
    callers: int,
    per_caller: int,
    op: Callable[[int, int], Awaitable[object]],
    progress: Progress | None = None,
) -> float:
    """Run ``op(caller, i)`` ``per_caller`` times in each of ``callers`` tasks; seconds taken."""
    total = callers * per_caller
    done = 0

    async def caller(c: int) -> None:
        nonlocal done
        for i in range(per_caller):
            await op(c, i)
            done += 1
            if progress is not None and done % 16 == 0:
                progress.update(done / total)

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return time.perf_counter() - started


#: A repeated measurement (a floor's, a transaction or state scenario's) is timed for at
#: least this long, in rounds, so the clock can be trusted.
MIN_SECONDS = 0.25


async def repeated(
    callers: int,
    per_caller: int,
    op: Callable[[int, int], Awaitable[object]],
    trips: RoundTrips | None,
    progress: Progress | None = None,
    *,
    reset: Callable[[], Awaitable[None]] | None = None,
    check: Callable[[int], Awaitable[None]] | None = None,
    warmed: Callable[[], object] | None = None,
) -> tuple[int, float, tuple[int, int] | None]:
    """``op`` measured as a floor is: one untimed op per caller first (connections,
    prepared statements and the interpreter warm), then timed rounds of ``per_caller``
    ops per caller until :data:`MIN_SECONDS` have been timed. ``reset`` runs (untimed)
    before the warm-up and before each round, ``check(ops_per_caller)`` after each,
    ``warmed()`` once the warm-up is over. Returns the ops timed, their seconds, and the
    round trips sent while timed (None on memory)."""
    if reset is not None:
        await reset()
    await spread(callers, 1, op)
    if check is not None:
        await check(1)
    if warmed is not None:
        warmed()
    done, seconds = 0, 0.0
    sent: tuple[int, int] | None = None if trips is None else (0, 0)
    while seconds < MIN_SECONDS:
        if reset is not None:
            await reset()
        took, got = await timed(callers, per_caller, op, trips, progress)
        if check is not None:
            await check(per_caller)
        seconds += took
        done += callers * per_caller
        if sent is not None and got is not None:
            sent = (sent[0] + got[0], sent[1] + got[1])
    return done, seconds, sent


# -- round trips ------------------------------------------------------------------------

#: Set while a backend's ``commit`` runs, in the task that called it.
_IN_COMMIT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "statepact_bench_in_commit", default=False
)
#: Set while redis-py sets up a fresh connection (HELLO, CLIENT SETINFO, SELECT): not counted.
_CONNECTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "statepact_bench_connecting", default=False
)


class RoundTrips:
    """Round trips one backing's client sent: all of them, and those inside a ``commit``.

    The counting hooks call :meth:`add` once per request sent to the server:
    on Redis one command, one pipeline or one script call; on PostgreSQL one
    statement or one query asyncpg sends by itself (pre-ping, ``BEGIN``,
    ``COMMIT``, ``ROLLBACK``). Opening a connection is not counted, nor is
    asyncpg preparing a statement the first time a pooled connection runs it.
    """

    def __init__(self) -> None:
        self.total = 0
        self.in_commit = 0

    def add(self, *_args: object) -> None:
        self.total += 1
        if _IN_COMMIT.get():
            self.in_commit += 1

    def read(self) -> tuple[int, int]:
        return self.total, self.in_commit


class _CommitMarked:
    """A backend whose ``commit`` marks the round trips sent inside it; all else delegated."""

    def __init__(self, backend: StorageBackend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def commit(self, request: CommitRequest) -> CommitResult | Refusal:
        token = _IN_COMMIT.set(True)
        try:
            return await self._backend.commit(request)
        finally:
            _IN_COMMIT.reset(token)


def commit_marked(backend: StorageBackend) -> StorageBackend:
    # The Protocol's other members are all reached through __getattr__.
    return cast("StorageBackend", _CommitMarked(backend))


async def count_redis(client: Any, trips: RoundTrips) -> None:
    """Count every request ``client`` sends from now on.

    The pool's connection class becomes a subclass whose ``send_packed_command``
    (one call per command, and one per pipeline) counts once; the connections
    already open are closed and dropped so that every later one is of it. The
    commands redis-py sends to set up a fresh connection are not counted.
    """
    pool = client.connection_pool
    base: Any = pool.connection_class

    class Counting(base):  # type: ignore[misc]
        async def on_connect_check_health(self, *args: Any, **kwargs: Any) -> None:
            token = _CONNECTING.set(True)
            try:
                await super().on_connect_check_health(*args, **kwargs)
            finally:
                _CONNECTING.reset(token)

        async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
            if not _CONNECTING.get():
                trips.add()
            await super().send_packed_command(*args, **kwargs)

    pool.connection_class = Counting
    await pool.disconnect()
    pool.reset()


async def count_postgres(engine: Any, trips: RoundTrips) -> None:
    """Count every statement ``engine`` executes, and every query asyncpg sends by itself.

    SQLAlchemy's ``before_cursor_execute`` fires once per statement (a prepared
    statement run in AUTOCOMMIT is one round trip). asyncpg's query logger
    fires once per query it sends outside them: the pool's pre-ping, and the
    ``BEGIN``/``COMMIT``/``ROLLBACK`` of a connection not in AUTOCOMMIT. The
    logger is added to each connection as it opens, so the pool is emptied
    first. asyncpg calls the logger with ``call_soon``: :func:`settled` lets
    those calls run before a count is read.
    """
    from sqlalchemy import event

    sync_engine = engine.sync_engine
    event.listen(sync_engine, "before_cursor_execute", trips.add)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(trips.add)

    event.listen(sync_engine, "connect", on_connect)
    await engine.dispose()


async def warm_postgres(engine: Any, count: int) -> None:
    """Open ``count`` connections at once (at most what the pool keeps) and use each, so
    the timed parts find them pooled.

    SQLAlchemy skips a pre-ping on a connection's first checkout; an engine
    that pre-pings (``create_engine(..., pool_pre_ping=True)``) does so on
    every checkout in the timed parts alike once the pool is warm.
    """
    from sqlalchemy import text

    kept = engine.sync_engine.pool.size()
    opened: list[Any] = []
    try:
        for _ in range(min(count, kept)):
            conn = await engine.connect()
            opened.append(conn)
            await conn.execute(text("SELECT 1"))
    finally:
        for conn in opened:
            await conn.close()


async def settled(trips: RoundTrips | None) -> tuple[int, int]:
    """The counts once callbacks already scheduled (asyncpg's query logger) have run."""
    if trips is None:
        return 0, 0
    for _ in range(3):
        await asyncio.sleep(0)
    return trips.read()


async def sent_since(trips: RoundTrips | None, before: tuple[int, int]) -> tuple[int, int] | None:
    """Round trips sent since ``before`` (a :func:`settled` reading), all and inside
    commits; None where nothing is counted (memory)."""
    if trips is None:
        return None
    after = await settled(trips)
    return after[0] - before[0], after[1] - before[1]


async def timed(
    callers: int,
    per_caller: int,
    op: Callable[[int, int], Awaitable[object]],
    trips: RoundTrips | None,
    progress: Progress | None = None,
) -> tuple[float, tuple[int, int] | None]:
    """:func:`spread`, with the round trips sent meanwhile (:func:`sent_since`)."""
    before = await settled(trips)
    seconds = await spread(callers, per_caller, op, progress)
    return seconds, await sent_since(trips, before)
