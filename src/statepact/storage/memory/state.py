"""``MemoryStateStore``: the reference ``StateStore``, held in this process.

It implements the ``_``-methods of :class:`~statepact.state.BaseStateStore`,
which has validated, encoded and size-checked everything and read the clock.
The rules it pins for every backing: docs/backings.md#memory.

It must never await inside a read-modify-write (each call is one step of the
event loop), and is not safe across OS threads or processes.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self, TypeVar

from statepact._codec import decode_json, nanos_to_decimal
from statepact._limits import MAX_COUNTER
from statepact.clock import Clock
from statepact.errors import RunNotFoundError, StateConflictError
from statepact.models import RunRecord, RunStatus, SessionRecord
from statepact.settings import MemoryStoreSettings
from statepact.state import (
    BaseStateStore,
    CounterDelta,
    CounterOverflow,
    ListQuery,
    RunPrune,
    RunWrite,
    SessionWrite,
)

__all__ = ["MemoryStateStore"]

K = TypeVar("K")


@dataclass(slots=True)
class _Run:
    session_id: str | None
    status: RunStatus
    data: bytes
    version: int
    created_at: datetime
    updated_at: datetime
    seq: int
    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanos: int = 0
    iterations: int = 0
    cursor: int = 0


@dataclass(slots=True)
class _Session:
    data: bytes
    version: int
    created_at: datetime
    updated_at: datetime
    seq: int


class _SeqIndex:
    """Ids ordered by ``seq``: paging is a bisect, not a scan from the start."""

    __slots__ = ("_ids", "_seqs")

    def __init__(self) -> None:
        self._seqs: list[int] = []
        self._ids: dict[int, str] = {}

    def add(self, seq: int, record_id: str) -> None:
        insort(self._seqs, seq)
        self._ids[seq] = record_id

    def remove(self, seq: int) -> None:
        position = bisect_right(self._seqs, seq) - 1
        if position >= 0 and self._seqs[position] == seq:
            del self._seqs[position]
            del self._ids[seq]

    def after(self, seq: int) -> Iterator[str]:
        for position in range(bisect_right(self._seqs, seq), len(self._seqs)):
            yield self._ids[self._seqs[position]]

    def __len__(self) -> int:
        return len(self._seqs)


class MemoryStateStore(BaseStateStore):
    """Runs and sessions in dictionaries, with ``seq``-ordered indexes per tenant,
    per ``(tenant, session_id)`` and per ``(tenant, status)``."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        settings: MemoryStoreSettings | None = None,
        max_value_bytes: int | None = None,
    ) -> None:
        """``max_value_bytes``, when given, wins over ``settings.max_value_bytes``."""
        settings = settings or MemoryStoreSettings()
        super().__init__(
            clock=clock,
            max_value_bytes=(
                settings.max_value_bytes if max_value_bytes is None else max_value_bytes
            ),
        )
        self._seq = 0
        self._runs: dict[tuple[str, str], _Run] = {}
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._by_tenant: dict[str, _SeqIndex] = {}
        self._by_session: dict[tuple[str, str], _SeqIndex] = {}
        self._by_status: dict[tuple[str, RunStatus], _SeqIndex] = {}
        self._sessions_by_tenant: dict[str, _SeqIndex] = {}

    @classmethod
    async def open(
        cls, *, clock: Clock | None = None, settings: MemoryStoreSettings | None = None
    ) -> Self:
        """A store built as the constructor builds it (no server to check)."""
        return cls(clock=clock, settings=settings)

    def __repr__(self) -> str:
        return f"MemoryStateStore(runs={len(self._runs)}, sessions={len(self._sessions)})"

    # -- runs ---------------------------------------------------------------

    async def _get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        row = self._runs.get((tenant, run_id))
        return None if row is None else _run_record(tenant, run_id, row)

    async def _put_run(self, write: RunWrite) -> RunRecord:
        key = (write.tenant, write.run_id)
        row = self._runs.get(key)
        _refuse_stale("run", write.tenant, write.run_id, write.expected_version, row)
        if row is None:
            row = _Run(
                session_id=write.session_id,
                status=write.status,
                data=write.data,
                version=1,
                created_at=write.now,
                updated_at=write.now,
                seq=self._next_seq(),
            )
            self._runs[key] = row
            self._by_tenant.setdefault(write.tenant, _SeqIndex()).add(row.seq, write.run_id)
            self._index_run(write.tenant, write.run_id, row)
        else:
            if row.session_id != write.session_id or row.status != write.status:
                self._unindex_run(write.tenant, row)
                row.session_id = write.session_id
                row.status = write.status
                self._index_run(write.tenant, write.run_id, row)
            row.data = write.data
            row.version += 1
            row.updated_at = write.now
        return _run_record(write.tenant, write.run_id, row, write.value)

    async def _patch_run(
        self, tenant: str, run_id: str, delta: CounterDelta, now: datetime
    ) -> RunRecord | CounterOverflow:
        row = self._runs.get((tenant, run_id))
        if row is None:
            raise RunNotFoundError(tenant=tenant, run_id=run_id)
        # Check every counter before touching any, so a refused patch writes nothing.
        sums = {
            "input_tokens": row.input_tokens + delta.input_tokens,
            "output_tokens": row.output_tokens + delta.output_tokens,
            "cost": row.cost_nanos + delta.cost_nanos,
            "iterations": row.iterations + delta.iterations,
            "cursor": row.cursor + delta.cursor,
        }
        for field, total in sums.items():
            if total > MAX_COUNTER:
                return CounterOverflow(field)
        row.input_tokens = sums["input_tokens"]
        row.output_tokens = sums["output_tokens"]
        row.cost_nanos = sums["cost"]
        row.iterations = sums["iterations"]
        row.cursor = sums["cursor"]
        row.version += 1
        row.updated_at = now
        return _run_record(tenant, run_id, row)

    async def _list_runs(self, query: ListQuery) -> list[RunRecord]:
        tenant = query.tenant
        if query.session_id is not None:
            index = self._by_session.get((tenant, query.session_id))
        elif query.status is not None:
            index = self._by_status.get((tenant, query.status))
        else:
            index = self._by_tenant.get(tenant)
        if index is None:
            return []
        found: list[RunRecord] = []
        for run_id in index.after(query.after_seq):
            row = self._runs[(tenant, run_id)]
            if query.status is not None and row.status != query.status:
                continue
            found.append(_run_record(tenant, run_id, row))
            if len(found) > query.limit:
                break
        return found

    async def _first_seq_since(self, tenant: str, since: datetime) -> int | None:
        # Memory is the reference, not a server: one pass over the runs is its cost.
        return min(
            (
                row.seq
                for (owner, _), row in self._runs.items()
                if owner == tenant and row.created_at >= since
            ),
            default=None,
        )

    async def _delete_run(self, tenant: str, run_id: str) -> bool:
        return self._remove_run(tenant, run_id)

    def _remove_run(self, tenant: str, run_id: str) -> bool:
        row = self._runs.pop((tenant, run_id), None)
        if row is None:
            return False
        self._unindex_run(tenant, row)
        tenant_index = self._by_tenant[tenant]
        tenant_index.remove(row.seq)
        if not tenant_index:
            del self._by_tenant[tenant]
        return True

    async def _prune_runs(self, prune: RunPrune) -> int:
        # One step of the event loop, like every call here: the batch size matters
        # only on a server.
        tenants = list(self._by_tenant) if prune.tenant is None else [prune.tenant]
        doomed = [
            (tenant, run_id)
            for tenant in tenants
            if tenant in self._by_tenant
            for run_id in self._by_tenant[tenant].after(0)
            if self._runs[(tenant, run_id)].status in prune.statuses
            and self._runs[(tenant, run_id)].updated_at < prune.cutoff
        ]
        for tenant, run_id in doomed:
            self._remove_run(tenant, run_id)
        return len(doomed)

    # -- sessions -----------------------------------------------------------

    async def _put_session(self, write: SessionWrite) -> SessionRecord:
        key = (write.tenant, write.session_id)
        row = self._sessions.get(key)
        _refuse_stale("session", write.tenant, write.session_id, write.expected_version, row)
        if row is None:
            row = _Session(
                data=write.data,
                version=1,
                created_at=write.now,
                updated_at=write.now,
                seq=self._next_seq(),
            )
            self._sessions[key] = row
            self._sessions_by_tenant.setdefault(write.tenant, _SeqIndex()).add(
                row.seq, write.session_id
            )
        else:
            row.data = write.data
            row.version += 1
            row.updated_at = write.now
        return _session_record(write.tenant, write.session_id, row)

    async def _get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        row = self._sessions.get((tenant, session_id))
        return None if row is None else _session_record(tenant, session_id, row)

    async def _list_sessions(self, tenant: str, limit: int, after_seq: int) -> list[SessionRecord]:
        index = self._sessions_by_tenant.get(tenant)
        if index is None:
            return []
        found: list[SessionRecord] = []
        for session_id in index.after(after_seq):
            found.append(_session_record(tenant, session_id, self._sessions[(tenant, session_id)]))
            if len(found) > limit:
                break
        return found

    async def _delete_session(self, tenant: str, session_id: str) -> bool:
        row = self._sessions.pop((tenant, session_id), None)
        if row is None:
            return False
        _drop(self._sessions_by_tenant, tenant, row.seq)
        return True

    # -- helpers ------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _index_run(self, tenant: str, run_id: str, row: _Run) -> None:
        """Add the run to its session and status indexes (the tenant index is set at creation)."""
        if row.session_id is not None:
            self._by_session.setdefault((tenant, row.session_id), _SeqIndex()).add(row.seq, run_id)
        self._by_status.setdefault((tenant, row.status), _SeqIndex()).add(row.seq, run_id)

    def _unindex_run(self, tenant: str, row: _Run) -> None:
        """Remove the run from its session and status indexes (the tenant index stays)."""
        if row.session_id is not None:
            _drop(self._by_session, (tenant, row.session_id), row.seq)
        _drop(self._by_status, (tenant, row.status), row.seq)


