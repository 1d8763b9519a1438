"""The fault proxy's scenarios, written once and run on Redis and on PostgreSQL.

- An ambiguous commit: the server applied a commit and the connection was cut
  before its reply reached the client. With the failover budget at one attempt
  the caller sees the retryable error, retries with the same idempotency key,
  and gets ``replayed=True``: one version in the history. With a budget the
  backing's own resend recognises the commit by its transaction id (Redis: its
  outcome record; PostgreSQL: the commit function) and reports it once, without
  a replay, even after more versions of its key than Redis's ``history_limit``
  keeps were committed meanwhile (``tests/faults/_resend.py``).
- An ambiguous state write (``put_run``, ``patch_run``): it carries a call id,
  so the failover sends it again and the resend finds its first attempt (Redis:
  the call's replay key; PostgreSQL: its row in ``adk_run_writes``): it
  succeeds and applies once, even when the resend comes after other writes.
- A stall longer than the budget ends in ``StatePersistenceError(reason=
  "unavailable")`` / ``QueueUnavailableError`` within ``attempts x`` the
  client's timeouts ``+ budget`` plus a margin. That needs client timeouts
  (redis-py's socket timeout, asyncpg's ``timeout`` and ``command_timeout``):
  see docs/faults.md.

What differs between the backings is said once, in ``tests/faults/_proxied.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from statepact._retry import RetryPolicy
from statepact.errors import QueueUnavailableError, StatePersistenceError
from statepact.models import RunRecord, WorkItem
from statepact.tx import CommitResult
from tests.faults._proxied import RESENDING, Proxied
from tests.faults._resend import OTHER_COMMITS, deposit_resent_after_others_committed
from tests.faults.conftest import FAST_FAILOVER, FaultFigure, FaultFigures

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# The version of the first commit after the warm-up's (Proxied.manager): versions count
# every commit of the backing.
FIRST = 2


# -- ambiguous commits ----------------------------------------------------------------------


async def test_ambiguous_commit_surfaces_then_replays_once(
    proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """Cut after the server applied a commit: the caller gets the retryable error, a retry with the
    same idempotency key replays (replayed=True) and the history holds one version."""
    began = time.monotonic()
    proxy = proxied.proxy
    manager = await proxied.manager(RetryPolicy(attempts=1))
    key = f"idem-{uuid.uuid4().hex}"
    armed = proxy.cut_after_reply(key.encode())
    with pytest.raises(StatePersistenceError) as caught:
        async with manager.transaction(idempotency_key=key) as tx:
            tx.write("orders", "o1", {"state": "paid"})
    assert caught.value.reason == "unavailable"
    assert caught.value.retryable is True
    await armed.wait(1.0)
    assert armed.swallowed, "the server answered the commit"

    # What the server holds, seen through a connection the proxy never touched.
    checker = proxied.direct_manager()
    history = await checker.history("orders", "o1")
    assert [(v.version, v.value) for v in history] == [(FIRST, {"state": "paid"})]

    async with manager.transaction(idempotency_key=key) as retry:
        retry.write("orders", "o1", {"state": "paid"})
    assert retry.result.replayed is True
    assert retry.result.version == FIRST
    history = await checker.history("orders", "o1")
    assert [(v.version, v.value) for v in history] == [(FIRST, {"state": "paid"})]
    fault_figures.record(
        FaultFigure(
            scenario="ambiguous commit, caller retries same key",
            backing=proxied.name,
            faults=proxy.stats.cut,
            acknowledged=1,
            found=len(history),
            lost=1 - len(history),
            duplicates=len(history) - 1,
            ambiguous=1,
            seconds=time.monotonic() - began,
            notes={"replayed": retry.result.replayed},
        )
    )


async def test_ambiguous_commit_absorbed_by_failover_applies_once(
    proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """With a failover budget, the backing resends the cut commit itself; it recognises its own
    transaction and the caller sees one commit, once, not a replay."""
    proxy = proxied.proxy
    manager = await proxied.manager(FAST_FAILOVER)
    key = f"idem-{uuid.uuid4().hex}"
    armed = proxy.cut_after_reply(key.encode())
    async with manager.transaction(idempotency_key=key) as tx:
        tx.write("orders", "o2", {"n": 1})
    await armed.wait(1.0)
    assert proxy.stats.cut == 1
    assert tx.result == CommitResult(version=FIRST, replayed=False)
    history = await proxied.direct_manager().history("orders", "o2")
    assert [(v.version, v.value) for v in history] == [(FIRST, {"n": 1})]
    fault_figures.outcome(
        "ambiguous commit, resent by the failover",
        proxied.name,
        acknowledged=1,
        found=len(history),
        faults=proxy.stats.cut,
    )


@pytest.mark.parametrize(
    ("isolation", "idempotent"),
    [("read_committed", False), ("snapshot", False), ("snapshot", True)],
    ids=["read_committed", "snapshot", "snapshot-idempotency"],
)
async def test_commit_resent_after_others_moved_its_key_on_applies_once(
    isolation: str, idempotent: bool, proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """A commit cut after it applied, resent after another client committed more versions of
    the key than Redis's history_limit keeps (and, with an idempotency key on Redis, after its
    record expired), answers its own success: applied once, manager.run's body run once."""
    assert proxied.history_limit is None or proxied.history_limit < OTHER_COMMITS
    expire = idempotent and proxied.idempotency_expires
    manager = await proxied.manager(RESENDING, idempotency_ttl=1 if expire else None)
    outcome = await deposit_resent_after_others_committed(
        proxied.proxy,
        manager,
        proxied.direct_manager(),
        fault_figures,
        backing=proxied.name,
        isolation=isolation,
        idempotency_key=f"idem-{uuid.uuid4().hex}" if idempotent else None,
        wait_before_heal=1.5 if expire else 0.0,
    )
    assert (outcome.balance, outcome.body_runs) == (outcome.expected, 1)


