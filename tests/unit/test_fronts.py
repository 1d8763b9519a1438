"""The shared fronts: validation happens before a backing is called, time comes from the clock.

A recording backing stands in for the ``_``-methods so these tests see exactly
what the front hands down (it is a stand-in for the abstract front's contract,
not for Redis or PostgreSQL, which are only ever tested for real).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from statepact._limits import PRUNE_BATCH
from statepact.clock import ManualClock, SystemClock
from statepact.errors import LeaseLostError, StatePersistenceError
from statepact.models import (
    ItemStatus,
    Lease,
    QueueStats,
    RunRecord,
    RunStatus,
    SessionRecord,
    WorkItem,
)
from statepact.queue import (
    MAX_ERROR_CHARS,
    BaseWorkQueue,
    FailOutcome,
    LapseOutcome,
    OnCancel,
    QueuePolicy,
    SleepWatch,
    WorkWatch,
    unique_slot,
)
from statepact.state import (
    BaseStateStore,
    CounterDelta,
    CounterOverflow,
    ListQuery,
    RunPrune,
    RunWrite,
    SessionWrite,
)


class RecordingStore(BaseStateStore):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[str, Any]] = []
        self.listed: list[RunRecord] = []
        self.overflow: CounterOverflow | None = None

    async def _get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        self.calls.append(("get_run", (tenant, run_id)))
        return None

    async def _put_run(self, write: RunWrite) -> RunRecord:
        self.calls.append(("put_run", write))
        return RunRecord(tenant=write.tenant, run_id=write.run_id, version=1)

    async def _patch_run(
        self, tenant: str, run_id: str, delta: CounterDelta, now: datetime
    ) -> RunRecord | CounterOverflow:
        self.calls.append(("patch_run", (tenant, run_id, delta, now)))
        return self.overflow or RunRecord(tenant=tenant, run_id=run_id, version=2)

    async def _list_runs(self, query: ListQuery) -> list[RunRecord]:
        self.calls.append(("list_runs", query))
        return self.listed[: query.limit + 1]

    async def _delete_run(self, tenant: str, run_id: str) -> bool:
        self.calls.append(("delete_run", (tenant, run_id)))
        return False

    async def _put_session(self, write: SessionWrite) -> SessionRecord:
        self.calls.append(("put_session", write))
        return SessionRecord(tenant=write.tenant, session_id=write.session_id, version=1)

    async def _get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        self.calls.append(("get_session", (tenant, session_id)))
        return None

    async def _list_sessions(self, tenant: str, limit: int, after_seq: int) -> list[SessionRecord]:
        self.calls.append(("list_sessions", (tenant, limit, after_seq)))
        return []

    async def _prune_runs(self, prune: RunPrune) -> int:
        self.calls.append(("prune_runs", prune))
        return 0

    async def _delete_session(self, tenant: str, session_id: str) -> bool:
        self.calls.append(("delete_session", (tenant, session_id)))
        return False


class RecordingQueue(BaseWorkQueue):
    """Answers every settle as if the lease held, or, with ``lost``, as if it did not."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[tuple[str, Any]] = []
        self.lost = False
        self.requeued: WorkItem | ItemStatus | None = None

    async def _enqueue(self, item: WorkItem, payload: bytes) -> WorkItem:
        self.calls.append(("enqueue", (item, payload)))
        return item

    def _watch(self, on_cancel: OnCancel | None) -> AbstractAsyncContextManager[WorkWatch]:
        return nullcontext(SleepWatch())

    async def _ack_many(self, leases: list[Lease], now: datetime) -> list[WorkItem | None]:
        self.calls.append(("ack_many", (leases, now)))
        return [None if self.lost else lease.item for lease in leases]

    async def _enqueue_many(self, batch: list[tuple[WorkItem, bytes]]) -> list[WorkItem]:
        self.calls.append(("enqueue_many", batch))
        return [item for item, _ in batch]

    async def _claim(
        self, worker_id: str, now: datetime, seconds: float, limit: int
    ) -> list[Lease]:
        self.calls.append(("claim", (worker_id, now, seconds, limit)))
        return []

    async def _heartbeat(self, lease: Lease, now: datetime, expires_at: datetime) -> Lease | None:
        self.calls.append(("heartbeat", (lease, now, expires_at)))
        return None if self.lost else lease

    async def _ack(self, lease: Lease, now: datetime) -> WorkItem | None:
        self.calls.append(("ack", (lease, now)))
        return None if self.lost else lease.item

    async def _fail(
        self, lease: Lease, now: datetime, error: str, outcome: FailOutcome
    ) -> WorkItem | None:
        self.calls.append(("fail", (lease, now, error, outcome)))
        return None if self.lost else lease.item

    async def _release(
        self, lease: Lease, now: datetime, *, available_at: datetime, count_attempt: bool
    ) -> WorkItem | None:
        self.calls.append(("release", (lease, now, available_at, count_attempt)))
        return None if self.lost else lease.item

    async def _reap(self, now: datetime, outcome: LapseOutcome) -> list[WorkItem]:
        self.calls.append(("reap", (now, outcome)))
        return []

    async def _dead_letters(self, tenant: str, limit: int) -> list[WorkItem]:
        self.calls.append(("dead_letters", (tenant, limit)))
        return []

    async def _requeue(
        self, tenant: str, item_id: str, now: datetime
    ) -> WorkItem | ItemStatus | None:
        self.calls.append(("requeue", (tenant, item_id, now)))
        return self.requeued

    async def _purge_dead(self, tenant: str) -> int:
        self.calls.append(("purge_dead", tenant))
        return 0

    async def _get_item(self, tenant: str, item_id: str) -> WorkItem | None:
        self.calls.append(("get_item", (tenant, item_id)))
        return None

    async def _stats(self) -> QueueStats:
        self.calls.append(("stats", None))
        return QueueStats(queue=self.name)

    async def _next_due(self, now: datetime) -> datetime | None:
        self.calls.append(("next_due", now))
        return None


