"""``statepact demo``: a small multi-tenant agent fleet that shows what the library does.

The story, told as it happens and summed up at the end: runs and their counters
(tokens, cost, iterations), claims served fairly across tenants with unequal
backlogs, a worker that crashes mid-lease and whose run is reaped and finished
by another, a poison item dead-lettered after its retries, two agents
conflicting on one key (``TransactionManager.run`` retries the loser), and a
transaction replayed by its idempotency key. Time is a ``ManualClock`` moved by
the fleet's rounds, so leases lapse and backoffs pass in milliseconds.

By default everything runs on the memory backing, with no server. ``--redis``
or ``--postgres`` runs the same story on a server (state, queue and
transactions all there), under a namespace unique to the run, which is removed
afterwards; given both, the story runs on Redis and then on PostgreSQL.

It must never print a DSN in clear (``redact_dsn``), never leave data behind on
a server, and never import redis or SQLAlchemy unless a server was asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, TextIO

from statepact._codec import decimal_context
from statepact.cli._common import (
    Backings,
    CommandError,
    add_debug_argument,
    add_server_arguments,
    open_backings,
    option_url,
    run_command,
)
from statepact.clock import Clock, ManualClock
from statepact.errors import (
    IdempotencyConflictError,
    StateConflictError,
)
from statepact.models import ItemStatus, Lease, RunRecord, RunStatus, WorkItem
from statepact.queue import QueuePolicy
from statepact.settings import redact_dsn
from statepact.tx import Transaction

__all__ = [
    "DemoReport",
    "add_arguments",
    "command",
    "run_demo",
]

DESCRIPTION = """\
Run a small multi-tenant agent fleet and narrate what statepact does: runs and
their counters, fair claims across tenants, a crashed worker's lease reaped and
finished by another, a poison item dead-lettered, two agents conflicting on one
key, and a transaction replayed by its idempotency key. Runs on the in-process
memory backing unless --redis or --postgres is given; given both, it tells the
story on Redis, then on PostgreSQL, each with its own summary. On a server it
uses a namespace (Redis) or schema (PostgreSQL) of its own and removes it
afterwards. Time is simulated, so it takes a few seconds.
"""

# -- the story ----------------------------------------------------------------------

TENANTS: tuple[tuple[str, int], ...] = (("acme", 14), ("globex", 8), ("initech", 5))
WORKERS: tuple[str, ...] = ("w1", "w2", "w3", "w4")
POISON = ("globex", "run-poison")
ROUND_SECONDS = 10.0
LEASE_SECONDS = 25.0
MAX_ROUNDS = 60
DEMO_POLICY = QueuePolicy(max_attempts=3, backoff_base=5.0, backoff_cap=20.0, jitter=0.0)
# Prices per token, exact: cost is a Decimal on every backing.
PRICE_IN = Decimal("0.000003")
PRICE_OUT = Decimal("0.000015")


@dataclass
class DemoReport:
    """What happened, for the closing summary and for tests."""

    backing: str
    claims: list[tuple[str, str, str]] = field(default_factory=list)  # worker, tenant, run
    fair_window: list[str] = field(default_factory=list)
    backlog: dict[str, int] = field(default_factory=dict)
    crashed: tuple[str, str, str] | None = None  # worker, tenant, run
    reaped_at: str | None = None  # simulated time the reaper moved the crashed run
    finished_by: str | None = None
    resumed_from: int | None = None
    dead: list[WorkItem] = field(default_factory=list)
    poison_errors: list[str] = field(default_factory=list)
    conflict_attempts: dict[str, int] = field(default_factory=dict)
    conflict_value: dict[str, Any] = field(default_factory=dict)
    stale_put: StateConflictError | None = None
    replay: tuple[int, int, bool] | None = None  # first version, replay version, replayed
    replay_conflict: str | None = None
    runs: list[RunRecord] = field(default_factory=list)
    rounds: int = 0


class _Narrator:
    def __init__(self, out: TextIO, clock: Clock) -> None:
        self.out = out
        self.clock = clock
        self.start = clock.now()

    def elapsed(self, moment: datetime | None = None) -> str:
        seconds = ((moment or self.clock.now()) - self.start).total_seconds()
        return f"t+{seconds:.0f}s"

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():>6}] {text}", file=self.out, flush=True)

    def heading(self, text: str) -> None:
        print(f"\n== {text}", file=self.out, flush=True)


def _draw(seed: int, *parts: object) -> random.Random:
    """A generator for one decision, so ``--seed`` repeats the numbers whatever order the
    workers happen to run in on a server."""
    return random.Random(":".join([str(seed), *map(str, parts)]))


class _Fleet:
    """Workers claiming, running and settling items in rounds of ``ROUND_SECONDS``."""

    def __init__(self, b: Backings, clock: ManualClock, seed: int, out: TextIO) -> None:
        self.b = b
        self.clock = clock
        self.seed = seed
        self.say = _Narrator(out, clock)
        self.report = DemoReport(backing=b.kind)
        self.steps: dict[tuple[str, str], int] = {}
        self.crash_pending = True

    async def seed_work(self) -> None:
        self.say.heading(f"a fleet of {len(WORKERS)} workers on {self.b.where}")
        for tenant, count in TENANTS:
            for n in range(1, count + 1):
                await self._create(tenant, f"run-{n:02d}", poison=False)
            self.report.backlog[tenant] = count
        await self._create(*POISON, poison=True)
        self.report.backlog[POISON[0]] += 1
        backlog = ", ".join(f"{t} {n}" for t, n in self.report.backlog.items())
        self.say.say(
            f"queued {sum(self.report.backlog.values())} runs (backlog: {backlog}); "
            f"one of globex's is poison"
        )

    async def _create(self, tenant: str, run_id: str, *, poison: bool) -> None:
        self.steps[(tenant, run_id)] = _draw(self.seed, tenant, run_id).randint(2, 4)
        await self.b.state.put_run(
            RunRecord(
                tenant=tenant,
                run_id=run_id,
                session_id=f"{tenant}-session",
                data={"task": f"task {run_id} of {tenant}"},
            )
        )
        await self.b.queue.enqueue(
            WorkItem(
                tenant=tenant,
                item_id=run_id,
                payload={"run_id": run_id, "poison": poison},
                # The poison item goes first within its tenant, so its retries show early.
                priority=1 if poison else 0,
            )
        )

    async def run_rounds(self) -> None:
        workers = list(WORKERS)
        for number in range(1, MAX_ROUNDS + 1):
            self.report.rounds = number
            if number > 1:
                self.clock.advance(ROUND_SECONDS)
            for item in await self.b.queue.reap():
                self.say.say(
                    f"reaper: {item.tenant}/{item.item_id}'s lease expired; back to "
                    f"{item.status.value} (attempt {item.attempts} used)"
                )
                if self.report.crashed and (item.tenant, item.item_id) == self.report.crashed[1:]:
                    self.report.reaped_at = self.say.elapsed()
            leases = await asyncio.gather(
                *(self.b.queue.claim(w, lease_for=LEASE_SECONDS) for w in workers)
            )
            got = [(w, lease) for w, lease in zip(workers, leases, strict=True) if lease]
            if got:
                claimed = ", ".join(
                    f"{w}->{lease.item.tenant}/{lease.item.item_id}" for w, lease in got
                )
                self.say.say(f"round {number} claims: {claimed}")
                for w, lease in got:
                    self.report.claims.append((w, lease.item.tenant, lease.item.item_id))
            crashed = None
            if self.crash_pending and number == 2:
                crashed = self._pick_crash(got)
            await asyncio.gather(*(self._work(w, lease, crash=(w == crashed)) for w, lease in got))
            if crashed is not None:
                workers.remove(crashed)
            stats = await self.b.queue.stats()
            if stats.queued == 0 and stats.leased == 0:
                return
        raise CommandError(f"demo: the fleet did not finish within {MAX_ROUNDS} rounds")

    def _pick_crash(self, got: list[tuple[str, Lease]]) -> str | None:
        for w, lease in reversed(got):
            key = (lease.item.tenant, lease.item.item_id)
            if not lease.item.payload.get("poison") and self.steps[key] >= 2:
                self.crash_pending = False
                return w
        return None

    async def _work(self, worker: str, lease: Lease, *, crash: bool) -> None:
        item = lease.item
        state = self.b.state
        run = await state.get_run(item.tenant, item.item_id)
        if run is None:
            raise CommandError(f"demo: run {item.tenant}/{item.item_id} vanished")
        if item.payload.get("poison"):
            await self._poison(worker, lease, run)
            return
        total = self.steps[(item.tenant, item.item_id)]
        if run.cursor:
            self.say.say(
                f"{worker}: resumes {item.tenant}/{item.item_id} at step {run.cursor + 1} of "
                f"{total} (attempt {item.attempts}; counters kept from the crashed attempt)"
            )
            self.report.finished_by = worker
            self.report.resumed_from = run.cursor
        run = await state.put_run(
            run.model_copy(update={"status": RunStatus.RUNNING, "data": {**run.data, "by": worker}})
        )
        for step in range(run.cursor, total):
            rng = _draw(self.seed, item.tenant, item.item_id, step)
            tokens_in = rng.randint(400, 2400)
            tokens_out = rng.randint(50, 600)
            with decimal_context():  # exact whatever decimal context the caller set
                cost = PRICE_IN * tokens_in + PRICE_OUT * tokens_out
            run = await state.patch_run(
                item.tenant,
                item.item_id,
                input_tokens=tokens_in,
                output_tokens=tokens_out,
                cost=cost,
                iterations=1,
                cursor=1,
            )
            if crash:
                self.report.crashed = (worker, item.tenant, item.item_id)
                self.say.say(
                    f"{worker}: CRASHED after step {run.cursor} of {total} of "
                    f"{item.tenant}/{item.item_id}; its lease runs until "
                    f"{self.say.elapsed(lease.expires_at)} and nobody else may take it till then"
                )
                return
            await asyncio.sleep(0)
        if total > 3:
            lease = await self.b.queue.heartbeat(lease)
        run = await state.put_run(
            run.model_copy(
                update={
                    "status": RunStatus.SUCCEEDED,
                    "data": {**run.data, "answer": f"done in {total} steps"},
                }
            )
        )
        await self.b.queue.ack(lease)
        self.say.say(
            f"{worker}: finished {item.tenant}/{item.item_id}: {run.iterations} iterations, "
            f"{run.input_tokens}+{run.output_tokens} tokens, ${run.cost}"
        )

    async def _poison(self, worker: str, lease: Lease, run: RunRecord) -> None:
        item = lease.item
        error = "ValueError: the tool returned malformed JSON"
        self.report.poison_errors.append(error)
        failed = await self.b.queue.fail(lease, error)
        if failed.status is ItemStatus.DEAD:
            await self.b.state.put_run(
                run.model_copy(update={"status": RunStatus.FAILED, "data": {"error": error}})
            )
            self.report.dead.append(failed)
            self.say.say(
                f"{worker}: {item.tenant}/{item.item_id} failed attempt {item.attempts} of "
                f"{DEMO_POLICY.max_attempts}: {error}; DEAD-LETTERED, it will not be retried"
            )
        else:
            self.say.say(
                f"{worker}: {item.tenant}/{item.item_id} failed attempt {item.attempts} of "
                f"{DEMO_POLICY.max_attempts}: {error}; retry at "
                f"{self.say.elapsed(failed.available_at)} (backoff from QueuePolicy)"
            )


async def _conflict(b: Backings, fleet: _Fleet) -> None:
    say = fleet.say
    say.heading("two agents, one key: optimistic transactions")
    manager = b.manager
    async with manager.transaction() as tx:
        tx.write("budgets", "acme", {"spent": 0})
    both_read = asyncio.Event()
    readers: set[str] = set()
    attempts: Counter[str] = Counter()

    def agent(name: str, amount: int) -> Callable[[Transaction], Awaitable[int]]:
        async def body(tx: Transaction) -> int:
            attempts[name] += 1
            current = await tx.read("budgets", "acme")
            spent = int(current["spent"])
            if attempts[name] == 1:
                readers.add(name)
                if len(readers) == 2:
                    both_read.set()
                # Both read the same snapshot before either commits: a real race, made certain.
                await both_read.wait()
                say.say(f"{name}: read spent={spent}, adds {amount}")
            else:
                say.say(
                    f"{name}: its commit was refused (ConflictError: budgets/acme changed "
                    f"since its snapshot); TransactionManager.run re-runs it: attempt "
                    f"{attempts[name]} reads spent={spent}, adds {amount}"
                )
            tx.write("budgets", "acme", {"spent": spent + amount})
            return spent + amount

        return body

    results = await asyncio.gather(
        manager.run(agent("planner", 5)), manager.run(agent("critic", 7))
    )
    async with manager.transaction() as tx:
        final = await tx.read("budgets", "acme")
    fleet.report.conflict_attempts = dict(attempts)
    fleet.report.conflict_value = dict(final)
    say.say(
        f"both committed: spent={final['spent']} (= 5 + 7, no lost update); "
        f"attempts: planner {attempts['planner']}, critic {attempts['critic']}; "
        f"they saw {sorted(results)}"
    )

    # The state store refuses a stale put the same way, with both versions.
    run = await b.state.get_run("acme", "run-01")
    if run is not None:
        fresh = await b.state.patch_run("acme", "run-01", iterations=0)
        try:
            await b.state.put_run(run.model_copy(update={"data": {"stale": True}}))
        except StateConflictError as exc:
            fleet.report.stale_put = exc
            say.say(
                f"state store: a put_run holding version {exc.expected} of acme/run-01 is "
                f"refused (StateConflictError, stored version {exc.actual}); "
                f"re-read at version {fresh.version} and apply again"
            )


async def _replay(b: Backings, fleet: _Fleet) -> None:
    say = fleet.say
    say.heading("a retried request: idempotent replay")
    manager = b.manager
    key = "invoice:acme:2026-01"
    invoice = {"tenant": "acme", "amount": "12.50", "lines": 3}
    async with manager.transaction(idempotency_key=key) as tx:
        tx.write("invoices", "acme-2026-01", invoice)
    first = tx.result
    say.say(f"billing agent: committed invoice acme-2026-01 at version {first.version}")
    async with manager.transaction(idempotency_key=key) as tx:
        tx.write("invoices", "acme-2026-01", invoice)
    again = tx.result
    history = await manager.history("invoices", "acme-2026-01")
    say.say(
        f"billing agent (reply lost, retries with the same idempotency key): "
        f"replayed={again.replayed}, version {again.version}, applied nothing new "
        f"({len(history)} version(s) of the invoice exist)"
    )
    fleet.report.replay = (first.version, again.version, again.replayed)
    try:
        async with manager.transaction(idempotency_key=key) as tx:
            tx.write("invoices", "acme-2026-01", {**invoice, "amount": "99.00"})
    except IdempotencyConflictError as exc:
        fleet.report.replay_conflict = str(exc)
        say.say("same key, different invoice: refused with IdempotencyConflictError")


def _summary(b: Backings, fleet: _Fleet, out: TextIO) -> None:
    report = fleet.report
    print(f"\n== summary ({b.kind}: {b.where})", file=out)
    by_status = Counter(run.status.value for run in report.runs)
    print(
        f"runs: {len(report.runs)} in {len(report.backlog)} tenants, "
        + ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
        + f"; {report.rounds} rounds, {fleet.say.elapsed()} of fleet time",
        file=out,
    )
    header = f"  {'tenant':<9}{'runs':>5}{'ok':>5}{'iterations':>12}{'tokens in':>11}"
    print(header + f"{'tokens out':>12}{'cost $':>12}", file=out)
    for tenant in report.backlog:
        runs = [r for r in report.runs if r.tenant == tenant]
        with decimal_context():
            spent = f"{sum((r.cost for r in runs), Decimal(0)):>12}"
        print(
            f"  {tenant:<9}{len(runs):>5}"
            f"{sum(r.status is RunStatus.SUCCEEDED for r in runs):>5}"
            f"{sum(r.iterations for r in runs):>12}"
            f"{sum(r.input_tokens for r in runs):>11}"
            f"{sum(r.output_tokens for r in runs):>12}"
            f"{spent}",
            file=out,
        )
    window = report.fair_window
    shares = Counter(window)
    print(
        f"fair claims: the first {len(window)} claims, while every tenant had work: "
        + ", ".join(f"{t} {shares[t]}" for t in report.backlog)
        + " (backlog "
        + "/".join(str(n) for n in report.backlog.values())
        + "): tenants take turns, a backlog cannot starve its neighbour",
        file=out,
    )
    if report.crashed:
        worker, tenant, run_id = report.crashed
        print(
            f"crash: {worker} crashed holding {tenant}/{run_id}; the reaper returned it at "
            f"{report.reaped_at}, once its lease had lapsed, and {report.finished_by} finished "
            f"it from step {(report.resumed_from or 0) + 1}, counters intact",
            file=out,
        )
    for item in report.dead:
        print(
            f"dead letter: {item.tenant}/{item.item_id} after {item.attempts} attempts "
            f"({item.last_error})",
            file=out,
        )
    print(
        f"conflict: planner and critic raced on budgets/acme; attempts "
        f"{report.conflict_attempts}; final {report.conflict_value}",
        file=out,
    )
    if report.replay:
        first, again, replayed = report.replay
        print(
            f"idempotent replay: first commit version {first}, replay version {again}, "
            f"replayed={replayed}",
            file=out,
        )


def _fair_window(report: DemoReport) -> list[str]:
    """The tenants of the claims made while every tenant still had unclaimed work."""
    remaining = dict(report.backlog)
    window: list[str] = []
    seen: set[tuple[str, str]] = set()
    for _worker, tenant, run_id in report.claims:
        if min(remaining.values()) == 0:
            break
        window.append(tenant)
        if (tenant, run_id) not in seen:
            seen.add((tenant, run_id))
            remaining[tenant] -= 1
    return window


async def _collect_runs(b: Backings) -> list[RunRecord]:
    runs: list[RunRecord] = []
    for tenant, _count in TENANTS:
        after: str | None = None
        while True:
            page = await b.state.list_runs(tenant, limit=100, after=after)
            runs.extend(page.items)
            if page.next is None:
                break
            after = page.next
    return runs


async def run_demo(b: Backings, clock: ManualClock, *, seed: int, out: TextIO) -> DemoReport:
    """Tell the whole story on ``b`` (whose stores read ``clock``) and print the summary."""
    fleet = _Fleet(b, clock, seed, out)
    await fleet.seed_work()
    fleet.say.heading("the fleet works, in rounds of 10 s of simulated time")
    await fleet.run_rounds()
    fleet.report.fair_window = _fair_window(fleet.report)
    await _conflict(b, fleet)
    await _replay(b, fleet)
    fleet.report.runs = await _collect_runs(b)
    _summary(b, fleet, out)
    return fleet.report


# -- command line ---------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``statepact demo``."""
    add_server_arguments(parser, verb="run the demo on")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="seed the simulated steps and token counts, so two runs print the same story "
        "(default: a random seed, printed at the start)",
    )
    add_debug_argument(parser)


