"""The memory queue's flow control: the ``QueueLimits`` it claims under and what they
count (leased items per limit key and per tenant and key, weight per rate window).

:class:`~statepact.storage.memory.queue.MemoryWorkQueue` asks it whether an item is
held back and tells it what it leased, freed and claimed; it never touches the heaps.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from statepact._queue_limits import (
    RATE_BUCKETS,
    QueueLimits,
    admissible_at,
    bucket_of,
    window_start,
)
from statepact.storage.memory._entries import Entry

__all__ = ["LOOKAHEAD", "FlowLedger"]

# The most held-back items one claim passes over in a tenant before it tries the next.
LOOKAHEAD = 64


class FlowLedger:
    """The limits stored with one memory queue and the counts they are checked against."""

    __slots__ = ("_leased_keys", "_leased_pairs", "_spent", "limits")

    def __init__(self) -> None:
        self.limits = QueueLimits()
        # Leased items per limit key and per (tenant, key); per tenant is the queue's counts.
        self._leased_keys: dict[str, int] = {}
        self._leased_pairs: dict[tuple[str, str], int] = {}
        # Weight claimed per rate bucket: ("key" | "tenant", name) -> {bucket: weight}.
        self._spent: dict[tuple[str, str], dict[int, int]] = {}

    def held_back(self, entry: Entry, micros: int) -> tuple[bool, int | None]:
        """Whether a cap or a rate holds the item back now; for a rate, when it would fit
        (``None``: a cap, or never)."""
        flow, key = self.limits, entry.limit_key
        if key is not None:
            cap = flow.key_cap(key)
            if cap is not None and self._leased_keys.get(key, 0) >= cap:
                return True, None
            pair = flow.tenant_key_cap(key)
            if pair is not None and self._leased_pairs.get((entry.tenant, key), 0) >= pair:
                return True, None
        latest = micros
        for kind, name, rate in (
            ("key", key, flow.rate_of_key(key)),
            ("tenant", entry.tenant, flow.tenant_rate),
        ):
            if rate is None or name is None:
                continue
            at = admissible_at(rate, self._spent.get((kind, name), {}), micros, entry.weight)
            if at is None:
                return True, None
            latest = max(latest, at)
        return (latest > micros), (latest if latest > micros else None)

    def spend(self, entry: Entry, micros: int) -> None:
        """Count the item's weight in the rate windows it is claimed under."""
        flow, key = self.limits, entry.limit_key
        for kind, name, rate in (
            ("key", key, flow.rate_of_key(key)),
            ("tenant", entry.tenant, flow.tenant_rate),
        ):
            if rate is None or name is None:
                continue
            buckets = self._spent.setdefault((kind, name), {})
            bucket = bucket_of(rate, micros)
            buckets[bucket] = buckets.get(bucket, 0) + entry.weight
            if len(buckets) > RATE_BUCKETS + 1:  # else all may be in the window: keep them
                oldest = window_start(rate, micros)
                for old in [b for b in buckets if b < oldest]:
                    del buckets[old]

    def hold_key(self, entry: Entry, change: int) -> None:
        key = entry.limit_key
        assert key is not None
        self._leased_keys[key] = self._leased_keys.get(key, 0) + change
        if not self._leased_keys[key]:
            del self._leased_keys[key]
        pair = (entry.tenant, key)
        self._leased_pairs[pair] = self._leased_pairs.get(pair, 0) + change
        if not self._leased_pairs[pair]:
            del self._leased_pairs[pair]

    def pop_allowed(
        self,
        ready: list[tuple[int, int, str]] | None,
        micros: int,
        queued: Callable[[tuple[int, int, str]], Entry | None],
    ) -> tuple[Entry | None, bool, int | None]:
        """A tenant's best due item no limit holds back (taken off its ``ready`` heap),
        whether items were held back, and when the earliest one a rate held back fits;
        ``queued`` gives the item a heap entry stands for (``None``: stale)."""
        held: list[tuple[int, int, str]] = []
        found: Entry | None = None
        fits_at: int | None = None
        while ready and len(held) < LOOKAHEAD:
            top = heapq.heappop(ready)
            entry = queued(top)
            if entry is None:
                continue
            blocked, at = self.held_back(entry, micros)
            if not blocked:
                found = entry
                break
            held.append(top)
            if at is not None:
                fits_at = at if fits_at is None else min(fits_at, at)
        for top in held:
            heapq.heappush(ready, top)  # type: ignore[arg-type]  # ready is set when held
        return found, bool(held), fits_at
