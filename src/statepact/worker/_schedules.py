"""Periodic jobs: :class:`Schedule`, what registration refuses, and the loop enqueueing ticks.

Every worker runs every schedule; each tick becomes the item
``schedule:<name>:<tick>``, so the queue stores one item per tick however many
workers enqueue it. After a gap only the latest tick due is enqueued. Each
schedule's tick is enqueued by a call of its own, so a schedule the queue
refuses (or whose next tick cannot be computed) never holds the others back.
Registration refuses what could never be enqueued: a name making the item id
longer than an id may be, a payload over the queue's ``max_value_bytes``, an
interval over ten years. See docs/worker.md, "Periodic jobs". This module must
never read time but through the runtime's clock and the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from statepact._codec import MAX_ID_BYTES, check_size, plain_json, require_id, require_seconds
from statepact.clock import from_micros, read_clock, to_micros
from statepact.models import WorkItem
from statepact.queue import MAX_PRIORITY
from statepact.worker._job import describe
from statepact.worker._runtime import Runtime

__all__ = ["SCHEDULED_FOR_FIELD", "Schedule", "ScheduleLoop", "Schedules", "croniter"]

logger = logging.getLogger("statepact.worker")

#: The payload field a schedule's item carries its tick in (ISO 8601, UTC).
SCHEDULED_FOR_FIELD = "scheduled_for"

# The tick with the longest text (a four-digit year, microseconds): what the size checks use.
_LONGEST_TICK = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)


def _iso(moment: datetime) -> str:
    """A tick as text for item ids: ISO 8601 in UTC with ``Z``, microseconds only if any."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def croniter() -> Any:
    """croniter's class, or an ``ImportError`` naming the extra that installs it."""
    try:
        from croniter import croniter
    except ImportError as exc:
        raise ImportError("cron schedules need croniter: pip install 'statepact[cron]'") from exc
    return croniter


def _interval_micros(seconds: float) -> int:
    return max(1, round(seconds * 1_000_000))


