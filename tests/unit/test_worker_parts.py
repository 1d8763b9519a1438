"""The worker's parts on their own, on the memory backing: the executor's outcome table, an
executor stopped before its handler began, and the completer's batches.

The worker as a whole is tested in test_worker.py and, for the ways it used to lose
track of an item, in tests/integration/test_worker_defects.py.
"""

from __future__ import annotations

import asyncio

import pytest

from statepact.models import ItemStatus, WorkItem
from statepact.storage.memory import MemoryWorkQueue
from statepact.worker import DoNotRetry, Job, Retry, Snooze, WorkerHooks
from statepact.worker._completer import Completer
from statepact.worker._executor import (
    Ack,
    Cancelled,
    Completed,
    Cut,
    Executor,
    Fail,
    Nothing,
    Release,
    decide,
)
from statepact.worker._hooks import HookSet
from statepact.worker._in_tx import TxState
from statepact.worker._runtime import Runtime, Settings
from tests.unit.test_worker import Recorder, until


class Abort(BaseException):
    pass


@pytest.mark.parametrize(
    ("raised", "cut", "lost", "outcome"),
    [
        (None, None, None, Ack()),
        (RuntimeError("x"), None, None, Fail("RuntimeError: x", retryable=True)),
        (Abort("x"), None, None, Fail("Abort: x", retryable=True)),
        (Retry(5, "later"), None, None, Fail("Retry: retry in 5 s: later", True, 5.0)),
        (DoNotRetry("never"), None, None, Fail("DoNotRetry: never", retryable=False)),
        (
            asyncio.CancelledError(),
            None,
            None,
            Fail("CancelledError: the handler was cancelled", retryable=True),
        ),
        (SystemExit(), None, None, Release(count_attempt=True)),
        (asyncio.CancelledError(), Cut.SHUTDOWN, None, Release(count_attempt=True)),
        (RuntimeError("cleanup"), Cut.SHUTDOWN, None, Release(count_attempt=True)),
        (None, Cut.SHUTDOWN, None, Release(count_attempt=True)),
        (asyncio.CancelledError(), Cut.LOST, "gone", Nothing("gone")),
        (None, None, "gone", Nothing("gone")),
        (RuntimeError("x"), Cut.SHUTDOWN, "gone", Nothing("gone")),
        (Snooze(7), None, None, Release(count_attempt=False, delay=7.0)),
        (
            asyncio.CancelledError(),
            Cut.TIMEOUT,
            None,
            Fail("TimeoutError: the handler timed out after 0 s", retryable=True),
        ),
        (asyncio.CancelledError(), Cut.CANCEL, "by an operator", Cancelled("by an operator")),
        (None, Cut.CANCEL, None, Cancelled("an operator cancelled the item")),
    ],
)
def test_decide_maps_what_the_handler_did_to_one_outcome(
    raised: BaseException | None, cut: Cut | None, lost: str | None, outcome: object
) -> None:
    assert decide(raised, cut, lost) == outcome


def runtime(queue: MemoryWorkQueue, hooks: WorkerHooks) -> Runtime:
    settings = Settings.read(
        concurrency=4,
        lease_for=30,
        heartbeat_every=None,
        poll_interval=0.01,
        reap_every=0,
        grace_period=0,
    )
    return Runtime(queue, "w", settings, queue.clock, HookSet("w", hooks))


async def test_an_executor_stopped_before_its_handler_began_releases_without_running_it() -> None:
    queue = MemoryWorkQueue()
    await queue.enqueue(WorkItem(tenant="t", item_id="x"))
    lease = await queue.claim("w", lease_for=30)
    assert lease is not None
    hooks = Recorder()
    rt = runtime(queue, hooks)
    ran: list[str] = []

    async def handler(job: Job) -> None:
        ran.append(job.item.item_id)

    executor = Executor(rt, Completer(rt), Job(lease, None, "w"), handler)
    executor.start()
    executor.abandon()  # before the executor's task took its first step
    assert rt.running == {executor}
    assert executor.task is not None
    await executor.task
    assert ran == [] and rt.running == set() and rt.newest == {}
    assert hooks.kinds("x") == ["released"]
    item = await queue.get_item("t", "x")
    assert item is not None and (item.status, item.attempts) == (ItemStatus.QUEUED, 0)


