"""Model-based test of ``WorkQueue``: every backing, the memory reference and a plain model
take the same random operations and must give the same answers.

A Hypothesis ``RuleBasedStateMachine`` drives three queues in lockstep: the
backing under test, a ``MemoryWorkQueue`` (the reference) and
:class:`PlainQueueModel`, the rules of ``statepact.storage.memory.queue``'s
docstring written as linear scans over a dictionary. They share one
``ManualClock``, moved by a rule, and one ``QueuePolicy`` without jitter, so a
failure's backoff is the same everywhere. Each logical lease is held as three
leases, one per queue, and every settle presents each queue its own; stale
leases stay in the pool, so fencing is exercised all the time.

Compared after every call: the returned item(s) and leases (the token left out:
it is opaque) or the raised error's type and the fields it names. ``reap``'s
moved items are compared as a set (the protocol does not order them). Tokens
are checked per queue instead: every claim and heartbeat gives the item a token
greater than any it had.

Budget: ``MAX_EXAMPLES`` runs of up to ``STEPS`` steps per backing, no deadline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from statepact.clock import ManualClock
from statepact.errors import LeaseLostError
from statepact.models import ItemStatus, Lease, QueueStats, TenantQueueStats, WorkItem
from statepact.queue import QueuePolicy, WorkQueue
from statepact.storage.memory import MemoryWorkQueue
from tests.model._harness import (
    Backing,
    LockstepMachine,
    item_form,
    lease_form,
    machine_settings,
    run_machine,
    stats_form,
    within_budget,
)

MAX_EXAMPLES = 100
STEPS = 50
SETTINGS = machine_settings(MAX_EXAMPLES, STEPS)

POLICY = QueuePolicy(max_attempts=3, backoff_base=5, backoff_cap=20, jitter=0)
QUEUE = "default"
# "B" < "acme" < "ü" in code-point order: rotation ties are broken that way.
TENANTS = ["acme", "B", "ü"]
ITEM_IDS = ["i1", "i2", "i3", "i4"]
LEASE_EXPIRED = "lease expired"

payloads = st.dictionaries(
    st.sampled_from(["n", "ü", "task"]),
    st.one_of(
        st.integers(-5, 5),
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4),
    ),
    max_size=2,
)
delays = st.sampled_from([None, None, 0, 2.5, 10, timedelta(seconds=30)])
lease_fors = st.sampled_from([1, 10, 30.5, timedelta(seconds=20)])
lease_picks = st.integers(min_value=0, max_value=10_000)
tenants = st.sampled_from([TENANTS[0], *TENANTS])


# -- the plain model -----------------------------------------------------------------------------


@dataclass
class _Row:
    tenant: str
    item_id: str
    payload: str
    priority: int
    order: int
    available_at: datetime
    created_at: datetime
    updated_at: datetime
    attempts: int = 0
    status: ItemStatus = ItemStatus.QUEUED
    last_error: str | None = None
    token: int = 0
    expires_at: datetime | None = None


class PlainQueueModel:
    """The ``WorkQueue`` rules, scanning everything on every call."""

    def __init__(self, clock: ManualClock, policy: QueuePolicy) -> None:
        self.clock = clock
        self.policy = policy
        self.rows: dict[tuple[str, str], _Row] = {}
        self.turns: dict[str, int] = {}
        self.turn = 0
        self.token = 0
        self.order = 0

    def _item(self, row: _Row) -> WorkItem:
        return WorkItem(
            queue=QUEUE,
            tenant=row.tenant,
            item_id=row.item_id,
            payload=json.loads(row.payload),
            priority=row.priority,
            available_at=row.available_at,
            attempts=row.attempts,
            status=row.status,
            last_error=row.last_error,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def _lease(self, row: _Row, worker_id: str, seconds: float) -> Lease:
        self.token += 1
        row.token = self.token
        row.expires_at = self.clock.now() + timedelta(seconds=seconds)
        return Lease(
            item=self._item(row),
            worker_id=worker_id,
            token=row.token,
            expires_at=row.expires_at,
            lease_seconds=seconds,
        )

    def _held(self, lease: Lease) -> _Row:
        row = self.rows.get((lease.item.tenant, lease.item.item_id))
        if row is None or row.status is not ItemStatus.LEASED or row.token != lease.token:
            raise LeaseLostError("lease lost", item_id=lease.item.item_id)
        return row

    def enqueue(self, item: WorkItem, delay: float | timedelta | None) -> WorkItem:
        key = (item.tenant, item.item_id)
        if key not in self.rows:
            now = self.clock.now()
            wait = delay if isinstance(delay, timedelta) else timedelta(seconds=delay or 0)
            self.order += 1
            self.rows[key] = _Row(
                tenant=item.tenant,
                item_id=item.item_id,
                payload=json.dumps(item.payload),
                priority=item.priority,
                order=self.order,
                available_at=now + wait,
                created_at=now,
                updated_at=now,
            )
        return self._item(self.rows[key])

    def claim_batch(self, worker_id: str, seconds: float, limit: int) -> list[Lease]:
        now = self.clock.now()
        leases: list[Lease] = []
        while len(leases) < limit:
            due = [
                row
                for row in self.rows.values()
                if row.status is ItemStatus.QUEUED and row.available_at <= now
            ]
            if not due:
                break
            tenant = min({row.tenant for row in due}, key=lambda t: (self.turns.get(t, 0), t))
            row = min(
                (row for row in due if row.tenant == tenant),
                key=lambda row: (-row.priority, row.order),
            )
            self.turn += 1
            self.turns[tenant] = self.turn
            row.status = ItemStatus.LEASED
            row.attempts += 1
            row.updated_at = now
            leases.append(self._lease(row, worker_id, seconds))
        return leases

    def heartbeat(self, lease: Lease) -> Lease:
        row = self._held(lease)
        return self._lease(row, lease.worker_id, lease.lease_seconds)

    def ack(self, lease: Lease) -> WorkItem:
        row = self._held(lease)
        row.status = ItemStatus.DONE
        row.updated_at = self.clock.now()
        return self._item(row)

    def fail(self, lease: Lease, error: str, retryable: bool) -> WorkItem:
        row = self._held(lease)
        now = self.clock.now()
        row.last_error = error
        row.updated_at = now
        if not retryable or row.attempts >= self.policy.max_attempts:
            row.status = ItemStatus.DEAD
            row.available_at = now
        else:
            wait = min(self.policy.backoff_cap, self.policy.backoff_base * 2 ** (row.attempts - 1))
            row.status = ItemStatus.QUEUED
            row.available_at = now + timedelta(seconds=wait)
        return self._item(row)

    def release(self, lease: Lease) -> WorkItem:
        row = self._held(lease)
        now = self.clock.now()
        row.attempts -= 1
        row.status = ItemStatus.QUEUED
        row.available_at = now
        row.updated_at = now
        return self._item(row)

    def reap(self) -> list[WorkItem]:
        now = self.clock.now()
        moved = []
        for row in self.rows.values():
            if row.status is ItemStatus.LEASED and row.expires_at and row.expires_at <= now:
                row.last_error = LEASE_EXPIRED
                row.available_at = now
                row.updated_at = now
                dead = row.attempts >= self.policy.max_attempts
                row.status = ItemStatus.DEAD if dead else ItemStatus.QUEUED
                moved.append(self._item(row))
        return moved

    def dead_letters(self, tenant: str, limit: int) -> list[WorkItem]:
        dead = [
            row
            for row in self.rows.values()
            if row.tenant == tenant and row.status is ItemStatus.DEAD
        ]
        dead.sort(key=lambda row: (row.updated_at, row.item_id))
        return [self._item(row) for row in dead[:limit]]

    def requeue(self, tenant: str, item_id: str) -> WorkItem:
        row = self.rows.get((tenant, item_id))
        if row is None or row.status is not ItemStatus.DEAD:
            raise ValueError(f"item_id: {item_id!r} is not dead")
        now = self.clock.now()
        row.status = ItemStatus.QUEUED
        row.attempts = 0
        row.available_at = now
        row.updated_at = now
        return self._item(row)

    def get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        row = self.rows.get((tenant, item_id))
        return None if row is None else self._item(row)

    def stats(self) -> QueueStats:
        counts: dict[str, dict[ItemStatus, int]] = {}
        for row in self.rows.values():
            if row.status is not ItemStatus.DONE:
                per = counts.setdefault(row.tenant, {})
                per[row.status] = per.get(row.status, 0) + 1
        return QueueStats(
            queue=QUEUE,
            tenants={
                tenant: TenantQueueStats(
                    queued=per.get(ItemStatus.QUEUED, 0),
                    leased=per.get(ItemStatus.LEASED, 0),
                    dead=per.get(ItemStatus.DEAD, 0),
                )
                for tenant, per in sorted(counts.items())
            },
        )


# -- token bookkeeping -----------------------------------------------------------------------------


class TokenWatch:
    """Every claim and heartbeat gives the item a token greater than any it had."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.highest: dict[tuple[str, str], int] = {}

    def saw(self, lease: Lease) -> None:
        key = (lease.item.tenant, lease.item.item_id)
        top = self.highest.get(key)
        assert top is None or lease.token > top, (
            f"{self.name}: item {key} got token {lease.token}, not above its earlier {top}"
        )
        self.highest[key] = lease.token