@dataclass(frozen=True)
class Schedule:
    """A periodic job: one item of ``task`` for ``tenant`` per tick; see :meth:`Worker.every`.

    Exactly one of ``interval`` (seconds; ticks at whole multiples of it since the
    Unix epoch) and ``cron`` (an expression, read by croniter, in UTC) is set. The
    item of the tick at ``t`` has id ``schedule:<name>:<t>`` (``t`` as
    :data:`SCHEDULED_FOR_FIELD` holds it), so every worker enqueueing the same tick
    stores one item.
    """

    name: str
    task: str
    tenant: str
    payload: Mapping[str, Any]
    interval: float | None = None
    cron: str | None = None
    catch_up: bool = True
    priority: int = 0

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before ``now``."""
        if self.interval is not None:
            step = _interval_micros(self.interval)
            micros = to_micros(now)
            return from_micros(micros - micros % step)
        assert self.cron is not None
        # croniter's get_prev is strictly before its start: start a microsecond later.
        start = now.astimezone(UTC) + timedelta(microseconds=1)
        tick: datetime = croniter()(self.cron, start).get_prev(datetime)
        return tick.astimezone(UTC)

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after ``after``."""
        if self.interval is not None:
            step = _interval_micros(self.interval)
            return from_micros((to_micros(after) // step + 1) * step)
        assert self.cron is not None
        tick: datetime = croniter()(self.cron, after.astimezone(UTC)).get_next(datetime)
        return tick.astimezone(UTC)

    def item_id(self, tick: datetime) -> str:
        return f"schedule:{self.name}:{_iso(tick)}"

    def item(self, tick: datetime, task_field: str) -> WorkItem:
        payload = {**self.payload, task_field: self.task, SCHEDULED_FOR_FIELD: _iso(tick)}
        return WorkItem(
            tenant=self.tenant, item_id=self.item_id(tick), payload=payload, priority=self.priority
        )


class Schedules:
    """A worker's schedules by name, each checked before it is registered."""

    __slots__ = ("_by_name", "_task_field")

    def __init__(self, task_field: str) -> None:
        self._task_field = task_field
        self._by_name: dict[str, Schedule] = {}

    def __bool__(self) -> bool:
        return bool(self._by_name)

    @property
    def all(self) -> tuple[Schedule, ...]:
        """The registered schedules, by name."""
        return tuple(self._by_name[name] for name in sorted(self._by_name))

    @staticmethod
    def interval(value: object) -> float:
        """An ``every()`` interval: seconds or a ``timedelta``, above 0, at most ten years (so
        every tick is a date a ``datetime`` holds)."""
        return require_seconds("interval", value)

    @staticmethod
    def cron(expression: object) -> str:
        """A cron expression croniter reads (``ImportError`` naming the extra without it)."""
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"cron: must be a non-empty cron expression, got {expression!r}")
        reader = croniter()
        try:
            reader(expression, datetime(2026, 1, 1, tzinfo=UTC)).get_next(datetime)
        except (ValueError, KeyError, TypeError) as exc:  # croniter's errors are ValueErrors
            raise ValueError(f"cron: {expression!r} is not a valid cron expression: {exc}") from exc
        return expression

    def add(
        self,
        *,
        name: str | None,
        task: str,
        tenant: str,
        payload: Mapping[str, Any] | None,
        catch_up: bool,
        priority: int,
        interval: float | None,
        cron: str | None,
        value_limit: int | None,
    ) -> Schedule:
        """Check and register one schedule (nothing is registered if a check fails).
        ``value_limit`` is the bound queue's ``max_value_bytes``, when there is one yet."""
        if not isinstance(task, str) or not task:
            raise ValueError(f"task: must be a non-empty str naming a task, got {task!r}")
        name = require_id("name", task if name is None else name)
        if ":" in name:
            raise ValueError(
                f"name: must not contain ':' (it is part of the item id), got {name!r}"
            )
        longest = len(f"schedule:{name}:{_iso(_LONGEST_TICK)}".encode())
        if longest > MAX_ID_BYTES:
            raise ValueError(
                f"name: makes each tick's item id (schedule:<name>:<tick>) up to {longest} "
                f"bytes, over the {MAX_ID_BYTES} an item id may be; use a shorter name"
            )
        if name in self._by_name:
            raise ValueError(f"name: a schedule named {name!r} is already registered")
        tenant = require_id("tenant", tenant)
        plain, _ = plain_json("payload", {} if payload is None else payload)
        for reserved in (self._task_field, SCHEDULED_FOR_FIELD):
            if reserved in plain:
                raise ValueError(
                    f"payload: must not hold {reserved!r}; the schedule sets it on each item"
                )
        if not isinstance(catch_up, bool):
            raise TypeError(f"catch_up: must be a bool, got {type(catch_up).__name__}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority: must be an int, got {type(priority).__name__}")
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise ValueError(f"priority: must be between -{MAX_PRIORITY} and {MAX_PRIORITY}")
        schedule = Schedule(
            name=name,
            task=task,
            tenant=tenant,
            payload=plain,
            interval=interval,
            cron=cron,
            catch_up=catch_up,
            priority=priority,
        )
        self._check_size(schedule, value_limit)
        self._by_name[name] = schedule
        return schedule

    def check(self, tasks: tuple[str, ...], value_limit: int | None) -> None:
        """At start: every schedule's task has a handler and its items fit the queue."""
        for schedule in self.all:
            if schedule.task not in tasks:
                raise ValueError(
                    f"schedule {schedule.name!r}: task: {schedule.task!r} has no handler on "
                    f"this worker; tasks registered: {', '.join(tasks) or 'none'}"
                )
            self._check_size(schedule, value_limit)

    def _check_size(self, schedule: Schedule, value_limit: int | None) -> None:
        """A ``too_large`` refusal, as the queue's, of items over ``value_limit`` bytes."""
        if value_limit is None:
            return
        item = schedule.item(_LONGEST_TICK, self._task_field)
        _, encoded = plain_json("payload", item.payload)
        check_size("payload", len(encoded), value_limit, where=f"schedule {schedule.name!r}")


class ScheduleLoop:
    """Enqueues each schedule's ticks as they come due on the worker's clock, until stopping."""

    __slots__ = ("_rt", "_schedules", "_task_field")

    def __init__(self, rt: Runtime, schedules: tuple[Schedule, ...], task_field: str) -> None:
        self._rt = rt
        self._schedules = list(schedules)
        self._task_field = task_field

    async def run(self) -> None:
        """After a gap (start, a stalled loop, a clock moved on) only the latest tick due is
        enqueued; the ones before it are skipped. Nothing here needs cleaning up: an enqueue
        cut short by a cancellation either landed or did not, and the next worker's enqueue
        of that tick is the same item."""
        rt = self._rt
        poll = rt.settings.poll_interval
        start = read_clock(rt.clock)
        # The last tick handled per schedule; None: the latest due is enqueued (catch_up).
        last: dict[str, datetime | None] = {}
        for schedule in list(self._schedules):
            last[schedule.name] = None
            if not schedule.catch_up:
                last[schedule.name] = self._tick(schedule, schedule.latest_tick, start)
        while not rt.stopping.is_set():
            now = read_clock(rt.clock)
            upcoming: list[datetime] = []
            for schedule in list(self._schedules):
                tick = self._tick(schedule, schedule.latest_tick, now)
                if tick is None:
                    continue
                previous = last[schedule.name]
                if previous is None or tick > previous:
                    if not await self._enqueue(schedule, tick):
                        continue  # tried again after the poll interval
                    self._log_skipped(schedule, previous, tick)
                    last[schedule.name] = previous = tick
                following = self._tick(schedule, schedule.next_tick, previous or now)
                if following is not None:
                    upcoming.append(following)
            # Re-read the clock at least every poll interval: it may be moved (a ManualClock,
            # a corrected wall clock) rather than run.
            wait = poll
            if upcoming:
                until_next = (min(upcoming) - read_clock(rt.clock)).total_seconds()
                wait = min(max(until_next, 0.0), poll)
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(rt.stopping.wait(), wait)
            else:
                await asyncio.sleep(0)

    def _tick(self, schedule: Schedule, step: Any, moment: datetime) -> datetime | None:
        """``step(moment)`` (a tick of ``schedule``); a schedule whose tick cannot be computed
        (past what a ``datetime`` holds, a cron step croniter refuses) is dropped, logged."""
        try:
            tick: datetime = step(moment)
        except Exception as exc:
            logger.error(
                "worker %s: schedule %r dropped: its tick after %s cannot be computed: %s",
                self._rt.worker_id,
                schedule.name,
                _iso(moment),
                describe(exc),
                extra=self._rt.fields(),
            )
            if schedule in self._schedules:
                self._schedules.remove(schedule)
            return None
        return tick

    async def _enqueue(self, schedule: Schedule, tick: datetime) -> bool:
        rt = self._rt
        try:
            await rt.queue.enqueue_many([schedule.item(tick, self._task_field)])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning(
                "worker %s: enqueueing scheduled items failed: schedule %r, tick %s: %s",
                rt.worker_id,
                schedule.name,
                _iso(tick),
                describe(exc),
                extra=rt.fields(),
            )
            return False
        rt.work.set()
        return True

    def _log_skipped(self, schedule: Schedule, previous: datetime | None, tick: datetime) -> None:
        if previous is not None and schedule.next_tick(previous) < tick:
            logger.info(
                "worker %s: schedule %r skipped the ticks after %s before %s (one item for the "
                "latest, none for those missed)",
                self._rt.worker_id,
                schedule.name,
                _iso(previous),
                _iso(tick),
                extra=self._rt.fields(),
            )