def _targets(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """The backings to tell the story on, in order: Redis, then PostgreSQL; else memory.

    A server is used only when its option names it (a bare one reads its
    ``STATEPACT_*_URL``): the environment alone never sends the demo to a server.
    """
    targets: list[tuple[str, str | None]] = []
    for kind in ("redis", "postgres"):
        url = option_url(getattr(args, kind), kind)
        if url:
            targets.append((kind, url))
    return targets or [("memory", None)]


def command(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Run ``statepact demo`` with parsed ``args``; the exit code.

    Given both ``--redis`` and ``--postgres``, the story is told on Redis and then
    on PostgreSQL, each under its own heading and with its own summary, from the
    same seed (so the counters match); the first failure ends the run.
    """
    stream = out or sys.stdout
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10_000)

    async def body() -> int:
        targets = _targets(args)
        for number, (kind, url) in enumerate(targets, start=1):
            of = f" ({number} of {len(targets)})" if len(targets) > 1 else ""
            if number > 1:
                print(f"\n{'=' * 72}\n", file=stream)
            clock = ManualClock()
            print(f"statepact demo on {kind}, seed {seed}{of}", file=stream)
            if url is not None:
                print(f"server: {redact_dsn(url)}", file=stream)
            async with open_backings(kind, url, clock=clock, policy=DEMO_POLICY) as b:
                await run_demo(b, clock, seed=seed, out=stream)
            if url is not None:
                print(f"the demo's {_SCRATCH[kind]} was removed from the server", file=stream)
        if len(targets) > 1:
            print(
                f"\nthe same story, seed {seed}, ran on "
                + " and then ".join(kind for kind, _ in targets),
                file=stream,
            )
        return 0

    return run_command("demo", body, debug=args.debug)


_SCRATCH = {"redis": "namespace", "postgres": "schema"}


def main(argv: list[str] | None = None) -> int:
    """``python -m statepact.cli.demo``: the demo without the rest of the command line."""
    parser = argparse.ArgumentParser(prog="statepact demo", description=DESCRIPTION)
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
