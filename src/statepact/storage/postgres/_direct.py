"""The direct executor: a backing's statements on the asyncpg connection of a pooled connection.

Why: what SQLAlchemy does around one statement (an ``AsyncConnection``, two
greenlet hops, result processing) costs several times a loopback round trip, and
a one-statement call needs none of it. So each call checks a connection out of
the engine's pool and runs its statement, compiled once (:class:`Prepared`), on
the asyncpg connection underneath; everything else stays the engine's (pool,
limits, connect and checkout events, type codecs). Connections go from one call
to the next while calls keep coming and go back as soon as none runs; how they
are handed over, kept warm for a watched queue, and shared fairly with the
pool's other waiters: docs/backings.md ("Statements and round trips").

:class:`DirectExecutor` has the contract of ``_client.EngineExecutor``
(``await executor.run(work, idempotent=...)``), its error translation and its
failover. A statement's parameters must be what asyncpg takes as they are (JSON
as text); ``expanding`` parameters are refused (use ``= ANY(:array)``). A call,
once sent, runs to its end before its caller's cancellation goes on (a
connection handed on unsettled would refuse the next statement), except a read
marked ``abandonable``, whose connection is closed instead.

This module must never retry a statement that is not idempotent or resend-safe
and never let an asyncpg or SQLAlchemy exception out.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeGuard, TypeVar, cast

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import Pool, PoolProxiedConnection, QueuePool
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util import greenlet_spawn

from statepact._cancel import finish
from statepact._retry import RetryPolicy
from statepact.errors import StatepactError
from statepact.storage.postgres._client import Failures, is_connection_error

__all__ = ["DirectExecutor", "Prepared", "Rows", "Statements"]

T = TypeVar("T")

_DIALECT: Dialect = asyncpg_dialect()  # type: ignore[no-untyped-call]

# Calls inside a pool's checkout (opening a connection, or waiting for one), by pool, over
# every executor on it: a store, a queue and a backend often share one engine, and a
# connection one of them would pass to its next call goes to the pool when any waits there.
_WAITING: weakref.WeakKeyDictionary[Pool, int] = weakref.WeakKeyDictionary()

_Taken = tuple[Pool, PoolProxiedConnection]

# Steps of the event loop with no call running after which a warm executor checks in what it
# holds between calls: enough for a worker's acks to follow its claim's answer on the
# claim's connection; no timer, so an idle loop passes them in microseconds.
_IDLE_STEPS = 8

# The executors on each engine, for its dispose: the connections they hold between calls
# belong to the pool the engine is dropping, and are closed with it.
_ON_ENGINE: weakref.WeakKeyDictionary[Engine, weakref.WeakSet[DirectExecutor]] = (
    weakref.WeakKeyDictionary()
)


def _register(executor: DirectExecutor, engine: Engine) -> None:
    executors = _ON_ENGINE.get(engine)
    if executors is None:
        executors = _ON_ENGINE[engine] = weakref.WeakSet()
        event.listen(engine, "engine_disposed", _on_disposed)
    executors.add(executor)


def _on_disposed(engine: Engine) -> None:
    """``engine.dispose()`` replaced its pool: close what its executors hold between calls
    (in dispose's greenlet, so the close may do I/O), rather than leave it checked out of
    a pool nobody uses any more until the next call or the garbage collector."""
    for executor in list(_ON_ENGINE.get(engine, ())):
        executor.drop_free()


def _at_capacity(pool: QueuePool) -> bool:
    """Whether ``pool`` has opened every connection it may (``_max_overflow``: SQLAlchemy
    keeps the limit private; -1 is unlimited), so a checkout waits unless one is idle."""
    overflow_limit: int = getattr(pool, "_max_overflow", -1)
    return overflow_limit >= 0 and pool.overflow() >= overflow_limit


class Prepared:
    """A Core statement compiled once for asyncpg: its SQL text and its parameters in order
    (a named ``bindparam`` is taken from the call's parameters, a literal keeps its value)."""

    __slots__ = ("_order", "sql")

    def __init__(self, statement: ClauseElement) -> None:
        compiled = cast(SQLCompiler, statement.compile(dialect=_DIALECT))
        binds = compiled.binds
        if any(bind.expanding for bind in binds.values()):
            raise ValueError("statement: expanding parameters cannot be prepared; use = ANY()")
        self.sql = str(compiled)
        self._order: tuple[tuple[str, bool, Any], ...] = tuple(
            (name, binds[name].required, binds[name].value) for name in compiled.positiontup or ()
        )

    def arguments(self, parameters: Mapping[str, Any] | None) -> list[Any]:
        given = parameters or {}
        return [given[name] if required else value for name, required, value in self._order]


class Rows:
    """The rows of one statement, answering the ``Result`` methods the backings use."""

    __slots__ = ("_rows",)

    def __init__(self, rows: Sequence[Any]) -> None:
        self._rows = rows

    def all(self) -> Sequence[Any]:
        return self._rows

    def mappings(self) -> Rows:
        """Itself: asyncpg's records are read by column name already (``Result.mappings()``)."""
        return self

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def one(self) -> Any:
        if len(self._rows) != 1:
            raise LookupError(f"expected one row, got {len(self._rows)}")
        return self._rows[0]

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        if len(self._rows) > 1:
            raise LookupError(f"expected at most one row, got {len(self._rows)}")
        return self.scalar()


class Statements:
    """What a call's ``work`` runs its statements on: one checked-out connection."""

    __slots__ = ("driver",)

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def execute(
        self, statement: Prepared, parameters: Mapping[str, Any] | None = None
    ) -> Rows:
        return Rows(await self.driver.fetch(statement.sql, *statement.arguments(parameters)))


class DirectExecutor:
    """Runs a call's statements on a connection of ``engine``'s pool, with failover.

    ``policy`` is the failover budget; ``unavailable`` and ``what`` name the
    backing's public error, as for ``EngineExecutor``.
    """

    bound = False

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        policy: RetryPolicy,
        unavailable: Callable[[str], StatepactError],
        what: str,
    ) -> None:
        self._engine = engine
        self._policy = policy
        self._failures = Failures(unavailable, what)
        # Checked-out connections between two calls, with the pool each came from; checked
        # in once no call is running.
        self._free: list[_Taken] = []
        # Connections checked out of the pool by this executor (running or free), and the
        # calls waiting for one of them, first come first served, with their deadlines: a
        # future gets a connection, None for "go to the pool", or TimeoutError. One timer
        # serves the whole queue, set for its first deadline (every wait is the pool's
        # timeout, so the deadlines come in order), rather than one timer per wait.
        self._out = 0
        self._waiters: deque[tuple[float, asyncio.Future[_Taken | None]]] = deque()
        self._expiry: asyncio.TimerHandle | None = None
        self._in_pool = 0  # this executor's calls among _WAITING
        self._running = 0
        self._check_in_soon: asyncio.Handle | None = None
        self._warm = 0  # callers that keep it warm (warm())
        self._idle_steps = 0
        self._closing: set[asyncio.Task[None]] = set()
        _register(self, engine.sync_engine)

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @property
    def target(self) -> AsyncEngine:
        return self._engine

    async def _checkout(self) -> _Taken:
        # The engine's pool now: engine.dispose() replaces it, and a connection of the old
        # one goes back to the old one (which closes it) rather than on to the next call.
        pool = self._engine.sync_engine.pool
        while self._free:
            taken = self._free.pop()
            if taken[0] is pool:
                return taken
            await self._close(taken)
        if self._waits_for_hand_over(pool):
            handed = await self._wait_for_hand_over(pool)
            if handed is not None:
                return handed
        return await self._connect(pool)

    def _waits_for_hand_over(self, pool: Pool) -> TypeGuard[QueuePool]:
        """Whether a call with no connection of its own waits for one this executor's calls
        hand over: the pool may open no more, and has no idle connection or calls of this
        executor wait in it (a connection given back goes to them first, so a caller
        joining them would only make the queue longer)."""
        return bool(
            self._out
            and isinstance(pool, QueuePool)
            and _at_capacity(pool)
            and (self._in_pool or pool.checkedin() == 0)
        )

    async def _connect(self, pool: Pool) -> _Taken:
        """The pool's own checkout, with its events, its waiting and its timeout (I/O when
        it opens, pings or replaces a connection, hence the greenlet)."""
        _WAITING[pool] = _WAITING.get(pool, 0) + 1
        self._in_pool += 1
        try:
            connection = await greenlet_spawn(pool.connect)
        except BaseException:
            # No connection came: a call waiting here for this one's tries the pool itself.
            self._hand_over(None)
            raise
        finally:
            _WAITING[pool] -= 1
            self._in_pool -= 1
        self._out += 1
        return pool, connection

    async def _wait_for_hand_over(self, pool: QueuePool) -> _Taken | None:
        """Wait (within the pool's timeout) for a connection a call of this executor gives
        back; None: take one from the pool instead."""
        loop = asyncio.get_running_loop()
        handed: asyncio.Future[_Taken | None] = loop.create_future()
        timeout = pool.timeout()
        deadline = loop.time() + timeout
        self._waiters.append((deadline, handed))
        if self._expiry is None:
            self._expiry = loop.call_at(deadline, self._expire)
        try:
            taken = await handed
        except BaseException as exc:
            if not handed.done():
                handed.cancel()  # skipped by whoever gives back next
            elif not handed.cancelled() and handed.exception() is None:
                # Handed over as the caller was cancelled: pass it on.
                given = handed.result()
                if given is not None:
                    self._pass_on(given)
            if isinstance(exc, TimeoutError):
                raise sa_exc.TimeoutError(
                    f"no connection of the pool (size {pool.size()}) was free within {timeout:g} s"
                ) from None
            raise
        if taken is not None and taken[0] is not pool:
            self._close_soon(taken)  # of a pool disposed of since
            return None
        return taken

    def _hand_over(self, taken: _Taken | None) -> bool:
        """Give ``taken`` (None: "go to the pool") to the first call still waiting here."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()[1]
            if not waiter.done():
                waiter.set_result(taken)
                if not waiters and self._expiry is not None:
                    self._expiry.cancel()  # nobody left to time out
                    self._expiry = None
                return True
        return False

    def _expire(self) -> None:
        """The queue's timer: each wait past its deadline ends in ``TimeoutError``, then the
        timer is set again for the first wait still running, if any."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiters = self._waiters
        while waiters:
            deadline, waiter = waiters[0]
            if not waiter.done():
                if deadline > now:
                    self._expiry = loop.call_at(deadline, self._expire)
                    return
                waiter.set_exception(TimeoutError())
            waiters.popleft()

    def _pass_on(self, taken: _Taken) -> None:
        """Without I/O: to a waiting call, or kept for the next one (checked in when idle)."""
        if not self._hand_over(taken):
            self._free.append(taken)

    async def _close(self, taken: _Taken, *, wake: bool = True) -> None:
        """Check ``taken`` back in (in a greenlet: a full pool closes an overflow connection,
        which is I/O); ``wake``: a call waiting here goes to the pool instead."""
        self._out -= 1
        if wake:
            self._hand_over(None)
        await greenlet_spawn(taken[1].close)

    def _close_soon(self, taken: _Taken) -> None:
        """:meth:`_close` in a task of its own (a call waiting here goes to the pool)."""
        self._out -= 1
        self._hand_over(None)
        self._in_background(taken[1].close)

    def _in_background(self, function: Callable[[], None]) -> None:
        """Run ``function`` in a greenlet (it may do I/O) in a task of its own, kept until
        it ends."""
        task = asyncio.get_running_loop().create_task(greenlet_spawn(function))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _give_back(self, taken: _Taken) -> None:
        waiting = _WAITING.get(taken[0], 0)
        if waiting > self._in_pool:
            # A call of another executor waits in the pool: this connection is its next, and
            # a call waiting here queues in the pool too (first come, first served).
            await self._close(taken)
        elif waiting:
            # A call of this executor waits in the pool (it went there before this executor
            # held a connection): this one is its next; the calls waiting here come after.
            await self._close(taken, wake=False)
        else:
            self._pass_on(taken)

    async def _checkout_for_read(self) -> _Taken:
        """A read's checkout, in its caller's task: the connection the last call gave back,
        or one handed over (neither does I/O, and a wait cancelled passes on what it was
        handed); else the pool's, run to its end even if the caller is cancelled meanwhile
        (a connection half opened would be torn down under asyncpg), what it got then
        passed on to the next call."""
        pool = self._engine.sync_engine.pool
        free = self._free
        if free:
            if free[-1][0] is pool:
                return free.pop()
            getting = asyncio.ensure_future(self._checkout())  # closes the old pool's
        else:
            if self._waits_for_hand_over(pool):
                handed = await self._wait_for_hand_over(pool)
                if handed is not None:
                    return handed
            getting = asyncio.ensure_future(self._connect(pool))
        try:
            return await finish(getting)
        except asyncio.CancelledError:
            if getting.done() and not getting.cancelled() and getting.exception() is None:
                self._pass_on(getting.result())
            raise

    async def _give_back_to_end(self, taken: _Taken) -> None:
        """:meth:`_give_back`, run to its end even if the caller is cancelled meanwhile;
        without a task of its own when it needs no I/O (no call waits in the pool)."""
        if _WAITING.get(taken[0], 0):
            await finish(self._give_back(taken))
        else:
            self._pass_on(taken)

    def _abandon(self, connection: PoolProxiedConnection, exc: BaseException) -> None:
        """Drop, at once, a connection whose statement's caller was cancelled.

        Its reply may still be on the way, and asyncpg has just scheduled a task that
        asks the server to cancel the statement: handed on, the connection would refuse
        the next call's statement until that settled. Invalidated here, outside a
        greenlet, SQLAlchemy terminates the asyncpg connection without I/O (the socket
        is closed, which also stops the cancel request before it starts: one sent late
        could cancel the next statement of that server session); the server ends the
        session when it next reads from it, and the pool opens another one when needed.
        A call waiting here goes to the pool meanwhile.
        """
        self._out -= 1
        self._hand_over(None)
        connection.invalidate(exc)

    @contextlib.contextmanager
    def warm(self) -> Iterator[None]:
        """While held, what is held between calls goes back to the pool after
        ``_IDLE_STEPS`` idle steps of the loop rather than at the next one (at once when a
        caller waits in the pool): for a caller whose calls follow each other by a few
        steps, a worker's claims and acks. Whoever holds it ends it before its loop ends
        (a connection still held when the loop closes is left to the garbage collector)."""
        self._warm += 1
        try:
            yield
        finally:
            self._warm -= 1
            self._schedule_check_in()

    def _ended(self) -> None:
        """A call ended: once none runs, what is held between calls goes back to the pool
        at the loop's next step, or a few steps on while warm (a call starting before then
        takes it instead)."""
        self._running -= 1
        self._idle_steps = 0
        self._schedule_check_in()

    def _schedule_check_in(self) -> None:
        if not self._running and self._free and self._check_in_soon is None:
            self._check_in_soon = asyncio.get_running_loop().call_soon(self._check_in_idle)

    def _check_in_idle(self) -> None:
        self._check_in_soon = None
        if self._running or not self._free:
            return
        if self._warm and self._idle_steps < _IDLE_STEPS and not _WAITING.get(self._free[-1][0], 0):
            self._idle_steps += 1
            self._check_in_soon = asyncio.get_running_loop().call_soon(self._check_in_idle)
            return
        # In a greenlet: a pool already full closes what comes back past its size (the
        # overflow connections of a busy moment), and closing an asyncpg connection is I/O.
        self._in_background(self.check_in)

    def drop_free(self) -> None:
        """Close every connection held between calls (the engine disposed of their pool);
        in a greenlet, as closing an asyncpg connection is I/O."""
        free, self._free = self._free, []
        self._out -= len(free)
        for _pool, connection in free:
            connection.invalidate()

    def check_in(self) -> None:
        """Give every connection held between calls back to the pool (the backing closing).
        The driver never began a transaction, so the reset sends nothing; a pool already
        full closes an overflow connection, which is I/O: the idle check-in runs this in a
        greenlet for that."""
        free, self._free = self._free, []
        self._out -= len(free)
        for _pool, connection in free:
            connection.close()

    async def run(
        self,
        work: Callable[[Statements], Awaitable[T]],
        *,
        idempotent: bool,
        resend_safe: bool = False,
        abandonable: bool = False,
    ) -> T:
        """Run ``work`` on a pooled connection, waiting out a failover within the policy.

        ``idempotent``: running it twice is harmless. ``resend_safe``: a write
        that recognises its own first attempt. ``abandonable``: a read that
        changes nothing, which a cancelled caller does not wait for: its
        connection is closed (:meth:`_abandon`) rather than given back.
        """
        sent = False

        async def attempt() -> T:
            nonlocal sent
            sent = False
            self._running += 1
            try:
                taken = await self._checkout()
                connection = taken[1]
                sent = True
                try:
                    result = await work(Statements(connection.driver_connection))
                except BaseException as exc:
                    if is_connection_error(exc):
                        # Never pooled again; closing the dead socket is I/O. Invalidating
                        # checks the connection in: closing it as well would return its
                        # record to the pool twice, for two callers to share.
                        self._out -= 1
                        self._hand_over(None)
                        await greenlet_spawn(connection.invalidate, exc)
                    else:
                        await self._give_back(taken)
                    raise
                await self._give_back(taken)
                return result
            finally:
                self._ended()

        async def read() -> T:
            # An abandonable call's attempt, in the caller's task: a cancellation may cut
            # its statement short, never a checkout or a check-in (those run to their end).
            nonlocal sent
            sent = False
            self._running += 1
            try:
                taken = await self._checkout_for_read()
                connection = taken[1]
                sent = True
                try:
                    result = await work(Statements(connection.driver_connection))
                except BaseException as exc:
                    if isinstance(exc, asyncio.CancelledError) or is_connection_error(exc):
                        self._abandon(connection, exc)
                    else:
                        await self._give_back_to_end(taken)
                    raise
                await self._give_back_to_end(taken)
                return result
            finally:
                self._ended()

        return await self._failures.call(
            read if abandonable else attempt,
            policy=self._policy,
            idempotent=idempotent,
            resend_safe=resend_safe,
            sent=lambda: sent,
            abandonable=abandonable,
        )
