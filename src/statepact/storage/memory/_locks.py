"""The lock manager of ``MemoryBackend``: shared/exclusive locks with a wait-for graph.

A waiter that would close a cycle of waits is refused at once with
``DeadlockError`` (only that one); see docs/backings.md#memory. It holds locks
for transactions of this process only: nothing here is safe across processes
or OS threads, and nothing reads a clock (a wait is bounded by the timeout the
front passes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from statepact.errors import DeadlockError, LockTimeoutError
from statepact.tx import LockMode

__all__ = ["LockManager", "Slot"]

#: A lockable, versioned place: ``(resource, key)``.
Slot = tuple[str, str]


@dataclass(eq=False)
class _Waiter:
    txn_id: str
    mode: LockMode
    granted: asyncio.Future[None]


class LockManager:
    """Shared/exclusive locks per ``(resource, key)`` with wait-for cycle detection.

    A request compatible with the current holders is granted at once (there is
    no queueing ahead of compatible requests). Otherwise the requester waits;
    its wait-for edges point at the holders in its way. If the requester is
    already reachable from one of those holders, waiting would close a cycle,
    and the requester (only it) gets ``DeadlockError``. Releases grant waiters
    that became compatible, in arrival order.
    """

    def __init__(self) -> None:
        self._holders: dict[Slot, dict[str, LockMode]] = {}
        self._waiters: dict[Slot, list[_Waiter]] = {}
        self._held: dict[str, set[Slot]] = {}
        self._waits_for: dict[str, set[str]] = {}

    def _blockers(self, slot: Slot, txn_id: str, mode: LockMode) -> set[str]:
        holders = self._holders.get(slot, {})
        if mode is LockMode.SHARED:
            return {t for t, m in holders.items() if t != txn_id and m is LockMode.EXCLUSIVE}
        return {t for t in holders if t != txn_id}

    def _grant(self, slot: Slot, txn_id: str, mode: LockMode) -> None:
        holders = self._holders.setdefault(slot, {})
        if holders.get(txn_id) is not LockMode.EXCLUSIVE:
            holders[txn_id] = mode
        self._held.setdefault(txn_id, set()).add(slot)

    def _reaches(self, start: Iterable[str], target: str) -> bool:
        seen: set[str] = set()
        stack = list(start)
        while stack:
            txn = stack.pop()
            if txn == target:
                return True
            if txn in seen:
                continue
            seen.add(txn)
            stack.extend(self._waits_for.get(txn, ()))
        return False

    def holders(self, slot: Slot) -> dict[str, LockMode]:
        """Who holds the slot, and how (a copy)."""
        return dict(self._holders.get(slot, {}))

    async def acquire(
        self,
        txn_id: str,
        slot: Slot,
        mode: LockMode,
        timeout: float,  # noqa: ASYNC109 - the wait budget is part of the request
    ) -> None:
        held = self._holders.get(slot, {}).get(txn_id)
        if held is LockMode.EXCLUSIVE or held is mode:
            return
        blockers = self._blockers(slot, txn_id, mode)
        if not blockers:
            self._grant(slot, txn_id, mode)
            return
        if self._reaches(blockers, txn_id):
            raise DeadlockError(resource=slot[0], key=slot[1])
        if timeout <= 0:
            raise LockTimeoutError(resource=slot[0], key=slot[1], timeout=timeout)
        waiter = _Waiter(txn_id, mode, asyncio.get_running_loop().create_future())
        self._waiters.setdefault(slot, []).append(waiter)
        self._waits_for[txn_id] = blockers
        try:
            await asyncio.wait_for(waiter.granted, timeout)
        except TimeoutError:
            raise LockTimeoutError(resource=slot[0], key=slot[1], timeout=timeout) from None
        finally:
            self._waits_for.pop(txn_id, None)
            queue = self._waiters.get(slot)
            if queue is not None and waiter in queue:
                queue.remove(waiter)
                if not queue:
                    del self._waiters[slot]

    def release_all(self, txn_id: str) -> None:
        """Release every lock ``txn_id`` holds and grant the waiters that became compatible."""
        held = self._held.pop(txn_id, None)
        if held is None:
            return
        for slot in held:
            holders = self._holders.get(slot)
            if holders is None:
                continue
            holders.pop(txn_id, None)
            if not holders:
                del self._holders[slot]
            self._wake(slot)

    def _wake(self, slot: Slot) -> None:
        for waiter in list(self._waiters.get(slot, ())):
            if waiter.granted.done():
                continue  # timed out or cancelled; its own cleanup removes it
            blockers = self._blockers(slot, waiter.txn_id, waiter.mode)
            if blockers:
                # Still waiting, possibly on someone new: keep its wait-for edges current.
                self._waits_for[waiter.txn_id] = blockers
                continue
            self._grant(slot, waiter.txn_id, waiter.mode)
            waiter.granted.set_result(None)
