"""The claim under ``QueueLimits`` on PostgreSQL: ``claim_limited``.

Runs only when the queue's control row holds limits (the plain claims then yield
nothing), in one transaction holding the queue's flow lock, so limited claims of a
queue run one at a time and see each other's leases and rate buckets. The same rules
as the memory and Redis queues (statepact._queue_limits): a tenant at its cap, or
whose first ``LOOKAHEAD`` due items a key cap, a (tenant, key) cap or a rate holds
back, keeps its turn and the walk goes on to the next tenant; at most ``MAX_PASSES``
tenants are passed over per call. Cost: docs/backings.md#flow-control.

This module must never read the server's clock nor build SQL (``_sql/queue/flow.py``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import RowMapping

from statepact._cancel import finish
from statepact._queue_limits import QueueLimits, Rate, admissible_at, bucket_of, window_start
from statepact.clock import from_micros, to_micros
from statepact.storage.postgres._direct import Statements as DriverStatements
from statepact.storage.postgres._queue_support import Conn, Statements

__all__ = ["LOOKAHEAD", "MAX_PASSES", "claim_limited"]

#: Due items of one tenant looked at per turn, and tenants passed over per call: the
#: memory and Redis queues' bounds.
LOOKAHEAD = 64
MAX_PASSES = 1000


@asynccontextmanager
async def _transaction(conn: Conn) -> AsyncIterator[None]:
    """A transaction around the limited claim on the driver's connection (autocommit
    otherwise); a Core connection or session is inside one already (the executor's, or
    the caller's when bound). The rollback survives a cancellation (``finish``)."""
    if not isinstance(conn, DriverStatements):
        yield
        return
    transaction = conn.driver.transaction()
    await transaction.start()
    try:
        yield
    except BaseException:
        await finish(transaction.rollback())
        raise
    await finish(transaction.commit())


@dataclass(slots=True)
class _Flow:
    """One limited claim's view: leased counts read once (then kept as it leases), the
    rate buckets of the control row, and the earliest time a rate-held item fits."""

    conn: Conn
    sql: Statements
    queue: str
    limits: QueueLimits
    micros: int
    spent: dict[str, dict[int, int]]
    counts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    wake: int | None = None

    async def leased(self, kind: str, tenant: str, key: str, cap: int) -> int:
        """Leased items of a tenant (``kind`` "t"), a key ("k") or a pair ("p"), up to ``cap``."""
        name = (kind, tenant, key)
        if name not in self.counts:
            statement = {
                "t": self.sql.flow_leased_tenant,
                "k": self.sql.flow_leased_key,
                "p": self.sql.flow_leased_pair,
            }[kind]
            params = {"p_queue": self.queue, "p_tenant": tenant, "p_limit_key": key, "p_cap": cap}
            self.counts[name] = int((await self.conn.execute(statement, params)).scalar_one())
        return self.counts[name]

    def rates(self, tenant: str, key: str | None) -> list[tuple[str, Rate]]:
        """The rate windows an item of ``tenant`` and ``key`` is charged to."""
        charged: list[tuple[str, Rate]] = []
        key_rate = self.limits.rate_of_key(key)
        if key_rate is not None and key is not None:
            charged.append((f"k:{key}", key_rate))
        if self.limits.tenant_rate is not None:
            charged.append((f"t:{tenant}", self.limits.tenant_rate))
        return charged

    async def held(self, tenant: str, key: str | None, weight: int) -> bool:
        """Whether a cap or a rate holds the item back now (a rate's fit noted in ``wake``)."""
        if key is not None:
            cap = self.limits.key_cap(key)
            if cap is not None and await self.leased("k", "", key, cap) >= cap:
                return True
            pair = self.limits.tenant_key_cap(key)
            if pair is not None and await self.leased("p", tenant, key, pair) >= pair:
                return True
        latest = self.micros
        for name, rate in self.rates(tenant, key):
            at = admissible_at(rate, self.spent.get(name, {}), self.micros, weight)
            if at is None:
                return True  # heavier than the rate: never fits
            latest = max(latest, at)
        if latest > self.micros:
            self.wake = latest if self.wake is None else min(self.wake, latest)
            return True
        return False

    def take(self, tenant: str, key: str | None, weight: int) -> None:
        """Count a leased item in the caps' counts and its weight in its rate windows."""
        for counted in (("t", tenant, ""), ("k", "", key or ""), ("p", tenant, key or "")):
            if counted in self.counts:
                self.counts[counted] += 1
        for name, rate in self.rates(tenant, key):
            buckets = self.spent.setdefault(name, {})
            bucket = bucket_of(rate, self.micros)
            buckets[bucket] = buckets.get(bucket, 0) + weight
            oldest = window_start(rate, self.micros)
            for old in [b for b in buckets if b < oldest]:
                del buckets[old]

    def _rate_named(self, name: str) -> Rate | None:
        kind, _, of = name.partition(":")
        return self.limits.rate_of_key(of) if kind == "k" else self.limits.tenant_rate

    def spent_json(self) -> str:
        """The buckets still inside a window, as stored: windows that passed are pruned
        here, and names the limits no longer rate are dropped."""
        live: dict[str, dict[str, int]] = {}
        for name, buckets in self.spent.items():
            rate = self._rate_named(name)
            if rate is None:
                continue
            oldest = window_start(rate, self.micros)
            kept = {str(bucket): weight for bucket, weight in buckets.items() if bucket >= oldest}
            if kept:
                live[name] = kept
        stored = {"at": self.micros, "spent": live}
        return json.dumps(stored, separators=(",", ":"), sort_keys=True)


def _spent_of(text: str | None) -> tuple[int | None, dict[str, dict[int, int]]]:
    """The stored claim time (µs) of the last limited claim and its rate buckets."""
    if not text:
        return None, {}
    loaded: dict[str, Any] = json.loads(text)
    spent = {
        name: {int(bucket): int(weight) for bucket, weight in buckets.items()}
        for name, buckets in loaded["spent"].items()
    }
    return int(loaded["at"]), spent


async def claim_limited(
    conn: Conn, sql: Statements, params: dict[str, Any], now: datetime, limit: int
) -> list[RowMapping] | None:
    """Up to ``limit`` rows leased under the queue's limits, in claim order; ``None`` when
    the queue has no limits (any more): the plain claim applies."""
    queue: str = params["p_queue"]
    # Asked after every empty plain claim: one probe of the control row, no transaction,
    # while the queue has no limits.
    first = (await conn.execute(sql.flow_state, {"p_queue": queue})).mappings().first()
    if first is None or first["limits"] is None:
        return None
    async with _transaction(conn):
        await conn.execute(sql.flow_lock, {"p_queue": queue})
        row = (await conn.execute(sql.flow_state, {"p_queue": queue})).mappings().first()
        limits = QueueLimits.from_json(None if row is None else row["limits"])
        if row is None or limits.empty:
            return None
        if row["paused"]:
            return []
        last, spent = _spent_of(row["rate_spent"])
        # Claims are counted in the order they take the lock, which may differ from the
        # order of their clock readings (one read its clock, then waited): a claim never
        # counts at a time before the last one's, or it would miss that one's bucket;
        # its leases are stamped (``updated_at``) with the time counted.
        micros = to_micros(now) if last is None else max(to_micros(now), last)
        flow = _Flow(conn, sql, queue, limits, micros, spent)
        rows = await _walk(flow, params, limit)
        save = {
            "p_queue": queue,
            "p_spent": flow.spent_json(),
            "p_wake": None if flow.wake is None else from_micros(flow.wake),
        }
        await conn.execute(sql.flow_save, save)
        return rows


async def _walk(flow: _Flow, params: dict[str, Any], limit: int) -> list[RowMapping]:
    """Walk the rotation: a tenant served goes to the back (the rotation read again), one
    held back keeps its turn and is passed over for the rest of this call."""
    conn, sql = flow.conn, flow.sql
    rows: list[RowMapping] = []
    passed: set[str] = set()
    while len(rows) < limit and len(passed) < MAX_PASSES:
        # Held-back tenants keep their turns, so they lead the rotation: read past them.
        ahead = {"p_queue": flow.queue, "p_now": params["p_now"], "p_limit": len(passed) + 8}
        tenants = [r[0] for r in await conn.execute(sql.flow_turns, ahead)]
        fresh = [tenant for tenant in tenants if tenant not in passed]
        if not fresh:
            break
        for tenant in fresh:
            row = await _serve(flow, params, tenant)
            if row is not None:
                rows.append(row)
                break  # its turn moved to the back: read the rotation again
            passed.add(tenant)
            if len(passed) >= MAX_PASSES:
                break
    return rows


async def _serve(flow: _Flow, params: dict[str, Any], tenant: str) -> RowMapping | None:
    """Lease the tenant's best due item no limit holds back, or ``None``."""
    conn, sql, limits = flow.conn, flow.sql, flow.limits
    cap = limits.tenant_cap(tenant)
    if cap is not None and await flow.leased("t", tenant, "", cap) >= cap:
        return None
    query = {"p_queue": flow.queue, "p_tenant": tenant, "p_now": params["p_now"]}
    found = await conn.execute(sql.flow_candidates, {**query, "p_limit": LOOKAHEAD})
    for candidate in list(found.mappings()):
        key, weight = candidate["limit_key"], int(candidate["weight"])
        if await flow.held(tenant, key, weight):
            continue
        # The lease's ``updated_at`` is the moment its weight is counted at (see
        # claim_limited), never earlier than the last limited claim's.
        taken = {**params, "p_id": candidate["id"], "p_now": from_micros(flow.micros)}
        row: RowMapping | None = (await conn.execute(sql.flow_claim, taken)).mappings().first()
        if row is None:
            continue  # cancelled or locked by another writer meanwhile
        flow.take(tenant, key, weight)
        return row
    return None
