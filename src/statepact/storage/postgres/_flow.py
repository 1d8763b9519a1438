"""The claim under ``QueueLimits`` on PostgreSQL: ``claim_limited``.

Runs only when the queue's control row holds limits (the plain claims then yield
nothing), in one transaction holding the queue's flow lock (its control row, locked),
so limited claims of a queue run one at a time and see each other's leases and rate
buckets; the lock is held over three statements (lock, pick, lease) and the commit,
which does not wait for the WAL flush: that is waited for after (``flush``). The same rules
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


_Taken = tuple[dict[tuple[str, str, str], int], dict[str, dict[int, int]]]


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
    caps: str = ""
    counts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    wake: int | None = None
    #: Whether the control row holds ``spent`` and ``wake`` as they are now.
    saved: bool = False

    def leased(self, kind: str, tenant: str, key: str) -> int:
        """Leased items of a tenant (``kind`` "t"), a key ("k") or a pair ("p"), up to its
        cap, as the last pick read them (and counted on as this claim leases)."""
        return self.counts.get((kind, tenant, key), 0)

    def counted(self, picked: list[RowMapping]) -> None:
        """Take the leased counts a pick read (this transaction's own leases included)."""
        tenant = picked[0]["tenant"]
        self.counts[("t", tenant, "")] = int(picked[0]["tenant_leased"])
        for row in picked:
            key = row["limit_key"]
            if key is not None:
                self.counts[("k", "", key)] = int(row["key_leased"])
                self.counts[("p", tenant, key)] = int(row["pair_leased"])

    def rates(self, tenant: str, key: str | None) -> list[tuple[str, Rate]]:
        """The rate windows an item of ``tenant`` and ``key`` is charged to."""
        charged: list[tuple[str, Rate]] = []
        key_rate = self.limits.rate_of_key(key)
        if key_rate is not None and key is not None:
            charged.append((f"k:{key}", key_rate))
        if self.limits.tenant_rate is not None:
            charged.append((f"t:{tenant}", self.limits.tenant_rate))
        return charged

    def held(self, tenant: str, key: str | None, weight: int) -> bool:
        """Whether a cap or a rate holds the item back now (a rate's fit noted in ``wake``)."""
        if key is not None:
            cap = self.limits.key_cap(key)
            if cap is not None and self.leased("k", "", key) >= cap:
                return True
            pair = self.limits.tenant_key_cap(key)
            if pair is not None and self.leased("p", tenant, key) >= pair:
                return True
        latest = self.micros
        for name, rate in self.rates(tenant, key):
            at = admissible_at(rate, self.spent.get(name, {}), self.micros, weight)
            if at is None:
                return True  # heavier than the rate: never fits
            latest = max(latest, at)
        if latest > self.micros:
            self.wake = latest if self.wake is None else min(self.wake, latest)
            self.saved = False
            return True
        return False

    def take(self, tenant: str, key: str | None, weight: int) -> _Taken:
        """Count a leased item in the caps' counts and its weight in its rate windows; what
        they were before (``untake``)."""
        before = (dict(self.counts), {name: dict(b) for name, b in self.spent.items()})
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
        return before

    def untake(self, before: _Taken) -> None:
        """Put the counts and buckets back as ``take`` found them (its lease failed)."""
        self.counts, self.spent = before

    def save_params(self) -> dict[str, Any]:
        """``p_spent`` and ``p_wake`` as the control row stores them."""
        wake = None if self.wake is None else from_micros(self.wake)
        return {"p_spent": self.spent_json(), "p_wake": wake}

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


def caps_json(limits: QueueLimits) -> str:
    """The caps as the pick statement reads them (``_sql/queue/flow.py``)."""
    caps = {
        "per_tenant": limits.per_tenant,
        "tenant": limits.tenant_caps,
        "per_key": limits.per_key,
        "key": limits.key_caps,
        "per_tenant_key": limits.per_tenant_key,
    }
    return json.dumps(caps, separators=(",", ":"), sort_keys=True)


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
    conn: Conn,
    sql: Statements,
    params: dict[str, Any],
    now: datetime,
    limit: int,
    *,
    probe: bool = True,
) -> list[RowMapping] | None:
    """Up to ``limit`` rows leased under the queue's limits, in claim order; ``None`` when
    the queue has no limits (any more): the plain claim applies. ``probe``: first read
    the control row outside a transaction (the caller does not know the queue has
    limits; an unlimited queue then pays one read, no transaction)."""
    queue: str = params["p_queue"]
    if probe:
        first = (await conn.execute(sql.flow_state, {"p_queue": queue})).mappings().first()
        if first is None or first["limits"] is None:
            return None
    # On its own connection the claim commits without waiting for the WAL flush, so the
    # lock goes to the next claimer at once, and waits for it after (``flush``): the
    # leases are as durable as a plain claim's when returned. Inside a Core
    # transaction (the caller's when bound), its commit is left as it is.
    own = isinstance(conn, DriverStatements)
    async with _transaction(conn):
        state = {"p_queue": queue, "p_commit": "off" if own else None}
        locked = await conn.execute(sql.flow_state_locked, state)
        row = locked.mappings().first()
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
        flow = _Flow(conn, sql, queue, limits, micros, spent, caps_json(limits))
        rows = await _walk(flow, params, limit)
        if not flow.saved:
            await conn.execute(sql.flow_save, {"p_queue": queue, **flow.save_params()})
    if own and rows:
        await conn.execute(sql.flow_flush)
    return rows


