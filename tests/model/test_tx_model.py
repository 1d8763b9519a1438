"""Model-based test of ``TransactionManager``: every backing, the memory reference and a plain
model take the same random operations and must give the same answers.

A Hypothesis ``RuleBasedStateMachine`` keeps up to three transactions open at
once on three managers in lockstep: one over the backing under test, one over
a ``MemoryBackend`` (the reference, history kept in full) and
:class:`PlainTxModel`, the front's and the ``StorageBackend`` protocol's rules
as plain dictionaries (one version chain per key, first committer wins,
backward read validation, idempotency records, fencing high-water marks,
leases, try-once locks). Interleaving reads, writes, locks, commits and
rollbacks of several transactions is what makes conflicts, replays, fencing
and lock refusals happen; a shared ``ManualClock`` moves between steps, so
leases expire and ``committed_at`` differs per commit.

Compared after every call: the value or ``CommitResult`` returned, lease
fields (the token left out: it is opaque, checked per backing to strictly
increase per resource), history and registry entries, or the raised error's
type (a ``ConflictError`` must also name a key that really conflicts). Locks
are taken with ``timeout=0`` (try once): a refused lock is a
``LockTimeoutError`` on every backing, memory included, since nothing ever
waits and so no wait-for cycle can form.

Budget: ``MAX_EXAMPLES`` runs of up to ``STEPS`` steps per backing, no deadline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from statepact.clock import ManualClock
from statepact.errors import (
    ConflictError,
    FencingError,
    IdempotencyConflictError,
    LeaseLostError,
    LockTimeoutError,
)
from statepact.storage.memory import MemoryBackend
from statepact.tx import (
    CommitResult,
    Isolation,
    Lease,
    LockMode,
    ResourceInfo,
    Transaction,
    TransactionManager,
    VersionEntry,
)
from tests.model._harness import (
    Backing,
    LockstepMachine,
    machine_settings,
    run_machine,
    within_budget,
)

MAX_EXAMPLES = 100
STEPS = 50
SETTINGS = machine_settings(MAX_EXAMPLES, STEPS)

RESOURCES = ["orders", "users"]
KEYS = ["k1", "ü'k"]
LEASE_RESOURCES = ["orders", "jobs"]
OWNERS = ["o1", "o2"]
MAX_OPEN = 3

values = st.one_of(
    st.integers(-5, 5),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4),
    st.booleans(),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["b", "a", "ü"]), st.integers(0, 3), max_size=2),
)
# Weighted towards one hot key, so that transactions collide often.
resources = st.sampled_from([RESOURCES[0], RESOURCES[0], RESOURCES[0], RESOURCES[1]])
keys = st.sampled_from([KEYS[0], KEYS[0], KEYS[0], KEYS[1]])
picks = st.integers(min_value=0, max_value=10_000)
# Serializable first: Hypothesis draws the first element most, and it checks the most.
ISOLATIONS = [Isolation.SERIALIZABLE, Isolation.SNAPSHOT, Isolation.READ_COMMITTED]
isolations = st.sampled_from(ISOLATIONS)
ttls = st.sampled_from([1, 5, 30.5, timedelta(seconds=60)])


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# -- the plain model ------------------------------------------------------------------------------

Slot = tuple[str, str]


@dataclass
class ModelTxn:
    isolation: Isolation
    idempotency_key: str | None
    fencing: Lease | None
    taken_at: int
    txn_id: int
    reads: dict[Slot, int] = field(default_factory=dict)
    writes: dict[Slot, str | None] = field(default_factory=dict)


class PlainTxModel:
    """Transactions, leases, locks and the registry as dictionaries, in protocol order."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.seq = 0
        self.chains: dict[Slot, list[tuple[int, str | None, datetime]]] = {}
        self.idempotency: dict[str, tuple[tuple[Any, ...], CommitResult]] = {}
        self.fence: dict[str, int] = {}
        self.leases: dict[str, Lease] = {}
        self.registry: dict[str, tuple[str, int, datetime | None]] = {}
        self.locks: dict[Slot, dict[int, LockMode]] = {}
        self.txn_ids = 0

    # transactions

    def begin(
        self, isolation: Isolation, idempotency_key: str | None, fencing: Lease | None
    ) -> ModelTxn:
        self.txn_ids += 1
        return ModelTxn(isolation, idempotency_key, fencing, self.seq, self.txn_ids)

    def _latest(self, slot: Slot) -> tuple[int, str | None]:
        chain = self.chains.get(slot)
        return (0, None) if not chain else (chain[-1][0], chain[-1][1])

    def _at(self, slot: Slot, at: int) -> tuple[int, str | None]:
        found: tuple[int, str | None] = (0, None)
        for version, data, _ in self.chains.get(slot, []):
            if version <= at:
                found = (version, data)
        return found

    def read(self, txn: ModelTxn, slot: Slot) -> Any:
        if slot in txn.writes:
            data = txn.writes[slot]
        elif txn.isolation is Isolation.READ_COMMITTED:
            version, data = self._latest(slot)
            txn.reads.setdefault(slot, version)
        else:
            version, data = self._at(slot, txn.taken_at)
            txn.reads.setdefault(slot, version)
        return None if data is None else json.loads(data)

    def write(self, txn: ModelTxn, slot: Slot, value: Any) -> None:
        txn.writes[slot] = canonical(value)

    def delete(self, txn: ModelTxn, slot: Slot) -> None:
        txn.writes[slot] = None

    def lock(self, txn: ModelTxn, slot: Slot, mode: LockMode) -> None:
        holders = self.locks.setdefault(slot, {})
        mine = holders.get(txn.txn_id)
        if mine is LockMode.EXCLUSIVE or mine is mode:
            return
        others = {t: m for t, m in holders.items() if t != txn.txn_id}
        if any(m is LockMode.EXCLUSIVE for m in others.values()) or (
            mode is LockMode.EXCLUSIVE and others
        ):
            raise LockTimeoutError(resource=slot[0], key=slot[1], timeout=0)
        holders[txn.txn_id] = mode

    def end(self, txn: ModelTxn) -> None:
        for holders in self.locks.values():
            holders.pop(txn.txn_id, None)

    def conflicting(self, txn: ModelTxn) -> set[Slot]:
        """Every slot whose validation refuses the commit (empty: it passes)."""
        if txn.isolation is Isolation.READ_COMMITTED:
            return set()
        slots = {slot for slot in txn.writes if self._latest(slot)[0] > txn.taken_at}
        if txn.isolation is Isolation.SERIALIZABLE:
            slots |= {
                slot for slot, version in txn.reads.items() if self._latest(slot)[0] != version
            }
        return slots

    def commit(self, txn: ModelTxn) -> CommitResult:
        try:
            return self._commit(txn)
        finally:
            self.end(txn)

    def _commit(self, txn: ModelTxn) -> CommitResult:
        writes = tuple(sorted(txn.writes.items()))
        if (
            not writes
            and txn.idempotency_key is None
            and txn.fencing is None
            and txn.isolation is not Isolation.SERIALIZABLE
        ):
            return CommitResult(txn.taken_at)
        if txn.fencing is not None:
            highest = self.fence.get(txn.fencing.resource, 0)
            if txn.fencing.token < highest:
                raise FencingError(
                    resource=txn.fencing.resource, token=txn.fencing.token, highest=highest
                )
        if txn.idempotency_key is not None and txn.idempotency_key in self.idempotency:
            seen, result = self.idempotency[txn.idempotency_key]
            if seen != writes:
                raise IdempotencyConflictError(txn.idempotency_key)
            return CommitResult(result.version, replayed=True)
        if self.conflicting(txn):
            raise ConflictError("conflict")
        if writes:
            self.seq += 1
            now = self.clock.now()
            for slot, data in writes:
                self.chains.setdefault(slot, []).append((self.seq, data, now))
                metadata = self.registry.get(slot[0], ("{}", 0, None))[0]
                self.registry[slot[0]] = (metadata, self.seq, now)
            result = CommitResult(self.seq)
        else:
            result = CommitResult(txn.taken_at)
        if txn.idempotency_key is not None:
            self.idempotency[txn.idempotency_key] = (writes, result)
        return result

    # leases

    def acquire_lease(self, resource: str, owner: str, ttl: float) -> Lease | None:
        now = self.clock.now()
        current = self.leases.get(resource)
        if current is not None and current.expires_at > now and current.owner != owner:
            return None
        self.fence[resource] = self.fence.get(resource, 0) + 1
        lease = Lease(resource, owner, self.fence[resource], now + timedelta(seconds=ttl), ttl)
        self.leases[resource] = lease
        return lease

    def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        now = self.clock.now()
        current = self.leases.get(lease.resource)
        if (
            current is None
            or current.token != lease.token
            or current.owner != lease.owner
            or current.expires_at <= now
        ):
            raise LeaseLostError("lease lost")
        renewed = Lease(lease.resource, lease.owner, lease.token, now + timedelta(seconds=ttl), ttl)
        self.leases[lease.resource] = renewed
        return renewed

    def release_lease(self, lease: Lease) -> bool:
        current = self.leases.get(lease.resource)
        if current is None or current.token != lease.token:
            return False
        del self.leases[lease.resource]
        return True

    # history and registry

    def history(self, slot: Slot, limit: int) -> list[VersionEntry]:
        return [
            VersionEntry(version, None if data is None else json.loads(data), data is None, at)
            for version, data, at in reversed(self.chains.get(slot, []))
        ][:limit]

    def register_resource(self, name: str, metadata: dict[str, Any]) -> None:
        _, version, at = self.registry.get(name, ("{}", 0, None))
        self.registry[name] = (canonical(metadata), version, at)

    def resource_info(self, name: str) -> ResourceInfo | None:
        entry = self.registry.get(name)
        if entry is None:
            return None
        return ResourceInfo(name, json.loads(entry[0]), entry[1], entry[2])


