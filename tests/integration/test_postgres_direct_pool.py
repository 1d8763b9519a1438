"""The direct executor's connections when its callers outnumber the pool, on a real server.

Calls beyond a full pool wait for a connection the executor's own calls give back,
handed over directly rather than checked in and out of the pool again; they still
meet the pool's timeout, and a waiter that is cancelled, before or just after it is
handed a connection, leaks nothing: the connection goes on to the next caller and
back to the pool when the executor is idle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact._retry import RetryPolicy
from statepact.errors import PoolExhaustedError, StatePersistenceError
from statepact.storage.postgres._direct import DirectExecutor, Statements

pytestmark = pytest.mark.integration


def _executor(engine: AsyncEngine) -> DirectExecutor:
    return DirectExecutor(
        engine,
        policy=RetryPolicy(attempts=1, base_delay=0.01, max_delay=0.01),
        unavailable=StatePersistenceError,
        what="test",
    )


async def _backend_pid(statements: Statements) -> int:
    pid: int = await statements.driver.fetchval("SELECT pg_backend_pid()")
    return pid


async def _until(condition: Callable[[], bool]) -> None:
    """Until ``condition()`` holds (a few seconds at most, however loaded the machine)."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def _waiting(executor: DirectExecutor) -> int:
    """Calls waiting for a connection this executor hands over."""
    return sum(not waiter.done() for _deadline, waiter in executor._waiters)


async def _idle(engine: AsyncEngine) -> None:
    """Until the executor's idle check-in ran (it runs at the loop's next step)."""
    for _ in range(100):
        if engine.sync_engine.pool.checkedout() == 0:  # type: ignore[attr-defined]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the executor kept its connections while idle")


@pytest.fixture
async def small_engine(pg_database_url: str) -> Any:
    engine = create_async_engine(pg_database_url, pool_size=2, max_overflow=0, pool_timeout=0.5)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_callers_beyond_the_pool_are_handed_its_connections(
    small_engine: AsyncEngine,
) -> None:
    """20 callers on a pool of 2: every call runs, on the pool's two connections, and the
    pool is checked out about once a caller (their first calls all queue in the pool), not
    once a call."""
    checkouts: list[int] = []
    event.listen(small_engine.sync_engine.pool, "checkout", lambda *_args: checkouts.append(1))
    executor = _executor(small_engine)
    pids: list[int] = []

    async def caller() -> None:
        for _ in range(10):
            pids.append(await executor.run(_backend_pid, idempotent=True))

    await asyncio.gather(*(caller() for _ in range(20)))
    assert len(pids) == 200
    assert len(set(pids)) <= 2
    # Every call through the pool: about 200 (192 to 197 measured). Handed over: one per
    # caller, whose first calls all queue in the pool (20 to 28 measured, loaded or not).
    assert len(checkouts) <= 40, f"{len(checkouts)} checkouts for 200 calls"
    await _idle(small_engine)


async def test_a_caller_waiting_for_a_hand_over_meets_the_pool_timeout(
    small_engine: AsyncEngine,
) -> None:
    """Both connections held past the pool's timeout (0.5 s): callers waiting for a
    hand-over get PoolExhaustedError each about that long after it began (the queue's one
    timer is set again for the next deadline), not a wait without end."""
    executor = _executor(small_engine)
    release = asyncio.Event()

    async def hold(statements: Statements) -> int:
        await release.wait()
        return await _backend_pid(statements)

    async def waited() -> float:
        started = time.monotonic()
        with pytest.raises(PoolExhaustedError):
            await executor.run(_backend_pid, idempotent=True)
        return time.monotonic() - started

    holders = [asyncio.create_task(executor.run(hold, idempotent=True)) for _ in range(2)]
    await _until(lambda: executor._out == 2)
    first = asyncio.create_task(waited())
    await asyncio.sleep(0.3)
    second = asyncio.create_task(waited())
    await _until(lambda: _waiting(executor) == 2)
    first_waited = await first
    assert _waiting(executor) == 1  # the second is still within its own timeout
    second_waited = await asyncio.wait_for(second, 3.0)
    assert 0.4 <= first_waited < 1.5
    assert 0.4 <= second_waited < 1.5
    release.set()
    assert len(set(await asyncio.gather(*holders))) == 2
    assert await executor.run(_backend_pid, idempotent=True) > 0
    await _idle(small_engine)


