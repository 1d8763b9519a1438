"""The numbers the pages and ``/metrics`` show, read through the public protocols only.

Every read here is bounded: queue counts come from ``WorkQueue.stats()`` (whose
cost does not grow with finished work), an item from ``get_item``, a tenant's
dead letter from ``dead_letters(limit=)``, runs from ``list_runs`` pages, workers
from the registry's bounded listing. Nothing here lists every item or every run.

This module must never write anything and never import starlette.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from statepact.clock import Clock
from statepact.dashboard.workers import WorkerInfo, WorkerRegistry
from statepact.models import RunRecord, RunStatus, WorkItem
from statepact.queue import WorkQueue
from statepact.state import StateStore

__all__ = [
    "RUNS_PAGE",
    "TOTALS_SCAN",
    "QueueView",
    "RunTotals",
    "Sources",
    "item_fields",
    "pretty_json",
    "queue_views",
    "run_totals",
]

#: Runs shown on one page of the runs listing.
RUNS_PAGE = 50
#: The most runs a tenant's totals read (pages of ``list_runs``); past it they are partial.
TOTALS_SCAN = 5000
_TOTALS_PAGE = 1000


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
    """One queue: its counts per tenant (every count ``stats()`` gives) and paused state."""

    name: str
    columns: tuple[str, ...]
    tenants: list[tuple[str, dict[str, int]]]
    totals: dict[str, int]
    paused: bool


def _counts(stats_row: Any) -> dict[str, int]:
    return {name: int(getattr(stats_row, name)) for name in type(stats_row).model_fields}


async def queue_view(name: str, queue: WorkQueue) -> QueueView:
    stats = await queue.stats()
    rows = [(tenant, _counts(counts)) for tenant, counts in sorted(stats.tenants.items())]
    columns: tuple[str, ...] = tuple(rows[0][1]) if rows else _default_columns(stats)
    totals = {column: sum(counts.get(column, 0) for _, counts in rows) for column in columns}
    paused = await queue.paused()
    return QueueView(name=name, columns=columns, tenants=rows, totals=totals, paused=paused)


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


@dataclass
class RunTotals:
    """A tenant's counters summed over the runs updated within the window."""

    runs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    iterations: int = 0
    scanned: int = 0
    complete: bool = True
    by_status: dict[str, int] = field(default_factory=dict)

    def add(self, run: RunRecord) -> None:
        self.runs += 1
        self.input_tokens += run.input_tokens
        self.output_tokens += run.output_tokens
        self.cost += run.cost
        self.iterations += run.iterations
        self.by_status[run.status.value] = self.by_status.get(run.status.value, 0) + 1


async def run_totals(
    state: StateStore,
    tenant: str,
    *,
    now: datetime,
    window: timedelta | None,
    status: RunStatus | None = None,
    session_id: str | None = None,
) -> RunTotals:
    """The tenant's totals over runs updated since ``now - window`` (all when ``None``),
    reading at most ``TOTALS_SCAN`` runs; ``complete`` says whether that was all of them."""
    totals = RunTotals()
    since = None if window is None else now - window
    after: str | None = None
    while totals.scanned < TOTALS_SCAN:
        page = await state.list_runs(
            tenant, status=status, session_id=session_id, limit=_TOTALS_PAGE, after=after
        )
        for run in page.items:
            totals.scanned += 1
            if since is None or (run.updated_at is not None and run.updated_at >= since):
                totals.add(run)
        after = page.next
        if after is None:
            return totals
    totals.complete = False
    return totals


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