def _lease(clock: ManualClock, attempts: int = 1, seconds: float = 30.0) -> Lease:
    item = WorkItem(
        queue="default",
        tenant="acme",
        item_id="job-1",
        attempts=attempts,
        status=ItemStatus.LEASED,
    )
    return Lease(
        item=item,
        worker_id="w1",
        token=5,
        expires_at=clock.now() + timedelta(seconds=seconds),
        lease_seconds=seconds,
    )


# -- state front -------------------------------------------------------------------


async def test_put_run_hands_down_encoded_checked_write(clock: ManualClock) -> None:
    store = RecordingStore(clock=clock)
    await store.put_run(
        RunRecord(
            tenant="acme",
            run_id="r1",
            session_id="s1",
            status="running",  # type: ignore[arg-type]
            data={"ü": (1, 2)},
            version=4,
        )
    )
    ((name, write),) = store.calls
    assert name == "put_run"
    assert write == RunWrite(
        tenant="acme",
        run_id="r1",
        session_id="s1",
        status=RunStatus.RUNNING,
        data='{"ü":[1,2]}'.encode(),
        value={"ü": [1, 2]},
        expected_version=4,
        now=clock.now(),
    )


async def test_patch_run_hands_down_nanos(clock: ManualClock) -> None:
    store = RecordingStore(clock=clock)
    await store.patch_run("acme", "r1", input_tokens=1, cost="0.5", cursor=3)
    ((_, (tenant, run_id, delta, now)),) = store.calls
    assert (tenant, run_id, now) == ("acme", "r1", clock.now())
    assert delta == CounterDelta(input_tokens=1, cost_nanos=500_000_000, cursor=3)


async def test_patch_run_words_a_counter_overflow_the_backing_reports(clock: ManualClock) -> None:
    """A backing only names the counter; the front raises the one ValueError."""
    store = RecordingStore(clock=clock)
    store.overflow = CounterOverflow("cost")
    with pytest.raises(ValueError, match=r"^cost: run 'r1' of tenant 'acme' would pass") as info:
        await store.patch_run("acme", "r1", cost=1)
    assert str(info.value).endswith("limit of 9223372036854775807 nano-units")
    store.overflow = CounterOverflow("cursor")
    with pytest.raises(ValueError, match=r"^cursor: .*limit of 9223372036854775807$"):
        await store.patch_run("acme", "r1", cursor=1)