async def test_a_cancelled_caller_waiting_for_a_hand_over_still_finishes_its_call(
    small_engine: AsyncEngine,
) -> None:
    """A call, once begun, runs to its end before its caller's cancellation goes on (the
    failover shields it), waiting for a hand-over included: the caller gets its
    CancelledError after the statement ran, and nothing is left checked out."""
    executor = _executor(small_engine)
    release = asyncio.Event()
    ran: list[int] = []

    async def hold(statements: Statements) -> int:
        await release.wait()
        return await _backend_pid(statements)

    async def note(statements: Statements) -> int:
        ran.append(await _backend_pid(statements))
        return ran[-1]

    holders = [asyncio.create_task(executor.run(hold, idempotent=True)) for _ in range(2)]
    await _until(lambda: executor._out == 2)
    waiter = asyncio.create_task(executor.run(note, idempotent=True))
    await _until(lambda: _waiting(executor) == 1)
    waiter.cancel()
    await asyncio.sleep(0.05)
    assert not waiter.done() and ran == []  # still waiting for a connection
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(ran) == 1 and ran[0] in await asyncio.gather(*holders)
    await _idle(small_engine)


@pytest.mark.parametrize("when", ["while waiting", "just handed a connection"])
async def test_a_wait_for_a_hand_over_that_ends_early_leaks_no_connection(
    small_engine: AsyncEngine, when: str
) -> None:
    """Two holders fill the pool; a checkout A waits, then caller B. A's own task is
    cancelled (what the pool timeout does to it too) either while it waits or right after a
    holder handed it a connection, before it resumed: B still gets a connection (A's, in the
    second case), and the pool has everything back when the executor is idle."""
    executor = _executor(small_engine)
    release_first, release_second = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    waiter_a: asyncio.Task[Any] | None = None

    async def hold_then_cancel_a(statements: Statements) -> int:
        await release_first.wait()
        pid = await _backend_pid(statements)
        # Runs after this call handed its connection to A (as it returns) and before A
        # resumes: A is cancelled holding a connection it never used.
        assert waiter_a is not None
        loop.call_soon(waiter_a.cancel)
        return pid

    async def hold(statements: Statements) -> int:
        await release_second.wait()
        return await _backend_pid(statements)

    first = asyncio.create_task(executor.run(hold_then_cancel_a, idempotent=True))
    second = asyncio.create_task(executor.run(hold, idempotent=True))
    await _until(lambda: executor._out == 2)
    # The checkout itself, outside the failover's shield, so the cancellation reaches it.
    waiter_a = asyncio.create_task(executor._checkout())
    await _until(lambda: _waiting(executor) == 1)
    waiter_b = asyncio.create_task(executor.run(_backend_pid, idempotent=True))
    await _until(lambda: _waiting(executor) == 2)
    if when == "while waiting":
        waiter_a.cancel()
        await _until(waiter_a.done)
        assert waiter_a.cancelled() and _waiting(executor) == 1
    release_first.set()
    first_pid = await first
    with pytest.raises(asyncio.CancelledError):
        await waiter_a
    assert await asyncio.wait_for(waiter_b, 2.0) == first_pid  # A's connection went on to B
    release_second.set()
    assert await second not in (0, first_pid)
    assert await executor.run(_backend_pid, idempotent=True) > 0
    await _idle(small_engine)


