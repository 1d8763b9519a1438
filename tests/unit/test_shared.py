"""statepact._shared: concurrent calls sharing round trips, with stand-in senders that record
what was sent together (the backings' own senders are tested against real servers)."""

from __future__ import annotations

import asyncio

import pytest

from statepact._shared import SharedRoundTrips


class Sender:
    """Sends calls (ints) alone or together, recording each send; a call in ``held`` waits
    for ``release`` before its send ends."""

    def __init__(self) -> None:
        self.sends: list[list[int]] = []
        self.held: set[int] = set()
        self.release = asyncio.Event()

    async def _send(self, calls: list[int]) -> list[int]:
        self.sends.append(calls)
        if self.held.intersection(calls):
            await self.release.wait()
        await asyncio.sleep(0.001)
        return [call * 10 for call in calls]

    async def one(self, call: int) -> int:
        return (await self._send([call]))[0]

    async def many(self, calls: list[int]) -> list[int]:
        return await self._send(calls)

    def shared(
        self,
        *,
        patience: float = 10.0,
        max_items: int = 100,
        keys: int = 1000,
        refused: set[int] | None = None,
    ) -> SharedRoundTrips[int, int]:
        """Two calls share a key when they are equal modulo ``keys``; the patience is long
        enough by default that no send is overdue on a loaded machine. A call in ``refused``
        (as it is when its batch is formed) is answered ``ValueError`` without a send."""

        def refusal(call: int) -> BaseException | None:
            return ValueError(f"refused {call}") if refused and call in refused else None

        return SharedRoundTrips(
            self.one,
            self.many,
            keys=lambda call: (call % keys,),
            size=lambda _call: 1,
            max_items=max_items,
            max_bytes=1000,
            name="test-shared",
            patience=patience,
            refused=refusal if refused is not None else None,
        )


async def test_a_lone_call_goes_at_once_and_the_calls_made_meanwhile_go_together() -> None:
    sender = Sender()
    shared = sender.shared()
    answers = await asyncio.gather(*(shared.send(n) for n in range(5)))
    assert answers == [0, 10, 20, 30, 40]
    assert sender.sends == [[0], [1, 2, 3, 4]]


async def test_calls_sharing_a_key_or_past_the_limit_wait_for_the_next_batch() -> None:
    sender = Sender()
    shared = sender.shared(max_items=3, keys=5)
    answers = await asyncio.gather(*(shared.send(n) for n in range(9)))
    assert answers == [n * 10 for n in range(9)]
    assert sender.sends == [[0], [1, 2, 3], [4, 5, 6], [7, 8]]
    for batch in sender.sends:
        assert len(batch) <= 3
        assert len({call % 5 for call in batch}) == len(batch)
    assert sorted(call for batch in sender.sends for call in batch) == list(range(9))


async def test_waiting_calls_refused_before_their_turn_are_answered_without_a_send() -> None:
    """The calls behind the first, sharing its key, are refused once it is answered (as
    PostgresBackend refuses the commits a landed commit dooms): all of them at the next
    batch, none sent; the call of another key goes on."""
    sender = Sender()
    refused: set[int] = set()
    shared = sender.shared(keys=5, refused=refused)
    first = asyncio.ensure_future(shared.send(0))
    behind = [asyncio.ensure_future(shared.send(n)) for n in (5, 10, 15, 1)]
    await asyncio.sleep(0)  # all five made; the first is on its way alone
    refused.update({5, 10, 15})  # what its landing dooms
    assert await first == 0
    outcomes = await asyncio.gather(*behind, return_exceptions=True)
    assert [str(o) for o in outcomes[:3]] == ["refused 5", "refused 10", "refused 15"]
    assert outcomes[3] == 10
    assert sender.sends == [[0], [1]]


async def test_a_batch_of_refusals_alone_sends_nothing() -> None:
    sender = Sender()
    shared = sender.shared(refused={1, 2})
    first = asyncio.ensure_future(shared.send(0))
    others = [asyncio.ensure_future(shared.send(n)) for n in (1, 2)]
    assert await first == 0
    outcomes = await asyncio.gather(*others, return_exceptions=True)
    assert all(isinstance(o, ValueError) for o in outcomes)
    assert sender.sends == [[0]]
    assert await shared.send(3) == 30  # nothing on its way: sent at once
    assert sender.sends == [[0], [3]]


async def test_callers_in_a_loop_keep_joining_one_batch() -> None:
    """Forty callers each calling again as soon as they are answered, five times: the calls
    go in about one send per round (one of them going alone every other batch would take
    ten sends)."""
    sender = Sender()
    shared = sender.shared()

    async def caller(n: int) -> None:
        for _ in range(5):
            assert await shared.send(n) == n * 10

    await asyncio.gather(*(caller(n) for n in range(40)))
    assert len(sender.sends) <= 7, [len(batch) for batch in sender.sends]


async def test_calls_waiting_for_a_stalled_send_go_without_it_after_the_patience() -> None:
    sender = Sender()
    sender.held.add(0)
    shared = sender.shared(patience=0.05)
    stalled = asyncio.create_task(shared.send(0))
    await asyncio.sleep(0.01)
    others = await asyncio.wait_for(asyncio.gather(*(shared.send(n) for n in (1, 2, 3))), 1.0)
    assert others == [10, 20, 30]
    assert not stalled.done()
    sender.release.set()
    assert await stalled == 0
    assert sender.sends == [[0], [1, 2, 3]]


async def test_a_caller_cancelled_before_its_batch_is_sent_is_taken_out() -> None:
    sender = Sender()
    sender.held.add(0)
    shared = sender.shared(patience=10)
    stalled = asyncio.create_task(shared.send(0))
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(shared.send(n)) for n in (1, 2)]
    await asyncio.sleep(0.01)
    waiting[0].cancel()
    sender.release.set()
    assert await stalled == 0
    assert await waiting[1] == 20
    with pytest.raises(asyncio.CancelledError):
        await waiting[0]
    assert sender.sends == [[0], [2]]
