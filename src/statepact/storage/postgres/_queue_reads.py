"""The PostgreSQL queue's reads beside the hot path: ``stats`` and the operator's
(``find_unique``, ``oldest_waiting``, ``finished_per_minute``, ``dead_letters_all``,
``queues``, ``prunable``, ``error_history``): :class:`PostgresReads`, which
``PostgresWorkQueue`` subclasses.

Each runs one statement of ``_sql/queue/reads.py`` (``queues``: one per queue) through
the queue's executor, idempotent, so a lost reply is simply asked again. Only
``error_history`` reads the ``error_history`` column. Nothing here writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from statepact.models import (
    AttemptError,
    ItemStatus,
    QueueStats,
    TenantQueueStats,
    WorkItem,
    stored,
)
from statepact.queue import BaseWorkQueue
from statepact.storage.postgres._client import Executor
from statepact.storage.postgres._queue_support import Conn, Statements, cutoff_params, item_of

__all__ = ["PostgresReads"]


class PostgresReads(BaseWorkQueue):
    """The reads of :class:`~statepact.storage.postgres.queue.PostgresWorkQueue`, through
    its executor and statements (declared here, set by its constructor)."""

    _executor: Executor
    _sql: Statements

    async def _stats(self) -> QueueStats:
        return await self._stats_of(self.name)

    async def _stats_of(self, queue: str) -> QueueStats:
        params = {"p_queue": queue}

        async def work(conn: Conn) -> list[Any]:
            return list(await conn.execute(self._sql.stats, params))

        counts: dict[str, dict[str, int]] = {}
        for tenant, status, count in await self._executor.run(work, idempotent=True):
            counts.setdefault(tenant, {})[status] = int(count)
        tenants = {
            tenant: TenantQueueStats(
                queued=found.get("queued", 0),
                leased=found.get("leased", 0),
                dead=found.get("dead", 0),
                cancelled=found.get("cancelled", 0),
            )
            for tenant, found in sorted(counts.items())
        }
        return QueueStats(queue=self.name, tenants=tenants)

    async def _dead_letters_all(self, after: tuple[str, str] | None, limit: int) -> list[WorkItem]:
        params = {
            "p_queue": self.name,
            "p_after_tenant": None if after is None else after[0],
            "p_after_item_id": None if after is None else after[1],
            "p_limit": limit,
        }

        async def work(conn: Conn) -> list[WorkItem]:
            result = await conn.execute(self._sql.dead_letters_all, params)
            return [item_of(row) for row in result.mappings()]

        return await self._executor.run(work, idempotent=True)

    async def _queues(self) -> list[QueueStats]:
        async def names(conn: Conn) -> list[str]:
            return [row[0] for row in await conn.execute(self._sql.queue_names, {})]

        found = []
        for name in await self._executor.run(names, idempotent=True):
            counted = await self._stats_of(name)
            found.append(counted)
        return found

    async def _unique_holder(self, tenant: str, slot: str) -> WorkItem | None:
        params = {"p_queue": self.name, "p_tenant": tenant, "p_unique_slot": slot}

        async def work(conn: Conn) -> WorkItem | None:
            row = (await conn.execute(self._sql.slot_holder, params)).mappings().first()
            return None if row is None else item_of(row)

        return await self._executor.run(work, idempotent=True)

    async def _oldest_ready(self, now: datetime) -> dict[str, datetime]:
        params = {"p_queue": self.name, "p_now": now}

        async def work(conn: Conn) -> dict[str, datetime]:
            rows = await conn.execute(self._sql.oldest_ready, params)
            return {tenant: at for tenant, at in rows if at is not None}

        return await self._executor.run(work, idempotent=True)

    async def _finished_counts(
        self, since: datetime, width: timedelta, buckets: int
    ) -> dict[ItemStatus, list[int]]:
        seconds = width.total_seconds()
        params = {
            "p_queue": self.name,
            "p_since": since,
            "p_until": since + buckets * width,
            "p_width": seconds,
        }

        async def work(conn: Conn) -> dict[ItemStatus, list[int]]:
            counts: dict[ItemStatus, list[int]] = {}
            for status, bucket, count in await conn.execute(self._sql.finished_counts, params):
                row = counts.setdefault(ItemStatus(status), [0] * buckets)
                if 0 <= bucket < buckets:
                    row[bucket] += int(count)
            return counts

        return await self._executor.run(work, idempotent=True)

    async def _count_prunable(
        self, cutoffs: Mapping[ItemStatus, datetime]
    ) -> dict[ItemStatus, int]:
        params = {"p_queue": self.name, **cutoff_params(cutoffs)}

        async def work(conn: Conn) -> dict[ItemStatus, int]:
            row = (await conn.execute(self._sql.count_prunable, params)).mappings().one()
            return {status: int(row[status.value]) for status in cutoffs}

        return await self._executor.run(work, idempotent=True)

    async def _error_history(self, tenant: str, item_id: str) -> list[AttemptError] | None:
        params = {"p_queue": self.name, "p_tenant": tenant, "p_item_id": item_id}

        async def work(conn: Conn) -> tuple[str | None] | None:
            row = (await conn.execute(self._sql.error_history, params)).first()
            return None if row is None else (row[0],)

        found = await self._executor.run(work, idempotent=True)
        if found is None:
            return None
        return [] if found[0] is None else [_entry(entry) for entry in json.loads(found[0])]


def _entry(entry: dict[str, Any]) -> AttemptError:
    """An entry as ``history_appended`` wrote it (``at`` in the session's time zone)."""
    return stored(
        AttemptError,
        {
            "attempt": int(entry["attempt"]),
            "error": str(entry["error"]),
            "at": datetime.fromisoformat(entry["at"]).astimezone(UTC),
            "kind": str(entry["kind"]),
        },
    )