@pytest.mark.parametrize("abandonable", [True, False], ids=["abandonable", "shielded"])
async def test_a_cancelled_read_is_abandoned_only_when_it_may_be(
    small_engine: AsyncEngine, abandonable: bool
) -> None:
    """A statement stalled on a table another session holds ACCESS EXCLUSIVE, its caller
    cancelled by wait_for after 0.2 s: an abandonable call raises at once and its
    connection is dropped, never handed on (the next call runs on another server session);
    any other call waits for its reply, which comes once the lock is let go, and its
    connection goes back to the pool. Either way nothing stays checked out and the loop
    reports nothing; an abandoned session ends once the lock is released."""
    executor = _executor(small_engine)
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    stalled: list[int] = []

    async def read_stalled(statements: Statements) -> int:
        stalled.append(await _backend_pid(statements))
        count: int = await statements.driver.fetchval("SELECT count(*) FROM abandon_probe")
        return count

    async with small_engine.connect() as setup:
        await setup.exec_driver_sql("CREATE TABLE abandon_probe (id int)")
        await setup.commit()
    try:
        async with small_engine.connect() as locker:
            await locker.exec_driver_sql("LOCK TABLE abandon_probe IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            call = executor.run(read_stalled, idempotent=True, abandonable=abandonable)
            if abandonable:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(call, 0.2)
                assert time.monotonic() - started < 1.0  # did not wait for the lock
                assert executor._out == 0  # dropped, not kept for the next call
                # The next call is on another server session: the stalled one still waits.
                assert await executor.run(_backend_pid, idempotent=True) != stalled[0]
            else:
                waiting = asyncio.create_task(asyncio.wait_for(call, 0.2))
                await asyncio.sleep(0.6)
                assert not waiting.done()  # the cancelled call waits for its reply
            await locker.rollback()
        if not abandonable:
            with pytest.raises(TimeoutError):
                await waiting
            assert time.monotonic() - started >= 0.6
            assert await executor.run(_backend_pid, idempotent=True) > 0
        await _idle(small_engine)

        async def session_gone() -> bool:
            async with small_engine.connect() as probe:
                found = await probe.exec_driver_sql(
                    f"SELECT count(*) FROM pg_stat_activity WHERE pid = {stalled[0]}"
                )
                return found.scalar_one() == 0

        if abandonable:
            for _ in range(100):
                if await session_gone():
                    break
                await asyncio.sleep(0.02)
            assert await session_gone()  # it read its closed socket once the lock was gone
        await asyncio.sleep(0.05)  # let anything the cancel left scheduled run (and report)
    finally:
        loop.set_exception_handler(previous)
        async with small_engine.connect() as cleanup:
            await cleanup.exec_driver_sql("DROP TABLE abandon_probe")
            await cleanup.commit()
    assert not reported, [context.get("message") for context in reported]
    await _idle(small_engine)


async def test_disposing_of_the_engine_closes_what_an_executor_holds_between_calls(
    pg_database_url: str,
) -> None:
    """A read gives its connection back to the executor for its next call (checked in at
    the loop's next step); disposing of the engine right after closes that connection
    with the pool, instead of leaving it checked out of a pool nobody uses any more."""
    engine = create_async_engine(pg_database_url, pool_size=2, max_overflow=0)
    executor = _executor(engine)
    try:
        pid = await executor.run(_backend_pid, idempotent=True, abandonable=True)
        assert len(executor._free) == 1  # held for the next call
        await engine.dispose()
        assert executor._free == [] and executor._out == 0
    finally:
        await engine.dispose()
    probe = create_async_engine(pg_database_url)
    try:
        async with probe.connect() as conn:
            for _ in range(100):
                found = await conn.exec_driver_sql(
                    f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
                )
                if found.scalar_one() == 0:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the held connection's session outlived the dispose")
    finally:
        await probe.dispose()


async def _steps(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_warm_executor_keeps_its_connection_for_a_few_idle_steps(
    small_engine: AsyncEngine,
) -> None:
    """Warm (a queue being watched: a worker), a call made a few loop steps after the last
    one ended takes its connection with no trip through the pool, as a worker's acks follow
    its claim; idle longer, or no longer warm, the connection goes back to the pool."""
    from statepact.storage.postgres._direct import _IDLE_STEPS

    checkouts: list[int] = []
    event.listen(small_engine.sync_engine.pool, "checkout", lambda *_args: checkouts.append(1))
    pool: Any = small_engine.sync_engine.pool
    executor = _executor(small_engine)

    # Cold: checked in at the next step, so each call a few steps apart checks out again.
    for _ in range(3):
        await executor.run(_backend_pid, idempotent=True)
        await _steps(4)
    assert len(checkouts) == 3 and pool.checkedout() == 0

    checkouts.clear()
    with executor.warm():
        first = await executor.run(_backend_pid, idempotent=True)
        for _ in range(5):
            await _steps(_IDLE_STEPS // 2)
            assert await executor.run(_backend_pid, idempotent=True) == first
        assert len(checkouts) == 1
        assert pool.checkedout() == 1  # held between calls
        await _steps(_IDLE_STEPS + 4)  # idle past the steps: back in the pool
        assert pool.checkedout() == 0
        await executor.run(_backend_pid, idempotent=True)
        assert pool.checkedout() == 1
    await _steps(4)  # no longer warm: checked in at the next step
    assert pool.checkedout() == 0
    assert len(checkouts) == 2