async def _pick(flow: _Flow, params: dict[str, Any], tenant: str | None) -> list[RowMapping]:
    """The rotation's head tenant (``tenant`` None) or ``tenant``: its due items and counts."""
    query = {
        "p_queue": flow.queue,
        "p_now": params["p_now"],
        "p_caps": flow.caps,
        "p_lookahead": LOOKAHEAD,
    }
    if tenant is None:
        return list((await flow.conn.execute(flow.sql.flow_pick_head, query)).mappings())
    query["p_tenant"] = tenant
    return list((await flow.conn.execute(flow.sql.flow_pick_tenant, query)).mappings())


async def _walk(flow: _Flow, params: dict[str, Any], limit: int) -> list[RowMapping]:
    """Walk the rotation: a tenant served goes to the back (the rotation read again), one
    held back keeps its turn and is passed over for the rest of this call. While no
    tenant was passed, the head of the rotation is picked in the one statement; after,
    the turns ahead are read (``passed + 8``) and each fresh tenant picked by name."""
    conn, sql = flow.conn, flow.sql
    rows: list[RowMapping] = []
    passed: set[str] = set()
    while len(rows) < limit and len(passed) < MAX_PASSES:
        if not passed:
            picked = await _pick(flow, params, None)
            if not picked:
                break
            row = await _serve(flow, params, picked)
            if row is None:
                passed.add(picked[0]["tenant"])
            else:
                rows.append(row)
            continue
        # Held-back tenants keep their turns, so they lead the rotation: read past them.
        ahead = {"p_queue": flow.queue, "p_now": params["p_now"], "p_limit": len(passed) + 8}
        tenants = [r[0] for r in await conn.execute(sql.flow_turns, ahead)]
        fresh = [tenant for tenant in tenants if tenant not in passed]
        if not fresh:
            break
        for tenant in fresh:
            row = await _serve(flow, params, await _pick(flow, params, tenant))
            if row is not None:
                rows.append(row)
                break  # its turn moved to the back: read the rotation again
            passed.add(tenant)
            if len(passed) >= MAX_PASSES:
                break
    return rows


async def _serve(
    flow: _Flow, params: dict[str, Any], picked: list[RowMapping]
) -> RowMapping | None:
    """Lease the picked tenant's best due item no limit holds back, or ``None``."""
    tenant = picked[0]["tenant"]
    flow.counted(picked)
    cap = flow.limits.tenant_cap(tenant)
    if cap is not None and flow.leased("t", tenant, "") >= cap:
        return None
    for candidate in picked:
        if candidate["id"] is None:
            return None  # no due item
        key, weight = candidate["limit_key"], int(candidate["weight"])
        if flow.held(tenant, key, weight):
            continue
        # Counted before the statement that leases it also writes the buckets back
        # (only if it leases: else they are put back as they were).
        before = flow.take(tenant, key, weight)
        # The lease's ``updated_at`` is the moment its weight is counted at (see
        # claim_limited), never earlier than the last limited claim's.
        taken = {
            **params,
            "p_id": candidate["id"],
            "p_now": from_micros(flow.micros),
            **flow.save_params(),
        }
        row: RowMapping | None = (
            (await flow.conn.execute(flow.sql.flow_claim, taken)).mappings().first()
        )
        if row is None:
            flow.untake(before)
            continue  # cancelled or locked by another writer meanwhile
        flow.saved = True
        return row
    return None
