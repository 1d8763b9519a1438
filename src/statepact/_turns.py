"""Turns on contended keys: a manager's transactions on a hot key read it one at a time.

Optimistic transactions on one key, with no backoff, fail each other: all that read
the same version race to commit it, one lands, and the rest are refused and read
again together. Each success then costs as many attempts as there were readers, and
on a server the client's CPU goes to the losers. A key that has just had a conflict
is *hot*; while it is, a transaction whose first read (the one that takes its
snapshot) is of that key waits for its *turn*: the transaction that holds the turn
ends (commits, fails or rolls back) and hands it to the next in line, which then
reads the version just committed. The agents of one ``TransactionManager`` (usually
one per process) line up instead of failing one another; across managers, at most one
agent of each contends.

Nothing is promised by a turn: it only delays a read, which any read may be. A
holder keeps it for at most ``hold_for`` seconds, after which the next in line goes
ahead anyway (a transaction that holds a key's turn through a slow call does not
stall the others for longer). A key stays hot for ``hot_for`` seconds after its last
conflict or its last wait. Conflicts of other managers are not seen here: their
agents are not in this line, and their commits are refused or land as before.

docs/transactions.md#hot-keys says the same for users.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque

__all__ = ["HOLD_FOR", "HOT_FOR", "KeyTurns", "Turn"]

#: Seconds a key stays hot after its last conflict or wait.
HOT_FOR = 1.0
#: Seconds a transaction holds a key's turn at most before the next in line goes ahead.
HOLD_FOR = 0.05
#: Hot keys remembered at most (past it, the least recently heated key nobody holds or
#: waits for is forgotten).
REMEMBER = 1024

Slot = tuple[str, str]


class Turn:
    """One transaction's turn on one key: held from the grant until ``give_back`` (or
    until the key's ``hold_for`` has passed)."""

    __slots__ = ("_expiry", "_line")

    def __init__(self, line: _Line) -> None:
        self._line = line
        self._expiry: asyncio.TimerHandle | None = None


class _Line:
    """A hot key: until when it is hot, the turn's holder and the transactions waiting."""

    __slots__ = ("holder", "hot_until", "waiting")

    def __init__(self, hot_until: float) -> None:
        self.hot_until = hot_until
        self.holder: Turn | None = None
        self.waiting: deque[asyncio.Future[Turn]] = deque()


class KeyTurns:
    """The hot keys of one ``TransactionManager`` and their lines (module docstring)."""

    __slots__ = ("_hold_for", "_hot_for", "_remember", "lines")

    def __init__(
        self, *, hot_for: float = HOT_FOR, hold_for: float = HOLD_FOR, remember: int = REMEMBER
    ) -> None:
        self._hot_for = hot_for
        self._hold_for = hold_for
        self._remember = remember
        # The hot keys' lines, the least recently heated first. Empty while no key is hot:
        # the one test every first read makes (``if turns.lines``).
        self.lines: OrderedDict[Slot, _Line] = OrderedDict()

    def conflicted(self, slot: Slot) -> None:
        """A transaction of this process lost a conflict on ``slot``: it is hot from now."""
        until = asyncio.get_running_loop().time() + self._hot_for
        line = self.lines.get(slot)
        if line is None:
            self.lines[slot] = _Line(until)
            if len(self.lines) > self._remember:
                self._forget_oldest()
        else:
            line.hot_until = until
            self.lines.move_to_end(slot)

    async def take(self, slot: Slot) -> Turn | None:
        """Wait for ``slot``'s turn if it is hot; None if it is not (nothing to give back).

        Cancelled while waiting, the caller leaves the line; a turn handed to it just
        then goes on to the next in line.
        """
        line = self.lines.get(slot)
        if line is None:
            return None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if line.holder is None:
            if line.hot_until < now and not line.waiting:
                del self.lines[slot]  # cooled down
                return None
            return self._grant(line, loop)
        line.hot_until = now + self._hot_for  # a wait: still contended
        waiter: asyncio.Future[Turn] = loop.create_future()
        line.waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back(waiter.result())  # granted as the cancellation came
            else:
                try:
                    line.waiting.remove(waiter)
                except ValueError:  # pragma: no cover - only a grant takes a waiter out
                    pass
            raise

    def give_back(self, turn: Turn) -> None:
        """``turn``'s transaction has ended: the next in line gets the key's turn. A turn
        already passed on (``hold_for`` ran out) is a no-op."""
        if turn._expiry is not None:
            turn._expiry.cancel()
            turn._expiry = None
        line = turn._line
        if line.holder is turn:
            self._pass_on(line)

    def _grant(self, line: _Line, loop: asyncio.AbstractEventLoop) -> Turn:
        turn = line.holder = Turn(line)
        turn._expiry = loop.call_later(self._hold_for, self._expire, turn)
        return turn

    def _expire(self, turn: Turn) -> None:
        turn._expiry = None
        if turn._line.holder is turn:
            self._pass_on(turn._line)

    def _pass_on(self, line: _Line) -> None:
        line.holder = None
        loop = asyncio.get_running_loop()
        while line.waiting:
            waiter = line.waiting.popleft()
            if not waiter.done():  # a waiter cancelled meanwhile is skipped
                waiter.set_result(self._grant(line, loop))
                return

    def _forget_oldest(self) -> None:
        """Forget the least recently heated key whose line is empty (a held or waited-on
        line is kept: its waiters need its hand-overs)."""
        for slot, line in self.lines.items():
            if line.holder is None and not line.waiting:
                del self.lines[slot]
                return
