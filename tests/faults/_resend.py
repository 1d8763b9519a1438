"""One fault scenario run on both servers: a commit resent after its key moved far past it.

A deposit (read the balance, write balance + 1000) is cut after the server
applied it; the proxy then refuses the failover's resends while another client,
straight to the server, commits ``OTHER_COMMITS`` increments of the same key:
more versions than a Redis backend's ``history_limit`` keeps, so the deposit's
own entry has been trimmed from the key's history when the resend arrives.
The resend must still find its first attempt: the deposit lands once (the
balance is ``1000 + OTHER_COMMITS``) and ``manager.run`` runs its body once.

Before Redis kept a per-commit outcome record, the resend looked for its
transaction id in the key's capped history only: under ``read_committed`` it
applied its stale write again (1000, the 520 increments wiped), under
``snapshot`` it got ``ConflictError`` and ``run`` ran the body a second time
(2520).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from statepact.testing.faults import FaultProxy
from statepact.tx import Transaction, TransactionManager
from tests.faults.conftest import FaultFigures

# More than the Redis backend's default history_limit (512).
OTHER_COMMITS = 520
DEPOSIT = 1000


@dataclass(frozen=True)
class ResendOutcome:
    balance: int
    body_runs: int
    seconds: float

    @property
    def expected(self) -> int:
        return DEPOSIT + OTHER_COMMITS


async def deposit_resent_after_others_committed(
    proxy: FaultProxy,
    manager: TransactionManager,
    other: TransactionManager,
    fault_figures: FaultFigures,
    *,
    backing: str,
    isolation: str,
    idempotency_key: str | None = None,
    wait_before_heal: float = 0.0,
) -> ResendOutcome:
    """Run the scenario and record its figure; ``manager`` goes through ``proxy``, ``other``
    straight to the server.

    ``wait_before_heal`` keeps the resends out that much longer after the other
    commits (to outlast an idempotency record's TTL, say).
    """
    began = time.monotonic()
    marker = f"deposit-{uuid.uuid4().hex}"
    runs = 0

    async def deposit(tx: Transaction) -> None:
        nonlocal runs
        runs += 1
        current: Any = await tx.read("accounts", "a1")
        balance = 0 if current is None else int(current["balance"])
        tx.write("accounts", "a1", {"balance": balance + DEPOSIT, "by": marker})

    async def increment(tx: Transaction) -> None:
        current: Any = await tx.read("accounts", "a1")
        tx.write("accounts", "a1", {"balance": int(current["balance"]) + 1, "by": "other"})

    # The commit carrying the marker applies, its reply is swallowed, and every new
    # connection is refused until heal(): the failover's resends wait out the others.
    armed = proxy.cut_after_reply(marker.encode(), then="refuse")
    task = asyncio.create_task(
        manager.run(deposit, isolation=isolation, idempotency_key=idempotency_key)
    )
    await armed.wait(5.0)
    assert armed.swallowed, "the server's reply to the deposit never came"
    assert not task.done(), "the deposit finished before its resend"
    for _ in range(OTHER_COMMITS):
        await other.run(increment, isolation="snapshot")
    if wait_before_heal:
        await asyncio.sleep(wait_before_heal)
    proxy.heal()
    await asyncio.wait_for(task, 30.0)
    async with other.transaction(isolation="read_committed") as check:
        final: Any = await check.read("accounts", "a1")
    outcome = ResendOutcome(int(final["balance"]), runs, time.monotonic() - began)
    fault_figures.outcome(
        f"commit resent after {OTHER_COMMITS} others ({isolation}"
        + (", idempotency key)" if idempotency_key else ")"),
        backing,
        acknowledged=outcome.expected,
        found=outcome.balance,
        seconds=outcome.seconds,
        unit="balance",
        body_runs=outcome.body_runs,
    )
    return outcome
