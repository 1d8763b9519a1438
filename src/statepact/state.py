"""The ``StateStore`` protocol and the front every backing shares.

:class:`StateStore` is what the agent loop sees. :class:`BaseStateStore`
implements it once: it validates every argument, encodes and size-checks the
blob, reads the injected clock, and hands a backing an already-checked request
through a handful of ``_``-prefixed methods. A backing never validates, never
reads a clock and never decides anything a caller could observe differently on
another backing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol, TypeVar, runtime_checkable

from statepact._codec import (
    check_size,
    encode_json,
    plain_int,
    plain_json,
    require_count,
    require_id,
    require_limit,
    to_nanos,
)
from statepact._limits import DEFAULT_MAX_VALUE_BYTES, MAX_COUNTER, MAX_PAGE, PRUNE_BATCH
from statepact.clock import Clock, SystemClock, read_clock
from statepact.models import Page, RunRecord, RunStatus, RunTotals, SessionRecord

__all__ = [
    "TERMINAL_RUN_STATUSES",
    "BaseStateStore",
    "CounterDelta",
    "CounterOverflow",
    "ListQuery",
    "RunPrune",
    "RunWrite",
    "SessionWrite",
    "StateStore",
]

#: The statuses ``prune_runs`` deletes unless told otherwise: a run that will not move again.
TERMINAL_RUN_STATUSES: frozenset[RunStatus] = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
)


@runtime_checkable
class StateStore(Protocol):
    """Durable agent runs and sessions.

    Every call is atomic on its own. Times come from the store's injected
    clock. Errors: ``ValueError``/``TypeError`` naming the field for bad input
    (nothing is sent); ``StateConflictError`` for a stale put;
    ``RunNotFoundError`` for a patch of a missing run;
    ``StatePersistenceError`` with ``reason="too_large"`` for a blob over
    ``max_value_bytes`` (nothing is sent, not retryable) or
    ``reason="unavailable"`` when the server stayed down past the failover
    budget (retryable); ``PoolExhaustedError`` at once when no connection is free.
    """

    async def get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        """The stored run, or ``None``."""
        ...

    async def put_run(self, record: RunRecord) -> RunRecord:
        """Write ``data``, ``status`` and ``session_id`` if ``record.version`` is the stored one.

        Version 0 creates the run (counters start at zero, ``seq`` is assigned);
        otherwise the stored version must equal ``record.version``. On success the
        stored version is ``record.version + 1`` and the stored record is
        returned. On a mismatch ``StateConflictError(expected, actual)`` is
        raised and nothing is written. Counters are never overwritten.
        """
        ...

    async def patch_run(
        self,
        tenant: str,
        run_id: str,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost: Decimal | int | str = 0,
        iterations: int = 0,
        cursor: int = 0,
    ) -> RunRecord:
        """Add non-negative deltas to the counters atomically, bump the version, return the run.

        Concurrent patches all land. ``cost`` is exact to 1e-9.
        """
        ...

    async def list_runs(
        self,
        tenant: str,
        *,
        session_id: str | None = None,
        status: RunStatus | str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page[RunRecord]:
        """Runs in ``seq`` order, optionally of one session and/or one status.

        ``after`` is a previous page's ``next``. An update during paging cannot
        make a run that existed when paging began be skipped or repeated.
        """
        ...

    async def delete_run(self, tenant: str, run_id: str) -> bool:
        """Remove the run, its counters and its index entries together; ``True`` if it existed."""
        ...

    async def prune_runs(
        self,
        *,
        older_than: timedelta,
        statuses: Iterable[RunStatus | str] = TERMINAL_RUN_STATUSES,
        tenant: str | None = None,
    ) -> int:
        """Delete every run in one of ``statuses`` not written for ``older_than``; how many.

        A run goes when its ``updated_at`` is before ``now - older_than`` (the
        store's clock), each as ``delete_run`` removes one. Of one tenant, or of
        every tenant when ``tenant`` is ``None``. Done in bounded batches
        (``PRUNE_BATCH`` runs looked at per statement or script), so the server
        is never held for long; a run written while the prune runs is judged by
        its new state.
        """
        ...

    async def put_session(self, record: SessionRecord) -> SessionRecord:
        """Create (version 0) or update a session under the same version rule as runs."""
        ...

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        """The stored session, or ``None``."""
        ...

    async def list_sessions(
        self, tenant: str, *, limit: int = 50, after: str | None = None
    ) -> Page[SessionRecord]:
        """Sessions in ``seq`` order."""
        ...

    async def delete_session(self, tenant: str, session_id: str) -> bool:
        """Remove the session; ``True`` if it existed. Its runs stay (``prune_runs``)."""
        ...


@dataclass(frozen=True, slots=True)
class RunWrite:
    """A checked ``put_run``: the blob is already encoded and under the size limit.

    ``value`` is the plain tree ``data`` encodes (a fresh copy of the caller's, what a
    read would decode): the written run's ``data``, so a backing neither reads the blob
    back nor decodes it.
    """

    tenant: str
    run_id: str
    session_id: str | None
    status: RunStatus
    data: bytes
    value: dict[str, Any]
    expected_version: int
    now: datetime


@dataclass(frozen=True, slots=True)
class SessionWrite:
    tenant: str
    session_id: str
    data: bytes
    expected_version: int
    now: datetime


@dataclass(frozen=True, slots=True)
class CounterDelta:
    """Checked, non-negative increments; ``cost_nanos`` is cost in units of 1e-9."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanos: int = 0
    iterations: int = 0
    cursor: int = 0


@dataclass(frozen=True, slots=True)
class CounterOverflow:
    """A backing's answer to a patch that would take ``counter`` past ``MAX_COUNTER``
    (cost in nano-units): nothing was written, and the front raises ``ValueError``."""

    counter: str


@dataclass(frozen=True, slots=True)
class RunPrune:
    """A checked ``prune_runs``: runs of ``tenant`` (``None``: every tenant) in one of
    ``statuses`` with ``updated_at < cutoff``, looked at ``batch`` at a time."""

    tenant: str | None
    statuses: frozenset[RunStatus]
    cutoff: datetime
    batch: int


@dataclass(frozen=True, slots=True)
class ListQuery:
    tenant: str
    session_id: str | None
    status: RunStatus | None
    limit: int
    after_seq: int


def _parse_after(after: object) -> int:
    if after is None:
        return 0
    # isascii: str.isdigit() also takes "²" and "٣", which int() refuses or reads.
    if (
        not isinstance(after, str)
        or not (after.isascii() and after.isdigit())
        or len(after) > 19
        or int(after) >= 2**63
    ):
        raise ValueError(f"after: {after!r} is not a cursor returned by this store")
    return int(after)


def _require_version(version: object) -> int:
    """A record's version as a store can compare it (a model_construct record skips pydantic)."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"version: must be an int, got {type(version).__name__}")
    if not 0 <= version < 2**63:
        raise ValueError(f"version: must be between 0 and 2**63 - 1, got {version}")
    return plain_int(version)


def _require_statuses(statuses: object) -> frozenset[RunStatus]:
    if isinstance(statuses, str | bytes) or not isinstance(statuses, Iterable):
        raise TypeError(
            f"statuses: must be a collection of RunStatus, got {type(statuses).__name__}"
        )
    checked = frozenset(_require_status(status) for status in statuses)
    if not checked:
        raise ValueError("statuses: must name at least one status")
    return checked


def _require_age(older_than: object) -> timedelta:
    if not isinstance(older_than, timedelta):
        raise TypeError(f"older_than: must be a timedelta, got {type(older_than).__name__}")
    if older_than < timedelta(0):
        raise ValueError(f"older_than: must not be negative, got {older_than}")
    return older_than


def _require_status(status: object) -> RunStatus:
    if type(status) is RunStatus:
        return status  # what a validated record holds
    try:
        return RunStatus(str(status))
    except ValueError as exc:
        allowed = ", ".join(s.value for s in RunStatus)
        raise ValueError(f"status: {status!r} is not one of {allowed}") from exc


class BaseStateStore(ABC):
    """Validation, encoding and time for every ``StateStore`` backing."""

    def __init__(
        self, *, clock: Clock | None = None, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    ):
        if max_value_bytes <= 0:
            raise ValueError("max_value_bytes: must be positive")
        self._clock: Clock = clock or SystemClock()
        self._max_value_bytes = max_value_bytes

    @property
    def clock(self) -> Clock:
        return self._clock

    # -- public calls -----------------------------------------------------

    async def get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        return await self._get_run(require_id("tenant", tenant), require_id("run_id", run_id))

    async def put_run(self, record: RunRecord) -> RunRecord:
        if not isinstance(record, RunRecord):
            raise TypeError(f"record: must be a RunRecord, got {type(record).__name__}")
        tenant = require_id("tenant", record.tenant)
        run_id = require_id("run_id", record.run_id)
        session_id = (
            None if record.session_id is None else require_id("session_id", record.session_id)
        )
        if record.version == 0 and (
            record.input_tokens
            or record.output_tokens
            or record.cost
            or record.iterations
            or record.cursor
        ):
            raise ValueError(
                "input_tokens/output_tokens/cost/iterations/cursor: counters start at zero "
                "and move only through patch_run"
            )
        value, data = plain_json("data", record.data)
        check_size("data", len(data), self._max_value_bytes, where=f"run {run_id!r}")
        return await self._put_run(
            RunWrite(
                tenant=tenant,
                run_id=run_id,
                session_id=session_id,
                status=_require_status(record.status),
                data=data,
                value=value,
                expected_version=_require_version(record.version),
                now=read_clock(self._clock),
            )
        )

    async def patch_run(
        self,
        tenant: str,
        run_id: str,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost: Decimal | int | str = 0,
        iterations: int = 0,
        cursor: int = 0,
    ) -> RunRecord:
        delta = CounterDelta(
            input_tokens=require_count("input_tokens", input_tokens),
            output_tokens=require_count("output_tokens", output_tokens),
            cost_nanos=to_nanos("cost", cost),
            iterations=require_count("iterations", iterations),
            cursor=require_count("cursor", cursor),
        )
        tenant = require_id("tenant", tenant)
        run_id = require_id("run_id", run_id)
        patched = await self._patch_run(tenant, run_id, delta, read_clock(self._clock))
        if isinstance(patched, CounterOverflow):
            unit = " nano-units" if patched.counter == "cost" else ""
            raise ValueError(
                f"{patched.counter}: run {run_id!r} of tenant {tenant!r} would pass the "
                f"counter's limit of {MAX_COUNTER}{unit}"
            )
        return patched

    async def list_runs(
        self,
        tenant: str,
        *,
        session_id: str | None = None,
        status: RunStatus | str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page[RunRecord]:
        query = ListQuery(
            tenant=require_id("tenant", tenant),
            session_id=None if session_id is None else require_id("session_id", session_id),
            status=None if status is None else _require_status(status),
            limit=require_limit(limit, MAX_PAGE),
            after_seq=_parse_after(after),
        )
        items = await self._list_runs(query)
        return _page(items, query.limit)

    async def run_totals(
        self,
        tenant: str,
        *,
        since: datetime,
        session_id: str | None = None,
        status: RunStatus | str | None = None,
    ) -> RunTotals:
        """The tenant's runs created at or after ``since`` (of the session and status when
        given), counted and their counters summed, exactly: an operator's read, not part
        of the ``StateStore`` protocol. It reads the runs of the window and no other
        (PostgreSQL: one aggregate over the ``(tenant, created_at)`` index's range; Redis:
        a binary search of the creation order, then the window's runs a page at a time),
        so its cost follows how many runs were created since ``since``."""
        if not isinstance(since, datetime) or since.tzinfo is None:
            raise TypeError("since: must be a timezone-aware datetime")
        query = ListQuery(
            tenant=require_id("tenant", tenant),
            session_id=None if session_id is None else require_id("session_id", session_id),
            status=None if status is None else _require_status(status),
            limit=_TOTALS_PAGE,
            after_seq=0,
        )
        return await self._run_totals(query, since)

    async def delete_run(self, tenant: str, run_id: str) -> bool:
        return await self._delete_run(require_id("tenant", tenant), require_id("run_id", run_id))

    async def prune_runs(
        self,
        *,
        older_than: timedelta,
        statuses: Iterable[RunStatus | str] = TERMINAL_RUN_STATUSES,
        tenant: str | None = None,
    ) -> int:
        age = _require_age(older_than)
        prune = RunPrune(
            tenant=None if tenant is None else require_id("tenant", tenant),
            statuses=_require_statuses(statuses),
            cutoff=read_clock(self._clock) - age,
            batch=PRUNE_BATCH,
        )
        return await self._prune_runs(prune)

    async def put_session(self, record: SessionRecord) -> SessionRecord:
        if not isinstance(record, SessionRecord):
            raise TypeError(f"record: must be a SessionRecord, got {type(record).__name__}")
        tenant = require_id("tenant", record.tenant)
        session_id = require_id("session_id", record.session_id)
        data = encode_json("data", record.data)
        check_size("data", len(data), self._max_value_bytes, where=f"session {session_id!r}")
        return await self._put_session(
            SessionWrite(
                tenant=tenant,
                session_id=session_id,
                data=data,
                expected_version=_require_version(record.version),
                now=read_clock(self._clock),
            )
        )

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        return await self._get_session(
            require_id("tenant", tenant), require_id("session_id", session_id)
        )

    async def list_sessions(
        self, tenant: str, *, limit: int = 50, after: str | None = None
    ) -> Page[SessionRecord]:
        checked_limit = require_limit(limit, MAX_PAGE)
        items = await self._list_sessions(
            require_id("tenant", tenant), checked_limit, _parse_after(after)
        )
        return _page(items, checked_limit)

    async def delete_session(self, tenant: str, session_id: str) -> bool:
        return await self._delete_session(
            require_id("tenant", tenant), require_id("session_id", session_id)
        )

    # -- what a backing implements ---------------------------------------

    @abstractmethod
    async def _get_run(self, tenant: str, run_id: str) -> RunRecord | None: ...

    @abstractmethod
    async def _put_run(self, write: RunWrite) -> RunRecord:
        """Apply a checked put atomically or raise ``StateConflictError``."""

    @abstractmethod
    async def _patch_run(
        self, tenant: str, run_id: str, delta: CounterDelta, now: datetime
    ) -> RunRecord | CounterOverflow:
        """Apply every increment atomically, or none: ``CounterOverflow`` naming the first
        counter (in ``CounterDelta`` order) that would pass ``MAX_COUNTER``; raise
        ``RunNotFoundError`` for a missing run."""

    @abstractmethod
    async def _list_runs(self, query: ListQuery) -> list[RunRecord]:
        """Up to ``query.limit + 1`` runs with ``seq > query.after_seq`` in ``seq`` order."""

    @abstractmethod
    async def _delete_run(self, tenant: str, run_id: str) -> bool: ...

    @abstractmethod
    async def _prune_runs(self, prune: RunPrune) -> int:
        """The whole prune: batches of at most ``prune.batch`` runs looked at, until none
        is left; how many runs were deleted."""

    async def _run_totals(self, query: ListQuery, since: datetime) -> RunTotals:
        """``run_totals`` by pages of ``_list_runs`` from the first run created at or after
        ``since`` in ``seq`` order (``_first_seq_since``); a backing with an aggregate of
        its own overrides it. Only runs created at or after ``since`` are counted."""
        first = await self._first_seq_since(query.tenant, since)
        totals = _Totals()
        if first is None:
            return totals.done(query.tenant, since)
        after = first - 1
        while True:
            page = await self._list_runs(replace(query, after_seq=after))
            for run in page[: query.limit]:
                if run.created_at is not None and run.created_at >= since:
                    totals.add(run)
            if len(page) <= query.limit:
                return totals.done(query.tenant, since)
            after = page[query.limit - 1].seq or after

    async def _first_seq_since(self, tenant: str, since: datetime) -> int | None:
        """The ``seq`` of the tenant's first run (in ``seq`` order) created at or after
        ``since``, or ``None``: runs are created in ``seq`` order, so a binary search."""
        raise NotImplementedError(f"{type(self).__name__} does not implement run_totals yet")

    @abstractmethod
    async def _put_session(self, write: SessionWrite) -> SessionRecord: ...

    @abstractmethod
    async def _get_session(self, tenant: str, session_id: str) -> SessionRecord | None: ...

    @abstractmethod
    async def _list_sessions(self, tenant: str, limit: int, after_seq: int) -> list[SessionRecord]:
        """Up to ``limit + 1`` sessions with ``seq > after_seq`` in ``seq`` order."""

    @abstractmethod
    async def _delete_session(self, tenant: str, session_id: str) -> bool: ...


# run_totals reads the runs of its window this many at a time.
_TOTALS_PAGE = 1000


class _Totals:
    """``RunTotals`` summed one run at a time."""

    def __init__(self) -> None:
        self.runs = self.input_tokens = self.output_tokens = self.iterations = 0
        self.cost = Decimal(0)
        self.by_status: dict[str, int] = {}

    def add(self, run: RunRecord) -> None:
        self.runs += 1
        self.input_tokens += run.input_tokens
        self.output_tokens += run.output_tokens
        self.cost += run.cost
        self.iterations += run.iterations
        self.by_status[run.status.value] = self.by_status.get(run.status.value, 0) + 1

    def done(self, tenant: str, since: datetime) -> RunTotals:
        return RunTotals(
            tenant=tenant,
            since=since,
            runs=self.runs,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost=self.cost,
            iterations=self.iterations,
            by_status=dict(sorted(self.by_status.items())),
        )


R = TypeVar("R", RunRecord, SessionRecord)


def _page(items: list[R], limit: int) -> Page[R]:
    """Trim the one-extra row a backing fetched and turn it into the ``next`` cursor."""
    if len(items) > limit:
        shown = items[:limit]
        last = shown[-1].seq
        return Page[R](items=shown, next=str(last))
    return Page[R](items=list(items), next=None)