async def test_bad_state_input_never_reaches_the_backing(clock: ManualClock) -> None:
    store = RecordingStore(clock=clock, max_value_bytes=20)
    with pytest.raises(StatePersistenceError):
        await store.put_run(RunRecord(tenant="acme", run_id="r1", data={"x": "y" * 20}))
    with pytest.raises(ValueError, match="tenant"):
        await store.get_run("", "r1")
    with pytest.raises(ValueError, match="cost"):
        await store.patch_run("acme", "r1", cost="-1")
    with pytest.raises(ValueError, match="counters start at zero"):
        await store.put_run(RunRecord(tenant="acme", run_id="r1", cursor=1))
    with pytest.raises(ValueError, match="limit"):
        await store.list_sessions("acme", limit=0)
    with pytest.raises(TypeError, match="record"):
        await store.put_session(RunRecord(tenant="acme", run_id="r1"))  # type: ignore[arg-type]
    assert store.calls == []


@pytest.mark.parametrize("after", ["-1", "1.5", "abc", "1" * 20, ""])
async def test_a_cursor_must_be_one_the_store_gave(clock: ManualClock, after: str) -> None:
    store = RecordingStore(clock=clock)
    with pytest.raises(ValueError, match="after"):
        await store.list_runs("acme", after=after)
    assert store.calls == []


async def test_list_runs_trims_the_extra_row_into_next(clock: ManualClock) -> None:
    store = RecordingStore(clock=clock)
    store.listed = [RunRecord(tenant="acme", run_id=f"r{n}", seq=n * 10) for n in range(1, 5)]
    page = await store.list_runs("acme", limit=3, after="7", status="failed")
    assert [r.run_id for r in page.items] == ["r1", "r2", "r3"]
    assert page.next == "30"
    ((_, query),) = store.calls
    assert query == ListQuery(
        tenant="acme", session_id=None, status=RunStatus.FAILED, limit=3, after_seq=7
    )
    store.listed = store.listed[:3]
    assert (await store.list_runs("acme", limit=3)).next is None


def test_store_refuses_a_non_positive_size_limit() -> None:
    with pytest.raises(ValueError, match="max_value_bytes"):
        RecordingStore(max_value_bytes=0)


def test_store_defaults_to_the_system_clock() -> None:
    assert isinstance(RecordingStore().clock, SystemClock)


# -- queue front -------------------------------------------------------------------


async def test_enqueue_hands_down_a_fresh_item(clock: ManualClock) -> None:
    queue = RecordingQueue(clock=clock, name="emails")
    await queue.enqueue(
        WorkItem(tenant="acme", item_id="j1", payload={"a": 1}, attempts=3, last_error="x"),
        delay=timedelta(seconds=5),
    )
    ((_, (item, payload)),) = queue.calls
    assert payload == b'{"a":1}'
    assert item == WorkItem(
        queue="emails",
        tenant="acme",
        item_id="j1",
        payload={"a": 1},
        priority=0,
        available_at=clock.now() + timedelta(seconds=5),
        attempts=0,
        status=ItemStatus.QUEUED,
        last_error=None,
        created_at=clock.now(),
        updated_at=clock.now(),
    )


async def test_claim_hands_down_seconds_and_limit(clock: ManualClock) -> None:
    queue = RecordingQueue(clock=clock)
    assert await queue.claim("w1", lease_for=timedelta(minutes=1)) is None
    await queue.claim_batch("w2", lease_for=2.5, limit=7)
    assert queue.calls == [
        ("claim", ("w1", clock.now(), 60.0, 1)),
        ("claim", ("w2", clock.now(), 2.5, 7)),
    ]


async def test_heartbeat_extends_by_the_lease_duration(clock: ManualClock) -> None:
    queue = RecordingQueue(clock=clock)
    lease = _lease(clock, seconds=45)
    clock.advance(10)
    await queue.heartbeat(lease)
    assert queue.calls == [("heartbeat", (lease, clock.now(), clock.now() + timedelta(seconds=45)))]