def _sorted_items(items: list[WorkItem]) -> Any:
    return sorted((item_form(item) for item in items), key=lambda f: (f["tenant"], f["item_id"]))


# -- the machine --------------------------------------------------------------------------------


class QueueMachine(LockstepMachine):
    """Drives ``backing``, the memory reference and the plain model in lockstep."""

    def __init__(self) -> None:
        super().__init__()
        self.real: WorkQueue = self.runner.open(self.backing.work_queue(self.clock, POLICY)).value
        self.ref = MemoryWorkQueue(clock=self.clock, policy=POLICY, name=QUEUE)
        self.model = PlainQueueModel(self.clock, POLICY)
        # Every lease ever handed out, live or stale: {"real": ..., "ref": ..., "model": ...}.
        self.leases: list[dict[str, Lease]] = []
        self.tokens = {
            "real": TokenWatch(self.backing.name),
            "ref": TokenWatch("memory"),
            "model": TokenWatch("model"),
        }

    def keep(self, values: dict[str, list[Lease]]) -> None:
        """Remember new leases (one per queue per logical lease) and check their tokens."""
        for index in range(len(values["real"])):
            triple = {who: leases[index] for who, leases in values.items()}
            for who, lease in triple.items():
                self.tokens[who].saw(lease)
            self.leases.append(triple)

    def own(self, triple: dict[str, Lease], queue: Any) -> Lease:
        return triple["real"] if queue is self.real else triple["ref"]

    # -- rules ------------------------------------------------------------------------------
    # Few rules, each with an ``op`` (swarm testing switches whole rules off per run),
    # and a budget per rule and run (see ``within_budget``); ``advance`` and ``settle``
    # are unbounded.

    @initialize(
        items=st.lists(
            st.tuples(tenants, st.sampled_from(ITEM_IDS), st.sampled_from([-1, 0, 5]), delays),
            min_size=3,
            max_size=8,
        )
    )
    def fill(self, items: list[tuple[str, str, int, float | timedelta | None]]) -> None:
        """Start every run with some work queued, so that no run is only empty claims."""
        for tenant, item_id, priority, delay in items:
            self.enqueue(tenant, item_id, {"n": 1}, priority, delay)

    @rule(seconds=st.sampled_from([0.000001, 1, 5, 10, 30, 100]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @within_budget("enqueue", 10)
    @rule(
        tenant=tenants,
        item_id=st.sampled_from(ITEM_IDS),
        payload=payloads,
        priority=st.sampled_from([-1, 0, 0, 5]),
        delay=delays,
    )
    def enqueue(
        self,
        tenant: str,
        item_id: str,
        payload: dict[str, Any],
        priority: int,
        delay: float | timedelta | None,
    ) -> None:
        self.used["enqueue"] += 1
        item = WorkItem(tenant=tenant, item_id=item_id, payload=payload, priority=priority)
        self.compare(
            f"enqueue({item!r}, delay={delay!r})",
            lambda queue: queue.enqueue(item, delay=delay),
            lambda: self.model.enqueue(item, delay),
            item_form,
        )

    @within_budget("claim", 12)
    @rule(
        worker=st.sampled_from(["w1", "w2"]),
        lease_for=lease_fors,
        limit=st.sampled_from([1, 1, 2, 3]),
    )
    def claim(self, worker: str, lease_for: float | timedelta, limit: int) -> None:
        """``claim`` when ``limit`` is 1, else ``claim_batch``."""
        self.used["claim"] += 1
        seconds = (
            lease_for.total_seconds() if isinstance(lease_for, timedelta) else float(lease_for)
        )
        if limit == 1:

            def model_claim() -> Lease | None:
                leases = self.model.claim_batch(worker, seconds, 1)
                return leases[0] if leases else None

            outcome, values = self.compare(
                f"claim({worker!r}, lease_for={lease_for!r})",
                lambda queue: queue.claim(worker, lease_for=lease_for),
                model_claim,
                lease_form,
            )
            if outcome.ok and outcome.value is not None:
                self.keep({who: [lease] for who, lease in values.items()})
            return
        outcome, values = self.compare(
            f"claim_batch({worker!r}, lease_for={lease_for!r}, limit={limit})",
            lambda queue: queue.claim_batch(worker, lease_for=lease_for, limit=limit),
            lambda: self.model.claim_batch(worker, seconds, limit),
            lambda leases: [lease_form(lease) for lease in leases],
        )
        if outcome.ok:
            self.keep(values)

    @precondition(lambda self: bool(self.leases))
    @rule(
        pick=lease_picks,
        op=st.sampled_from(["heartbeat", "ack", "fail", "fail", "fail", "release"]),
        error=st.sampled_from(["boom", "ünï ✓ 'x'", "e" * 50]),
        retryable=st.booleans(),
    )
    def settle(self, pick: int, op: str, error: str, retryable: bool) -> None:
        """heartbeat, ack, fail or release with a lease handed out earlier, live or stale
        (recent ones are likelier: ``pick`` counts back from the newest)."""
        triple = self.leases[-1 - pick % len(self.leases)]
        about = f"lease of {triple['ref'].item.item_id!r}, token {triple['ref'].token}"
        if op == "heartbeat":
            outcome, values = self.compare(
                f"heartbeat({about})",
                lambda queue: queue.heartbeat(self.own(triple, queue)),
                lambda: self.model.heartbeat(triple["model"]),
                lease_form,
            )
            if outcome.ok:
                self.keep({who: [lease] for who, lease in values.items()})
        elif op == "ack":
            self.compare(
                f"ack({about})",
                lambda queue: queue.ack(self.own(triple, queue)),
                lambda: self.model.ack(triple["model"]),
                item_form,
            )
        elif op == "fail":
            self.compare(
                f"fail({about}, {error!r}, retryable={retryable})",
                lambda queue: queue.fail(self.own(triple, queue), error, retryable=retryable),
                lambda: self.model.fail(triple["model"], error, retryable),
                item_form,
            )
        else:
            self.compare(
                f"release({about})",
                lambda queue: queue.release(self.own(triple, queue)),
                lambda: self.model.release(triple["model"]),
                item_form,
            )

    @within_budget("inspect", 12)
    @rule(
        op=st.sampled_from(["reap", "reap", "dead_letters", "requeue", "get_item", "stats"]),
        tenant=tenants,
        item_id=st.sampled_from(ITEM_IDS),
        limit=st.integers(1, 5),
    )
    def inspect(self, op: str, tenant: str, item_id: str, limit: int) -> None:
        """reap, dead_letters, requeue, get_item or stats."""
        self.used["inspect"] += 1
        if op == "reap":
            self.compare("reap()", lambda queue: queue.reap(), self.model.reap, _sorted_items)
        elif op == "dead_letters":
            self.compare(
                f"dead_letters({tenant!r}, limit={limit})",
                lambda queue: queue.dead_letters(tenant, limit=limit),
                lambda: self.model.dead_letters(tenant, limit),
                lambda items: [item_form(item) for item in items],
            )
        elif op == "requeue":
            self.compare(
                f"requeue({tenant!r}, {item_id!r})",
                lambda queue: queue.requeue(WorkItem(tenant=tenant, item_id=item_id)),
                lambda: self.model.requeue(tenant, item_id),
                item_form,
            )
        elif op == "get_item":
            self.compare(
                f"get_item({tenant!r}, {item_id!r})",
                lambda queue: queue.get_item(tenant, item_id),
                lambda: self.model.get_item(tenant, item_id),
                item_form,
            )
        else:
            self.compare("stats()", lambda queue: queue.stats(), self.model.stats, stats_form)


def test_work_queue_agrees_with_memory_and_the_model(model_backing: Backing) -> None:
    """Every backing answers random WorkQueue operations as memory and the plain model do."""
    run_machine(QueueMachine, model_backing, SETTINGS)
