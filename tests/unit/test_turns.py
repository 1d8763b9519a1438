"""Turns on hot keys (statepact._turns): who waits, who is handed the turn, and that a
cancellation or a holder that overstays never strands the line."""

from __future__ import annotations

import asyncio

import pytest

from statepact._turns import KeyTurns

K = ("r", "k")
OTHER = ("r", "other")


async def test_a_key_without_a_conflict_is_not_hot_and_nothing_waits() -> None:
    turns = KeyTurns()
    assert not turns.lines
    assert await turns.take(K) is None


async def test_after_a_conflict_readers_of_the_key_line_up_and_other_keys_do_not() -> None:
    turns = KeyTurns(hold_for=10)
    turns.conflicted(K)
    assert turns.lines
    first = await turns.take(K)
    assert first is not None
    second = asyncio.ensure_future(turns.take(K))
    third = asyncio.ensure_future(turns.take(K))
    await asyncio.sleep(0.01)
    assert not second.done() and not third.done()
    assert await turns.take(OTHER) is None  # another key: no line
    turns.give_back(first)
    granted = await asyncio.wait_for(second, 1)
    assert granted is not None
    await asyncio.sleep(0.01)
    assert not third.done()  # one at a time, in order
    turns.give_back(granted)
    last = await asyncio.wait_for(third, 1)
    assert last is not None
    turns.give_back(last)
    turns.give_back(last)  # twice: a no-op
    again = await turns.take(K)  # the line is empty: granted at once
    assert again is not None
    turns.give_back(again)


async def test_a_holder_that_overstays_is_passed_over_after_hold_for() -> None:
    turns = KeyTurns(hold_for=0.05)
    turns.conflicted(K)
    slow = await turns.take(K)
    assert slow is not None
    loop = asyncio.get_running_loop()
    began = loop.time()
    nxt = await asyncio.wait_for(turns.take(K), 1)
    assert nxt is not None
    assert loop.time() - began >= 0.04
    turns.give_back(slow)  # late: the turn is no longer its own, so nothing changes
    waiting = asyncio.ensure_future(turns.take(K))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # still nxt's turn
    turns.give_back(nxt)
    turns.give_back(await asyncio.wait_for(waiting, 1))  # type: ignore[arg-type]


async def test_a_waiter_cancelled_leaves_the_line_and_the_next_is_served() -> None:
    turns = KeyTurns(hold_for=10)
    turns.conflicted(K)
    holder = await turns.take(K)
    assert holder is not None
    cancelled = asyncio.ensure_future(turns.take(K))
    behind = asyncio.ensure_future(turns.take(K))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    turns.give_back(holder)
    served = await asyncio.wait_for(behind, 1)
    assert served is not None
    turns.give_back(served)


async def test_a_turn_granted_as_its_waiter_is_cancelled_goes_on_to_the_next() -> None:
    turns = KeyTurns(hold_for=10)
    turns.conflicted(K)
    holder = await turns.take(K)
    assert holder is not None
    unlucky = asyncio.ensure_future(turns.take(K))
    behind = asyncio.ensure_future(turns.take(K))
    await asyncio.sleep(0)
    turns.give_back(holder)  # grants `unlucky` its turn...
    unlucky.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await unlucky
    served = await asyncio.wait_for(behind, 1)
    assert served is not None
    turns.give_back(served)


async def test_a_key_cools_down_after_hot_for_without_conflicts_or_waits() -> None:
    turns = KeyTurns(hot_for=0.05, hold_for=10)
    turns.conflicted(K)
    turn = await turns.take(K)
    assert turn is not None
    turns.give_back(turn)
    await asyncio.sleep(0.06)
    assert await turns.take(K) is None
    assert not turns.lines  # forgotten


async def test_only_remember_keys_are_kept_and_a_line_in_use_is_never_dropped() -> None:
    turns = KeyTurns(hold_for=10, remember=2)
    turns.conflicted(K)
    held = await turns.take(K)
    assert held is not None
    waiting = asyncio.ensure_future(turns.take(K))
    await asyncio.sleep(0)
    for n in range(5):
        turns.conflicted(("r", f"k{n}"))
    turns.give_back(held)  # K's line was kept: its waiter is served
    served = await asyncio.wait_for(waiting, 1)
    assert served is not None
    turns.give_back(served)
    assert len(turns.lines) <= 3
