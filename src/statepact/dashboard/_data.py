"""The numbers the pages and ``/metrics`` show, read through the public protocols only.

Every read here is bounded: queue counts come from ``WorkQueue.stats()`` (whose
cost does not grow with finished work), the oldest wait from ``oldest_waiting()``
(one index head per tenant), throughput from ``finished_per_minute()`` (range
counts of the finished index), an item from ``get_item`` or ``find_unique`` (one
index probe), a tenant's dead letter from ``dead_letters(limit=)``, runs from a
``list_runs`` page, totals from ``run_totals`` (the window's runs only), workers
from the registry's bounded listing. Nothing here lists every item or every run.

This module must never write anything and never import starlette.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from statepact.clock import Clock
from statepact.dashboard.workers import WorkerInfo, WorkerRegistry
from statepact.models import RunStatus, RunTotals, WorkItem
from statepact.queue import BaseWorkQueue, WorkQueue
from statepact.state import BaseStateStore, StateStore

__all__ = [
    "RATE_MINUTES",
    "RUNS_PAGE",
    "QueueView",
    "Sources",
    "age_text",
    "item_fields",
    "pretty_json",
    "queue_views",
    "run_totals",
]

#: Runs shown on one page of the runs listing.
RUNS_PAGE = 50
#: The minutes the throughput and failure rate cover, one column each.
RATE_MINUTES = 5


@dataclass(frozen=True)
class Sources:
    """What the dashboard reads: the queues by name, the state store, the registry."""

    queues: Mapping[str, WorkQueue]
    state: StateStore | None
    registry: WorkerRegistry | None
    clock: Clock
    where: str = ""
    metric_tenants: tuple[str, ...] = ()

    def queue(self, name: str) -> WorkQueue:
        try:
            return self.queues[name]
        except KeyError:
            raise ValueError(f"queue: no queue named {name!r} on this dashboard") from None


@dataclass(frozen=True)
class QueueView:
    """One queue: its counts per tenant (every count ``stats()`` gives), each tenant's
    oldest wait in seconds, items finished per minute by status (oldest minute first;
    empty when the queue has no such read), and paused state."""

    name: str
    columns: tuple[str, ...]
    tenants: list[tuple[str, dict[str, int]]]
    totals: dict[str, int]
    paused: bool
    oldest: dict[str, float] = field(default_factory=dict)
    per_minute: dict[str, list[int]] = field(default_factory=dict)

    @property
    def oldest_overall(self) -> float | None:
        return max(self.oldest.values(), default=None)

    @property
    def failure_rate(self) -> float | None:
        """Dead over done plus dead in the minutes shown; ``None`` when nothing finished."""
        done = sum(self.per_minute.get("done", []))
        dead = sum(self.per_minute.get("dead", []))
        return None if done + dead == 0 else dead / (done + dead)


def age_text(seconds: float | None) -> str:
    """A wait for a person: ``-`` for none, else seconds, minutes or hours."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _counts(stats_row: Any) -> dict[str, int]:
    return {name: int(getattr(stats_row, name)) for name in type(stats_row).model_fields}


async def queue_view(name: str, queue: WorkQueue) -> QueueView:
    stats = await queue.stats()
    rows = [(tenant, _counts(counts)) for tenant, counts in sorted(stats.tenants.items())]
    columns: tuple[str, ...] = tuple(rows[0][1]) if rows else _default_columns(stats)
    totals = {column: sum(counts.get(column, 0) for _, counts in rows) for column in columns}
    paused = await queue.paused()
    oldest: dict[str, float] = {}
    per_minute: dict[str, list[int]] = {}
    if isinstance(queue, BaseWorkQueue):
        oldest = await queue.oldest_waiting()
        finished = await queue.finished_per_minute(RATE_MINUTES)
        per_minute = {status.value: counts for status, counts in finished.items()}
    return QueueView(
        name=name,
        columns=columns,
        tenants=rows,
        totals=totals,
        paused=paused,
        oldest=oldest,
        per_minute=per_minute,
    )


def _default_columns(stats: Any) -> tuple[str, ...]:
    from statepact.models import TenantQueueStats

    return tuple(TenantQueueStats.model_fields)


async def queue_views(sources: Sources) -> list[QueueView]:
    return [await queue_view(name, queue) for name, queue in sources.queues.items()]


def pretty_json(value: Any) -> str:
    """JSON for a person: indented, keys sorted, anything not JSON shown by ``str``."""
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def item_fields(item: WorkItem) -> list[tuple[str, str]]:
    """Every field of the item as (name, text), the payload as indented JSON."""
    shown: list[tuple[str, str]] = []
    for name, value in item.model_dump(mode="json").items():
        text = pretty_json(value) if isinstance(value, dict | list) else str(value)
        shown.append((name, "-" if value is None else text))
    return shown


async def run_totals(
    state: StateStore,
    tenant: str,
    *,
    now: datetime,
    window: timedelta,
    status: RunStatus | None = None,
    session_id: str | None = None,
) -> RunTotals | None:
    """The tenant's exact totals over the runs created since ``now - window``, or
    ``None`` for a store without ``run_totals`` (not one of statepact's)."""
    if not isinstance(state, BaseStateStore):
        return None
    return await state.run_totals(tenant, since=now - window, status=status, session_id=session_id)


def worker_rows(workers: Sequence[WorkerInfo], now: datetime) -> list[dict[str, Any]]:
    return [
        {
            "worker_id": w.worker_id,
            "host": w.host,
            "queues": ", ".join(w.queues),
            "concurrency": w.concurrency,
            "in_flight": w.in_flight,
            "failures": w.failures,
            "last_error": w.last_error or "-",
            "started": w.started_at.isoformat(timespec="seconds"),
            "seen_ago": f"{max(0.0, (now - w.last_seen).total_seconds()):.1f} s",
        }
        for w in workers
    ]