async def test_fail_asks_the_policy(clock: ManualClock) -> None:
    policy = QueuePolicy(max_attempts=3, backoff_base=10, jitter=0)
    queue = RecordingQueue(clock=clock, policy=policy)
    await queue.fail(_lease(clock, attempts=1), "boom")
    await queue.fail(_lease(clock, attempts=3), "boom")
    await queue.fail(_lease(clock, attempts=1), "poison", retryable=False)
    outcomes = [call[1][3] for call in queue.calls]
    assert outcomes == [
        FailOutcome(dead=False, available_at=clock.now() + timedelta(seconds=10)),
        FailOutcome(dead=True, available_at=clock.now()),
        FailOutcome(dead=True, available_at=clock.now()),
    ]


async def test_reap_hands_down_the_policys_decision(clock: ManualClock) -> None:
    """The backing is told from how many attempts a lapsed item is dead, and its error."""
    queue = RecordingQueue(clock=clock, policy=QueuePolicy(max_attempts=4))
    await queue.reap()
    assert queue.calls == [("reap", (clock.now(), LapseOutcome(dead_at=4, error="lease expired")))]
    assert queue.policy.after_lapse().is_dead(4) and not queue.policy.after_lapse().is_dead(3)


async def test_a_settle_the_backing_finds_stale_raises_the_one_lease_lost(
    clock: ManualClock,
) -> None:
    """Heartbeat, ack, fail and release of a lease that no longer holds its item raise
    LeaseLostError with one wording; ack_many reports it in the lease's place."""
    queue = RecordingQueue(clock=clock)
    queue.lost = True
    lease = _lease(clock)
    wording = (
        r"of item 'job-1' of tenant 'acme' in queue 'default': lease token 5 no longer "
        r"holds it; it lapsed and was moved on, or was settled already$"
    )
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "heartbeat": lambda: queue.heartbeat(lease),
        "ack": lambda: queue.ack(lease),
        "fail": lambda: queue.fail(lease, "boom"),
        "release": lambda: queue.release(lease),
    }
    for action, call in calls.items():
        with pytest.raises(LeaseLostError, match=f"^{action} {wording}") as info:
            await call()
        assert info.value.item_id == "job-1"
    (answer,) = await queue.ack_many([lease])
    assert isinstance(answer, LeaseLostError)
    assert str(answer).startswith("ack of item 'job-1'")


async def test_requeue_words_why_the_backing_refused(clock: ManualClock) -> None:
    """A backing answers the status it found (or None); the front raises the one ValueError."""
    queue = RecordingQueue(clock=clock)
    item = WorkItem(tenant="acme", item_id="j1")
    with pytest.raises(ValueError, match=r"^item_id: 'j1' .* does not exist; only a dead"):
        await queue.requeue(item)
    queue.requeued = ItemStatus.QUEUED
    with pytest.raises(
        ValueError, match=r"in queue 'default' is queued, not dead; only a dead item"
    ):
        await queue.requeue(item)
    queue.requeued = item
    assert await queue.requeue(item) == item


async def test_fail_cleans_and_bounds_the_error(clock: ManualClock) -> None:
    queue = RecordingQueue(clock=clock)
    await queue.fail(_lease(clock), "a\x00b" + "x" * (MAX_ERROR_CHARS * 2))
    error = queue.calls[0][1][2]
    assert error.startswith("ab")
    assert len(error) == MAX_ERROR_CHARS