# -- normal forms and bookkeeping ------------------------------------------------------------------


def lease_form(lease: Lease | None) -> Any:
    if lease is None:
        return None
    return (lease.resource, lease.owner, lease.expires_at, lease.ttl)


def seconds_of(ttl: float | timedelta) -> float:
    return ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)


@dataclass
class Open:
    """One logical transaction, open on all three."""

    real: Transaction
    ref: Transaction
    model: ModelTxn


class TxMachine(LockstepMachine):
    """Drives ``backing``, the memory reference and the plain model in lockstep."""

    def __init__(self) -> None:
        super().__init__()
        real_backend = self.runner.open(self.backing.tx_backend(self.clock)).value
        self.real = TransactionManager(real_backend)
        self.ref = TransactionManager(MemoryBackend(clock=self.clock, gc=False))
        self.model = PlainTxModel(self.clock)
        self.open: list[Open] = []
        # Every resource lease handed out: {"real": ..., "ref": ..., "model": ...}.
        self.leases: list[dict[str, Lease]] = []
        self.tokens: dict[str, dict[str, int]] = {"real": {}, "ref": {}, "model": {}}

    def teardown(self) -> None:
        async def end_all() -> None:
            for txn in self.open:
                await txn.real.rollback()
                await txn.ref.rollback()

        self.runner.run(end_all())
        super().teardown()

    def pick_open(self, index: int) -> Open:
        """An open transaction; with none open, one begins (isolation chosen by ``index``)."""
        if not self.open:
            self.begin(ISOLATIONS[index % len(ISOLATIONS)], None, None)
        return self.open[index % len(self.open)]

    def keep_lease(self, values: dict[str, Lease]) -> None:
        for who, lease in values.items():
            top = self.tokens[who].get(lease.resource, 0)
            assert lease.token > top, (
                f"{who}: lease on {lease.resource!r} got token {lease.token}, "
                f"not above the {top} issued before"
            )
            self.tokens[who][lease.resource] = lease.token
        self.leases.append(values)

    # -- time ---------------------------------------------------------------------------------

    @initialize(
        writes=st.lists(st.tuples(resources, keys, values), min_size=1, max_size=4),
        owner=st.sampled_from(OWNERS),
    )
    def fill(self, writes: list[tuple[str, str, Any]], owner: str) -> None:
        """Start every run with some keys committed and a lease held."""
        for resource, key, value in writes:
            self.autocommit(resource, key, value)
        self.lease("acquire", LEASE_RESOURCES[0], owner, 30.5, 0)

    @rule(seconds=st.sampled_from([0.000001, 1, 5, 30, 100]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- transactions -----------------------------------------------------------------------

    @within_budget("begin", 8)
    @precondition(lambda self: len(self.open) < MAX_OPEN)
    @rule(
        isolation=isolations,
        idempotency_key=st.sampled_from([None, None, "idem-1", "idem-2"]),
        fence=st.one_of(st.none(), picks),
    )
    def begin(self, isolation: Isolation, idempotency_key: str | None, fence: int | None) -> None:
        self.used["begin"] += 1
        lease = None if fence is None or not self.leases else self.leases[fence % len(self.leases)]
        real = self.runner.run(
            self.real.begin(isolation, idempotency_key, None if lease is None else lease["real"])
        )
        ref = self.runner.run(
            self.ref.begin(isolation, idempotency_key, None if lease is None else lease["ref"])
        )
        model = self.model.begin(
            isolation, idempotency_key, None if lease is None else lease["model"]
        )
        assert real.taken_at == ref.taken_at == model.taken_at, (
            f"begin: snapshots {real.taken_at} ({self.backing.name}), {ref.taken_at} (memory), "
            f"{model.taken_at} (model)"
        )
        self.open.append(Open(real, ref, model))

    # One rule for every step inside a transaction (swarm testing switches whole rules
    # off per run; reads, writes and locks stay together), and a step with no
    # transaction open begins one, so most steps work on transactions.

    @within_budget("step", 24)
    @rule(
        pick=picks,
        op=st.sampled_from(["read", "read", "write", "write", "delete", "lock"]),
        resource=resources,
        key=keys,
        value=values,
        mode=st.sampled_from(list(LockMode)),
    )
    def step(self, pick: int, op: str, resource: str, key: str, value: Any, mode: LockMode) -> None:
        """A read, write, delete or try-once lock in an open transaction."""
        self.used["step"] += 1
        txn = self.pick_open(pick)
        slot = (resource, key)
        if op == "read":
            self.compare_each(
                f"read({resource!r}, {key!r}) in {txn.model}",
                lambda: txn.real.read(resource, key),
                lambda: txn.ref.read(resource, key),
                lambda: self.model.read(txn.model, slot),
            )
        elif op == "lock":
            self.compare_each(
                f"lock({resource!r}, {key!r}, {mode.value}, timeout=0) in {txn.model}",
                lambda: txn.real.lock(resource, key, mode, timeout=0),
                lambda: txn.ref.lock(resource, key, mode, timeout=0),
                lambda: self.model.lock(txn.model, slot, mode),
            )
        else:

            async def write_on(tx: Transaction) -> None:
                if op == "delete":
                    tx.delete(resource, key)
                else:
                    tx.write(resource, key, value)

            def write_model() -> None:
                if op == "delete":
                    self.model.delete(txn.model, slot)
                else:
                    self.model.write(txn.model, slot, value)

            self.compare_each(
                f"{op}({resource!r}, {key!r}, {value!r}) in {txn.model}",
                lambda: write_on(txn.real),
                lambda: write_on(txn.ref),
                write_model,
            )

    @within_budget("end", 10)
    @precondition(lambda self: bool(self.open))
    @rule(pick=picks, how=st.sampled_from(["commit", "commit", "rollback"]))
    def end(self, pick: int, how: str) -> None:
        self.used["end"] += 1
        txn = self.pick_open(pick)
        self.open.remove(txn)
        if how == "rollback":
            self.runner.run(txn.real.rollback())
            self.runner.run(txn.ref.rollback())
            self.model.end(txn.model)
            return
        # Worked out before the model commits: which keys make validation refuse it.
        conflicting = self.model.conflicting(txn.model)
        outcomes, _ = self.compare_each(
            f"commit of {txn.model}",
            txn.real.commit,
            txn.ref.commit,
            lambda: self.model.commit(txn.model),
        )
        for who in ("real", "ref"):
            error = outcomes[who].error
            if isinstance(error, ConflictError) and error.resource is not None:
                assert (error.resource, error.key) in conflicting, (
                    f"{who}: ConflictError names {error.resource!r}/{error.key!r}, "
                    f"which does not conflict (the conflicting keys are {conflicting})"
                )

    @within_budget("autocommit", 10)
    @rule(resource=resources, key=keys, value=st.one_of(st.none(), values))
    def autocommit(self, resource: str, key: str, value: Any) -> None:
        """One write (or delete, for None) in a transaction of its own."""
        self.used["autocommit"] += 1

        async def one(manager: TransactionManager) -> CommitResult:
            async with manager.transaction() as tx:
                if value is None:
                    tx.delete(resource, key)
                else:
                    tx.write(resource, key, value)
            return tx.result

        def one_model() -> CommitResult:
            txn = self.model.begin(Isolation.SNAPSHOT, None, None)
            if value is None:
                self.model.delete(txn, (resource, key))
            else:
                self.model.write(txn, (resource, key), value)
            return self.model.commit(txn)

        self.compare(f"autocommit {resource!r}/{key!r} = {value!r}", one, one_model)

    @within_budget("interfere", 8)
    @precondition(lambda self: any(txn.model.reads or txn.model.writes for txn in self.open))
    @rule(pick=picks, value=st.one_of(st.none(), values))
    def interfere(self, pick: int, value: Any) -> None:
        """Commit, from outside, to a key an open transaction read or wrote: the collisions
        that validation exists for, made on purpose rather than waited for."""
        self.used["interfere"] += 1
        touched = sorted(
            {slot for txn in self.open for slot in (*txn.model.reads, *txn.model.writes)}
        )
        resource, key = touched[pick % len(touched)]
        self.autocommit(resource, key, value)

    # -- leases -----------------------------------------------------------------------------

    @within_budget("lease", 8)
    @rule(
        op=st.sampled_from(["acquire", "acquire", "renew", "release"]),
        resource=st.sampled_from(LEASE_RESOURCES),
        owner=st.sampled_from(OWNERS),
        ttl=st.one_of(st.none(), ttls),
        pick=picks,
    )
    def lease(
        self, op: str, resource: str, owner: str, ttl: float | timedelta | None, pick: int
    ) -> None:
        """Acquire a lease on ``resource`` for ``owner``, or renew or release a known one."""
        self.used["lease"] += 1
        if op == "acquire" or not self.leases:
            ttl = ttl or 5
            outcome, got = self.compare(
                f"acquire_lease({resource!r}, {owner!r}, {ttl!r})",
                lambda manager: manager.acquire_lease(resource, owner, ttl),
                lambda: self.model.acquire_lease(resource, owner, seconds_of(ttl)),
                lease_form,
            )
            if outcome.ok and outcome.value is not None:
                self.keep_lease(got)
            return
        lease = self.leases[pick % len(self.leases)]
        if op == "release":
            self.compare_each(
                f"release_lease({lease['model']})",
                lambda: self.real.release_lease(lease["real"]),
                lambda: self.ref.release_lease(lease["ref"]),
                lambda: self.model.release_lease(lease["model"]),
            )
            return
        model_ttl = lease["model"].ttl if ttl is None else seconds_of(ttl)
        outcomes, got = self.compare_each(
            f"renew_lease({lease['model']}, ttl={ttl!r})",
            lambda: self.real.renew_lease(lease["real"], ttl),
            lambda: self.ref.renew_lease(lease["ref"], ttl),
            lambda: self.model.renew_lease(lease["model"], model_ttl),
            lease_form,
        )
        if outcomes["real"].ok:
            for who, renewed in got.items():
                assert renewed.token == lease[who].token, f"{who}: a renewal changed the token"
            self.leases.append(got)

    # -- history and registry ---------------------------------------------------------------

    @within_budget("inspect", 6)
    @rule(
        op=st.sampled_from(["history", "register", "info"]),
        resource=st.sampled_from([*RESOURCES, "audit"]),
        key=keys,
        limit=st.integers(1, 4),
        metadata=st.dictionaries(st.sampled_from(["owner", "ü"]), values, max_size=2),
    )
    def inspect(
        self, op: str, resource: str, key: str, limit: int, metadata: dict[str, Any]
    ) -> None:
        """``history`` of a key, ``register_resource`` or ``resource_info``."""
        self.used["inspect"] += 1
        if op == "history":
            self.compare(
                f"history({resource!r}, {key!r}, limit={limit})",
                lambda manager: manager.history(resource, key, limit),
                lambda: self.model.history((resource, key), limit),
            )
        elif op == "register":
            self.compare(
                f"register_resource({resource!r}, {metadata!r})",
                lambda manager: manager.register_resource(resource, metadata),
                lambda: self.model.register_resource(resource, metadata),
            )
        else:
            self.compare(
                f"resource_info({resource!r})",
                lambda manager: manager.resource_info(resource),
                lambda: self.model.resource_info(resource),
            )


def test_transactions_agree_with_memory_and_the_model(model_backing: Backing) -> None:
    """Every backing answers random interleaved transactions as memory and the plain model do."""
    run_machine(TxMachine, model_backing, SETTINGS)