async def test_a_second_lease_of_an_item_cuts_the_first() -> None:
    """The queue leased the item again: the older executor's lease lapsed; it is cut and
    settles nothing, the newer one runs and acks."""
    queue = MemoryWorkQueue()
    await queue.enqueue(WorkItem(tenant="t", item_id="x"))
    first = await queue.claim("w", lease_for=30)
    assert first is not None
    hooks = Recorder()
    rt = runtime(queue, hooks)
    completer = Completer(rt)
    began = asyncio.Event()

    async def handler(job: Job) -> None:
        if job.lease.token == first.token:
            began.set()
            await asyncio.sleep(3600)

    older = Executor(rt, completer, Job(first, None, "w"), handler)
    older.start()
    await began.wait()
    await queue.release(first)  # as a reap would move a lapsed lease's item
    second = await queue.claim("w", lease_for=30)
    assert second is not None
    newer = Executor(rt, completer, Job(second, None, "w"), handler)
    newer.start()
    assert rt.newest[("t", "x")] is newer and len(rt.running) == 2
    await until(lambda: not rt.running)
    await completer.flush()
    assert sorted(kind for kind, _, _ in hooks.calls) == [
        "lease_lost",
        "started",
        "started",
        "succeeded",
    ]
    lost = [call for call in hooks.calls if call[0] == "lease_lost"]
    assert len(lost) == 1 and "claimed again" in lost[0][2]
    assert [lease.token for lease in hooks.leases["x"]] == [first.token, second.token]
    item = await queue.get_item("t", "x")
    assert item is not None and item.status == ItemStatus.DONE


async def test_the_completer_never_names_an_item_twice_in_one_batch() -> None:
    """Two acks of one item (a stale lease and its successor) and another item's: the first
    batch holds one of each item, the second the remaining one; the stale ack is refused,
    the other two land."""
    queue = MemoryWorkQueue()
    for item_id in ("a", "b"):
        await queue.enqueue(WorkItem(tenant="t", item_id=item_id))
    stale = await queue.claim("w", lease_for=30)
    assert stale is not None and stale.item.item_id == "a"
    await queue.release(stale)
    live, other = await queue.claim_batch("w", lease_for=30, limit=2)
    hooks = Recorder()
    rt = runtime(queue, hooks)
    completer = Completer(rt)
    batches: list[list[str]] = []
    ack_many = queue.ack_many

    async def counted(leases: list[object]) -> list[object]:
        batches.append([lease.item.item_id for lease in leases])  # type: ignore[attr-defined]
        return await ack_many(leases)  # type: ignore[arg-type]

    queue.ack_many = counted  # type: ignore[method-assign,assignment]
    for lease in (stale, live, other):
        completer.ack(Job(lease, None, "w"))
    await completer.flush()
    assert batches == [["a", "b"], ["a"]]
    assert sorted(kind for kind, _, _ in hooks.calls) == ["lease_lost", "succeeded", "succeeded"]
    for item_id in ("a", "b"):
        item = await queue.get_item("t", item_id)
        assert item is not None and item.status == ItemStatus.DONE


@pytest.mark.parametrize(
    ("raised", "tx", "outcome"),
    [
        (None, TxState.COMMITTED, Completed()),
        (ValueError("after"), TxState.COMMITTED, Completed()),
        (None, TxState.COMMITTING, Completed()),
        (ValueError("x"), TxState.COMMITTING, Fail("ValueError: x", retryable=True)),
        (
            None,
            TxState.ROLLED_BACK,
            Fail("the transaction job.complete_in joined was rolled back", retryable=True),
        ),
        (ValueError("x"), TxState.ROLLED_BACK, Fail("ValueError: x", retryable=True)),
        (
            None,
            TxState.PENDING,
            Fail(
                "the handler returned with the transaction job.complete_in joined still open; "
                "commit it before returning",
                retryable=True,
            ),
        ),
        (None, TxState.NONE, Ack()),
    ],
)
def test_decide_reads_what_the_transaction_of_complete_in_did(
    raised: BaseException | None, tx: TxState, outcome: object
) -> None:
    """A committed completion settles nothing more; a connection's commit counts once the
    handler returned; a rollback or an open transaction is a failure."""
    assert decide(raised, None, None, tx) == outcome