def _refuse_stale(
    kind: str, tenant: str, record_id: str, expected: int, row: _Run | _Session | None
) -> None:
    """A put holds the version it read: anything but the stored one (0: none stored) is a
    conflict. A stored record has version >= 1, so this also refuses creating one that
    exists."""
    stored = 0 if row is None else row.version
    if expected != stored:
        raise StateConflictError(
            tenant=tenant, record_id=record_id, expected=expected, actual=stored, kind=kind
        )


def _drop(indexes: dict[K, _SeqIndex], key: K, seq: int) -> None:
    index = indexes.get(key)
    if index is not None:
        index.remove(seq)
        if not index:
            del indexes[key]


def _run_record(tenant: str, run_id: str, row: _Run, data: Any = None) -> RunRecord:
    """The record of ``row``; ``data`` is its blob decoded, when the caller has it."""
    return RunRecord(
        tenant=tenant,
        run_id=run_id,
        session_id=row.session_id,
        status=row.status,
        data=decode_json(row.data) if data is None else data,
        version=row.version,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        cost=nanos_to_decimal(row.cost_nanos),
        iterations=row.iterations,
        cursor=row.cursor,
        created_at=row.created_at,
        updated_at=row.updated_at,
        seq=row.seq,
    )


def _session_record(tenant: str, session_id: str, row: _Session) -> SessionRecord:
    return SessionRecord(
        tenant=tenant,
        session_id=session_id,
        data=decode_json(row.data),
        version=row.version,
        created_at=row.created_at,
        updated_at=row.updated_at,
        seq=row.seq,
    )