async def test_bad_queue_input_never_reaches_the_backing(clock: ManualClock) -> None:
    queue = RecordingQueue(clock=clock, max_value_bytes=10)
    with pytest.raises(StatePersistenceError):
        await queue.enqueue(WorkItem(tenant="acme", item_id="j1", payload={"x": "y" * 10}))
    with pytest.raises(ValueError, match="priority"):
        await queue.enqueue(WorkItem(tenant="acme", item_id="j1", priority=-1001))
    with pytest.raises(TypeError, match="item"):
        await queue.requeue("j1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        await queue.dead_letters("acme", limit=0)
    with pytest.raises(TypeError, match="error"):
        await queue.fail(_lease(clock), None)  # type: ignore[arg-type]
    with pytest.raises(StatePersistenceError, match=r"items\[1\]\.payload"):
        await queue.enqueue_many(
            [
                WorkItem(tenant="acme", item_id="j0"),
                WorkItem(tenant="acme", item_id="j1", payload={"x": "y" * 10}),
            ]
        )
    with pytest.raises(ValueError, match=r"leases\[1\]"):
        await queue.ack_many([_lease(clock), _lease(clock)])
    with pytest.raises(ValueError, match=r"leases\[0\]\.token"):
        await queue.ack_many([_lease(clock).model_copy(update={"token": -1})])
    with pytest.raises(ValueError, match=r"items\[1\]\.item_id"):
        await queue.enqueue_many(
            [WorkItem(tenant="a", item_id="j"), WorkItem(tenant="a", item_id="j")]
        )
    assert queue.calls == []


def test_queue_refuses_a_bad_name_or_size_limit() -> None:
    with pytest.raises(ValueError, match="name"):
        RecordingQueue(name="")
    with pytest.raises(ValueError, match="max_value_bytes"):
        RecordingQueue(max_value_bytes=-1)
    queue = RecordingQueue()
    assert isinstance(queue.clock, SystemClock)
    assert queue.policy == QueuePolicy()
    assert queue.name == "default"


async def test_prune_runs_hands_down_the_cutoff_by_the_stores_clock(clock: ManualClock) -> None:
    """prune_runs reads the clock once: the backing gets now - older_than, the statuses as
    RunStatus members and the batch from _limits."""
    store = RecordingStore(clock=clock)
    await store.prune_runs(older_than=timedelta(hours=2), statuses=["failed"], tenant="acme")
    assert store.calls == [
        (
            "prune_runs",
            RunPrune(
                tenant="acme",
                statuses=frozenset({RunStatus.FAILED}),
                cutoff=clock.now() - timedelta(hours=2),
                batch=PRUNE_BATCH,
            ),
        )
    ]


async def test_release_hands_down_when_it_is_due_and_whether_the_attempt_counts(
    clock: ManualClock,
) -> None:
    """release computes ``available_at`` from the clock; the backing gets it and the flag."""
    queue = RecordingQueue(clock=clock)
    lease = _lease(clock)
    await queue.release(lease)
    await queue.release(lease, delay=timedelta(seconds=30), count_attempt=True)
    assert [call[1][2:] for call in queue.calls] == [
        (clock.now(), False),
        (clock.now() + timedelta(seconds=30), True),
    ]


async def test_a_policy_keeping_everything_prunes_without_a_round_trip(clock: ManualClock) -> None:
    """keep_* all None: prune answers 0 and the backing is never asked."""
    forever = QueuePolicy(keep_done=None, keep_cancelled=None, keep_dead=None)
    queue = RecordingQueue(clock=clock, policy=forever)
    assert await queue.prune() == 0
    assert await queue.prunable() == {}
    assert queue.calls == []


async def test_a_backing_without_the_lifecycle_hooks_names_itself(clock: ManualClock) -> None:
    """A backing that has not implemented cancel/pause/prune raises NotImplementedError
    naming its class and the call, after the front checked the input."""
    queue = RecordingQueue(clock=clock)
    for call, name in (
        (lambda: queue.cancel("acme", "i"), "cancel"),
        (queue.pause, "pause/resume"),
        (queue.paused, "paused"),
        (queue.prune, "prune"),
        (queue.queues, "queues"),
        (lambda: queue.dead_letters_all(limit=5), "dead_letters_all"),
    ):
        with pytest.raises(NotImplementedError, match=f"RecordingQueue does not implement {name}"):
            await call()
    with pytest.raises(ValueError, match="tenant"):
        await queue.cancel("", "i")


def test_unique_slot_is_the_key_or_the_key_and_its_period() -> None:
    """No key: None; a key: itself; a key and a period: key@floor(epoch seconds / period)."""
    now = datetime(2024, 1, 1, 10, 30, tzinfo=UTC)
    assert unique_slot(WorkItem(tenant="t", item_id="i"), now) is None
    assert unique_slot(WorkItem(tenant="t", item_id="i", unique_key="k"), now) == "k"
    hourly = WorkItem(tenant="t", item_id="i", unique_key="k", unique_for=timedelta(hours=1))
    assert unique_slot(hourly, now) == f"k@{int(now.timestamp()) // 3600}"
    assert unique_slot(hourly, now + timedelta(minutes=29, seconds=59)) == unique_slot(hourly, now)
    assert unique_slot(hourly, now + timedelta(minutes=30)) != unique_slot(hourly, now)