# -- ambiguous state writes -------------------------------------------------------------------


async def test_ambiguous_patch_is_resent_and_applied_once(
    proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """A patch cut after it applied is sent again by the failover (it carries a call id): the
    resend finds its first attempt, the call succeeds and the patch counts once."""
    proxy = proxied.proxy
    store = proxied.state(FAST_FAILOVER)
    await proxied.warm_state(store)
    await store.put_run(RunRecord(tenant="acme", run_id="r1", data={"who": "ambiguous-patch"}))
    armed = proxy.cut_after_reply(*proxied.patch_marker)
    patched = await store.patch_run("acme", "r1", input_tokens=7)
    await armed.wait(1.0)
    assert armed.swallowed, "the server answered the patch"
    assert proxy.stats.cut == 1
    assert (patched.input_tokens, patched.version) == (7, 2)
    found = await proxied.state().get_run("acme", "r1")
    assert found is not None
    assert (found.input_tokens, found.version) == (7, 2)
    await proxied.check_write_rows("r1", 2)
    fault_figures.outcome(
        "ambiguous patch, resent by the failover",
        proxied.name,
        acknowledged=7,
        found=found.input_tokens,
        faults=proxy.stats.cut,
        unit="tokens",
    )


async def test_patch_retried_after_others_wrote_is_applied_once(
    proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """A patch cut after it applied, whose failover resend comes after five other patches of
    the same run landed, is still counted once."""
    proxy = proxied.proxy
    store = proxied.state(RESENDING)
    other = proxied.state()
    await proxied.warm_state(store)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    # Cut after the patch applied, and keep the failover's resends out until healed.
    armed = proxy.cut_after_reply(*proxied.patch_marker, then="refuse")
    patch = asyncio.create_task(store.patch_run("acme", "r1", input_tokens=7))
    await armed.wait(2.0)
    assert armed.swallowed
    for _ in range(5):
        await other.patch_run("acme", "r1", output_tokens=1)
    proxy.heal()
    patched = await asyncio.wait_for(patch, 10.0)
    # The resend answers with the run as it is now, as the first attempt's success.
    assert (patched.input_tokens, patched.output_tokens, patched.version) == (7, 5, 7)
    found = await other.get_run("acme", "r1")
    assert found is not None
    assert (found.input_tokens, found.output_tokens, found.version) == (7, 5, 7)
    fault_figures.outcome(
        "ambiguous patch resent after 5 other writes",
        proxied.name,
        acknowledged=7 + 5,
        found=found.input_tokens + found.output_tokens,
        unit="tokens",
    )


async def test_ambiguous_create_is_resent_and_reports_success(
    proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """A create (version 0) cut after it applied: the resend answers version 1, not a conflict
    with itself; resent after five patches, it answers the run as it is now."""
    proxy = proxied.proxy
    store = proxied.state(RESENDING)
    other = proxied.state()
    await proxied.warm_state(store)
    armed = proxy.cut_after_reply(b"created-by-me-1")
    created = await store.put_run(
        RunRecord(tenant="acme", run_id="r1", data={"who": "created-by-me-1"})
    )
    await armed.wait(1.0)
    assert armed.swallowed
    assert (created.version, created.data) == (1, {"who": "created-by-me-1"})

    armed = proxy.cut_after_reply(b"created-by-me-2", then="refuse")
    put = asyncio.create_task(
        store.put_run(RunRecord(tenant="acme", run_id="r2", data={"who": "created-by-me-2"}))
    )
    await armed.wait(2.0)
    assert armed.swallowed
    for _ in range(5):
        await other.patch_run("acme", "r2", iterations=1)
    proxy.heal()
    stored = await asyncio.wait_for(put, 10.0)
    assert (stored.version, stored.data, stored.iterations) == (6, {"who": "created-by-me-2"}, 5)
    await proxied.check_write_rows("r1", 1)
    await proxied.check_write_rows("r2", 6)
    fault_figures.outcome(
        "ambiguous create, resent by the failover",
        proxied.name,
        acknowledged=2,
        found=2,
        faults=proxy.stats.cut,
    )


async def test_ambiguous_update_is_resent_and_reports_the_next_version(
    proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """A put at version 3 cut after it applied: the resend answers version 4 with the data it
    wrote, not StateConflictError(expected=3, actual=4) against its own first attempt."""
    proxy = proxied.proxy
    store = proxied.state(RESENDING)
    await proxied.warm_state(store)
    run = await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    for n in range(2):
        run = await store.put_run(run.model_copy(update={"data": {"n": n}}))
    assert run.version == 3
    armed = proxy.cut_after_reply(b"updated-by-me")
    written = await store.put_run(run.model_copy(update={"data": {"who": "updated-by-me"}}))
    await armed.wait(1.0)
    assert armed.swallowed
    assert (written.version, written.data) == (4, {"who": "updated-by-me"})
    found = await proxied.state().get_run("acme", "r1")
    assert found is not None
    assert (found.version, found.data) == (4, {"who": "updated-by-me"})
    fault_figures.outcome(
        "ambiguous update, resent by the failover",
        proxied.name,
        acknowledged=1,
        found=found.version - run.version,
        faults=proxy.stats.cut,
    )


# -- stalls past the budget --------------------------------------------------------------------

E = TypeVar("E", bound=BaseException)


async def stalled(
    proxied: Proxied, call: Callable[[], Awaitable[object]], error: type[E]
) -> tuple[E, float]:
    """Stall every byte for a minute and make ``call``: the error it ends in (it must end in
    ``error``) and how long it took."""
    proxied.proxy.stall(60.0)
    began = time.monotonic()
    with pytest.raises(error) as caught:
        await call()
    elapsed = time.monotonic() - began
    proxied.proxy.heal()
    return caught.value, elapsed


async def test_stalled_state_store_gives_up_within_the_budget(
    proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """A server that stops answering ends a state call (a patch on Redis, a read on
    PostgreSQL) in StatePersistenceError("unavailable") after the client timeouts and the
    backoff budget, not later."""
    store = proxied.state(FAST_FAILOVER)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))

    async def call() -> object:
        if proxied.stall_writes:
            return await store.patch_run("acme", "r1", iterations=1)
        return await store.get_run("acme", "r1")

    error, elapsed = await stalled(proxied, call, StatePersistenceError)
    assert error.reason == "unavailable"
    assert error.retryable is True
    if proxied.errors_name_the_tenant:
        assert "tenant 'acme'" in str(error)
    bound = proxied.stall_bound(FAST_FAILOVER)
    assert proxied.timeout <= elapsed <= bound, (elapsed, bound)
    fault_figures.outcome(
        "stall past budget: state store",
        proxied.name,
        acknowledged=0,
        found=0,
        # A write that ran out of budget may have applied; a read changes nothing.
        ambiguous=int(proxied.stall_writes),
        seconds=elapsed,
        bound_s=round(bound, 2),
        **proxied.timeout_note,
    )


async def test_stalled_queue_gives_up_within_the_budget(
    proxied: Proxied, fault_figures: FaultFigures
) -> None:
    """A stalled queue server ends a claim in QueueUnavailableError (retryable) within the
    budget."""
    queue = proxied.queue(FAST_FAILOVER)
    await queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
    error, elapsed = await stalled(
        proxied, lambda: queue.claim("w1", lease_for=30), QueueUnavailableError
    )
    assert error.retryable is True
    bound = proxied.stall_bound(FAST_FAILOVER)
    assert proxied.timeout <= elapsed <= bound, (elapsed, bound)
    fault_figures.outcome(
        "stall past budget: queue claim",
        proxied.name,
        acknowledged=0,
        found=0,
        ambiguous=1,
        seconds=elapsed,
        bound_s=round(bound, 2),
    )


async def test_stalled_backend_gives_up_within_the_budget(proxied: Proxied) -> None:
    """A stalled transaction server ends a commit in StatePersistenceError("unavailable")."""
    manager = await proxied.manager(FAST_FAILOVER)

    async def commit() -> None:
        async with manager.transaction() as tx:
            tx.write("orders", "o1", {"n": 1})

    error, elapsed = await stalled(proxied, commit, StatePersistenceError)
    assert error.reason == "unavailable"
    # begin() and the commit may each wait out the budget.
    bound = 2 * proxied.stall_bound(FAST_FAILOVER)
    assert proxied.timeout <= elapsed <= bound, (elapsed, bound)


async def test_blackhole_then_heal_recovers_without_a_new_client(proxied: Proxied) -> None:
    """After a partition heals, the same store serves again: its client reconnects by itself."""
    store = proxied.state(FAST_FAILOVER)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    proxied.proxy.blackhole()
    with pytest.raises(StatePersistenceError):
        await store.get_run("acme", "r1")
    proxied.proxy.heal()
    found = await store.get_run("acme", "r1")
    assert found is not None
    assert found.version == 1
