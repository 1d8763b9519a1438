"""The Redis queue's operator reads (``find_unique``, ``oldest_waiting``,
``finished_per_minute``, ``dead_letters_all``, ``queues``, ``prunable``,
``error_history``): :class:`RedisReads`, which ``RedisWorkQueue`` subclasses.

Each is one script of ``lua/queue/`` or one command, through the queue's failover;
``queues`` alone SCANs the namespace. Only ``error_history`` reads an item's
``errors`` field. Nothing here writes, formats a key (``_keys``) or reads a clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from statepact.clock import from_micros, to_micros
from statepact.models import AttemptError, ItemStatus, QueueStats, WorkItem, stored
from statepact.queue import BaseWorkQueue
from statepact.settings import RedisStoreSettings
from statepact.storage.redis._client import Failover, as_text
from statepact.storage.redis._keys import QueueKeys, ref
from statepact.storage.redis._scripts import ScriptCalls

__all__ = ["FINISHED", "RedisReads", "cutoff_args"]

# oldest_waiting reads at most this many due entries of ``delayed`` (lua/queue/oldest_ready).
_OLDEST_DUE_READ = 100

#: What a finished status is indexed and cut off under, in prune.lua's and prunable.lua's
#: ARGV order.
FINISHED = (ItemStatus.DONE, ItemStatus.CANCELLED, ItemStatus.DEAD)


def cutoff_args(cutoffs: Mapping[ItemStatus, datetime]) -> list[str | int]:
    """The cutoffs of done, cancelled and dead items in µs, '' for a status kept forever."""
    return [
        "" if cutoffs.get(status) is None else to_micros(cutoffs[status]) for status in FINISHED
    ]


class RedisReads(BaseWorkQueue):
    """The reads of :class:`~statepact.storage.redis.queue.RedisWorkQueue`, and ``_run``,
    the one way every call of it runs a script (its client, keys and scripts are
    declared here, set by its constructor)."""

    _redis: Any
    _keys: QueueKeys
    _settings: RedisStoreSettings
    _failover: Failover

    _fixed: tuple[str, ...]
    _scripts: ScriptCalls

    async def _run(
        self,
        what: str,
        script: str,
        now: datetime | None,
        *args: str | int | bytes,
        op: str | None = None,
        key: str | None = None,
    ) -> Any:
        """Run a queue script; a write passes ``op``, the call id naming its replay key
        (or ``key``, the one key after the fixed ones a script names otherwise)."""
        # Scripts that only read take no time: this backing never reads a clock itself.
        argv = (self._keys.prefix, 0 if now is None else to_micros(now), *args)
        if op is not None:
            key = self._keys.op(op)
        keys = self._fixed if key is None else (*self._fixed, key)
        return await self._scripts(f"{what} (queue {self.name!r})", script, keys, argv)

    if TYPE_CHECKING:

        def _item(self, fields: Any) -> WorkItem: ...

        def _sibling(self, name: str) -> RedisReads:
            """This queue's twin for queue ``name``: same client, namespace, clock, policy."""

    async def _count_prunable(
        self, cutoffs: Mapping[ItemStatus, datetime]
    ) -> dict[ItemStatus, int]:
        reply = await self._run("prunable", "prunable", None, *cutoff_args(cutoffs))
        return {
            status: int(counted)
            for status, counted in zip(FINISHED, reply, strict=True)
            if int(counted) >= 0
        }

    async def _dead_letters_all(self, after: tuple[str, str] | None, limit: int) -> list[WorkItem]:
        start = "" if after is None else f"{after[0]}\x00{after[1]}"
        reply = await self._run("dead_letters_all", "dead_letters_all", None, start, limit)
        return [self._item(fields) for fields in reply]

    async def _queues(self) -> list[QueueStats]:
        # Each queue that ever held an item has its enqueue-order key: found by SCAN (an
        # operator's call; its cost follows the keys of the namespace, once).
        pattern = self._keys.match_queues().encode("utf-8")
        names: set[str] = set()

        async def scan() -> None:
            async for key in self._redis.scan_iter(match=pattern, count=1000):
                name = self._keys.queue_of(key)
                if name is not None:
                    names.add(name)

        await self._failover.run(f"queues (namespace {self._settings.namespace!r})", scan)
        found: list[QueueStats] = []
        for name in sorted(names):
            other = self._sibling(name)
            stats = await other._stats()
            if stats.tenants or await other._holds_done():
                found.append(stats)
        return found

    async def _unique_holder(self, tenant: str, slot: str) -> WorkItem | None:
        key, field = self._keys.unique.encode("utf-8"), ref(tenant, slot).encode("utf-8")
        item_id = await self._failover.run(
            f"find_unique (queue {self.name!r})", lambda: self._redis.hget(key, field)
        )
        return None if item_id is None else await self._get_item(tenant, as_text(item_id))

    async def _oldest_ready(self, now: datetime) -> dict[str, datetime]:
        reply = await self._run("oldest_waiting", "oldest_ready", now, _OLDEST_DUE_READ)
        return {
            as_text(tenant): from_micros(int(at))
            for tenant, at in zip(reply[::2], reply[1::2], strict=True)
        }

    async def _finished_counts(
        self, since: datetime, width: timedelta, buckets: int
    ) -> dict[ItemStatus, list[int]]:
        span = width // timedelta(microseconds=1)
        reply = await self._run(
            "finished_per_minute", "finished_counts", None, to_micros(since), span, buckets
        )
        return {
            status: [int(count) for count in counts]
            for status, counts in zip(FINISHED, reply, strict=True)
        }

    async def _holds_done(self) -> bool:
        key = self._keys.finished("done").encode("utf-8")
        held = await self._failover.run(
            f"done items (queue {self.name!r})", lambda: self._redis.exists(key)
        )
        return bool(held)

    async def _error_history(self, tenant: str, item_id: str) -> list[AttemptError] | None:
        key = self._keys.item(tenant, item_id).encode("utf-8")
        found, history = await self._failover.run(
            f"error_history of item {item_id!r} (tenant {tenant!r}) (queue {self.name!r})",
            lambda: self._redis.hmget(key, ("tenant", "errors")),
        )
        if found is None:
            return None
        return [] if history is None else [_entry(entry) for entry in json.loads(history)]


def _entry(entry: dict[str, Any]) -> AttemptError:
    """An entry as ``add_error`` (lua/queue/_prelude.lua) wrote it: ``at`` in µs, a string."""
    return stored(
        AttemptError,
        {
            "attempt": int(entry["attempt"]),
            "error": str(entry["error"]),
            "at": from_micros(int(entry["at"])),
            "kind": str(entry["kind"]),
        },
    )
