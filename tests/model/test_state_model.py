"""Model-based test of ``StateStore``: every backing, the memory reference and a plain model
take the same random operations and must give the same answers.

A Hypothesis ``RuleBasedStateMachine`` drives three stores in lockstep: the
backing under test, a ``MemoryStateStore`` (the semantic reference) and
:class:`PlainStateModel`, a few dictionaries written straight from the
protocol's docstrings, so a mistake in the reference shows too. All three share
one ``ManualClock``, which a rule moves between steps. After every call the
returned value (``seq`` left out: it is opaque) or the raised error's type and
the fields it names must agree; the first disagreement fails with the operation
sequence that led there (Hypothesis prints and shrinks it).

``seq`` is checked per store instead: a record keeps its ``seq`` until it is
deleted, and a record created later in a tenant gets a greater one.

Budget: ``MAX_EXAMPLES`` runs of up to ``STEPS`` steps per backing, no deadline;
each run gets one event loop and empty stores (see ``tests/model/_harness.py``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from statepact._codec import COST_SCALE, nanos_to_decimal
from statepact.clock import ManualClock
from statepact.errors import RunNotFoundError, StateConflictError
from statepact.models import Page, RunRecord, RunStatus, SessionRecord
from statepact.state import StateStore
from statepact.storage.memory import MemoryStateStore
from tests.model._harness import (
    Backing,
    LockstepMachine,
    machine_settings,
    page_form,
    run_form,
    run_machine,
    session_form,
    walk_model_pages,
    walk_pages,
    within_budget,
)

MAX_EXAMPLES = 100
STEPS = 50
SETTINGS = machine_settings(MAX_EXAMPLES, STEPS)

TENANTS = ["acme", "globex", "ünï 'x'"]
RUN_IDS = ["r1", "r2", "r3"]
SESSION_IDS = ["s1", "s2"]
MAX_COUNTER = 2**63 - 1
COUNTERS = ("input_tokens", "output_tokens", "cost", "iterations", "cursor")

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    # NUL is the front's to refuse (the fuzz lane checks that); the model keeps to valid blobs.
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6),
)
blobs = st.dictionaries(
    st.sampled_from(["a", "b", "ü", "k y", ""]),
    st.one_of(json_leaf, st.lists(json_leaf, max_size=3)),
    max_size=3,
)
# "current": the version the model holds now (0 when absent); else a literal, often stale.
versions = st.one_of(st.just("current"), st.integers(0, 4))
deltas = st.one_of(st.integers(0, 3), st.just(2**62 - 1))
costs = st.sampled_from(["0", "0.000000001", "1.5", "0.25", "4611686018"])
statuses = st.sampled_from(list(RunStatus))
sessions = st.one_of(st.none(), st.sampled_from(SESSION_IDS))
tenants = st.sampled_from([TENANTS[0], *TENANTS])


# -- the plain model ----------------------------------------------------------------------------


@dataclass
class _Row:
    data: str
    version: int
    created_at: datetime
    updated_at: datetime
    seq: int
    session_id: str | None = None
    status: RunStatus = RunStatus.PENDING
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))


class PlainStateModel:
    """The ``StateStore`` promises as plain dictionaries and linear scans."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.seq = 0
        self.runs: dict[tuple[str, str], _Row] = {}
        self.sessions: dict[tuple[str, str], _Row] = {}

    def _run(self, tenant: str, run_id: str, row: _Row) -> RunRecord:
        return RunRecord(
            tenant=tenant,
            run_id=run_id,
            session_id=row.session_id,
            status=row.status,
            data=json.loads(row.data),
            version=row.version,
            input_tokens=row.counters["input_tokens"],
            output_tokens=row.counters["output_tokens"],
            cost=nanos_to_decimal(row.counters["cost"]),
            iterations=row.counters["iterations"],
            cursor=row.counters["cursor"],
            created_at=row.created_at,
            updated_at=row.updated_at,
            seq=row.seq,
        )

    def _session(self, tenant: str, session_id: str, row: _Row) -> SessionRecord:
        return SessionRecord(
            tenant=tenant,
            session_id=session_id,
            data=json.loads(row.data),
            version=row.version,
            created_at=row.created_at,
            updated_at=row.updated_at,
            seq=row.seq,
        )

    def _write(
        self, table: dict[tuple[str, str], _Row], key: tuple[str, str], version: int, kind: str
    ) -> _Row | None:
        """The row a put may write (None: create it); conflict when the versions differ."""
        row = table.get(key)
        stored = 0 if row is None else row.version
        if version != stored:
            raise StateConflictError(
                tenant=key[0], record_id=key[1], expected=version, actual=stored, kind=kind
            )
        return row

    def get_run(self, tenant: str, run_id: str) -> RunRecord | None:
        row = self.runs.get((tenant, run_id))
        return None if row is None else self._run(tenant, run_id, row)

    def _put(
        self, table: dict[tuple[str, str], _Row], key: tuple[str, str], record: Any, kind: str
    ) -> _Row:
        """Create or replace ``record``'s row, the next version of it."""
        row = self._write(table, key, record.version, kind)
        now = self.clock.now()
        if row is None:
            self.seq += 1
            row = table[key] = _Row("", 0, now, now, self.seq)
        row.data = json.dumps(record.data)
        row.version += 1
        row.updated_at = now
        return row

    def put_run(self, record: RunRecord) -> RunRecord:
        key = (record.tenant, record.run_id)
        row = self._put(self.runs, key, record, "run")
        row.session_id = record.session_id
        row.status = record.status
        return self._run(*key, row)

    def patch_run(self, tenant: str, run_id: str, add: dict[str, int]) -> RunRecord:
        row = self.runs.get((tenant, run_id))
        if row is None:
            raise RunNotFoundError(tenant=tenant, run_id=run_id)
        for name in COUNTERS:
            if row.counters[name] + add[name] > MAX_COUNTER:
                raise ValueError(f"{name}: would pass the counter's limit")
        for name in COUNTERS:
            row.counters[name] += add[name]
        row.version += 1
        row.updated_at = self.clock.now()
        return self._run(tenant, run_id, row)

    def list_runs(
        self,
        tenant: str,
        session_id: str | None,
        status: RunStatus | None,
        limit: int,
        after: str | None,
    ) -> Page[RunRecord]:
        after_seq = 0 if after is None else int(after)
        found = sorted(
            (row.seq, run_id)
            for (t, run_id), row in self.runs.items()
            if t == tenant
            and row.seq > after_seq
            and (session_id is None or row.session_id == session_id)
            and (status is None or row.status == status)
        )
        shown = [self._run(tenant, run_id, self.runs[(tenant, run_id)]) for _, run_id in found]
        if len(shown) > limit:
            return Page[RunRecord](items=shown[:limit], next=str(shown[limit - 1].seq))
        return Page[RunRecord](items=shown, next=None)

    def delete_run(self, tenant: str, run_id: str) -> bool:
        return self.runs.pop((tenant, run_id), None) is not None

    def put_session(self, record: SessionRecord) -> SessionRecord:
        key = (record.tenant, record.session_id)
        return self._session(*key, self._put(self.sessions, key, record, "session"))

    def get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        row = self.sessions.get((tenant, session_id))
        return None if row is None else self._session(tenant, session_id, row)

    def list_sessions(self, tenant: str, limit: int, after: str | None) -> Page[SessionRecord]:
        after_seq = 0 if after is None else int(after)
        found = sorted((row.seq, sid) for (t, sid), row in self.sessions.items() if t == tenant)
        shown = [
            self._session(tenant, sid, self.sessions[(tenant, sid)])
            for seq, sid in found
            if seq > after_seq
        ]
        if len(shown) > limit:
            return Page[SessionRecord](items=shown[:limit], next=str(shown[limit - 1].seq))
        return Page[SessionRecord](items=shown, next=None)


# -- seq bookkeeping ------------------------------------------------------------------------------


class SeqWatch:
    """Checks one store's ``seq`` promises: never rewritten; later creations get more."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.known: dict[tuple[str, str, str], int] = {}
        self.highest: dict[tuple[str, str], int] = {}

    def saw(self, kind: str, record: RunRecord | SessionRecord, *, created: bool = False) -> None:
        record_id = record.run_id if isinstance(record, RunRecord) else record.session_id
        assert record.seq is not None, f"{self.name}: {kind} {record_id!r} came back without seq"
        key = (record.tenant, kind, record_id)
        if created:
            top = self.highest.get((record.tenant, kind), 0)
            assert record.seq > top, (
                f"{self.name}: {kind} {record_id!r} created with seq {record.seq}, "
                f"not above the {top} an earlier {kind} of tenant {record.tenant!r} got"
            )
            self.highest[(record.tenant, kind)] = record.seq
            self.known[key] = record.seq
        elif key in self.known:
            assert self.known[key] == record.seq, (
                f"{self.name}: {kind} {record_id!r} had seq {self.known[key]}, "
                f"now {record.seq}: seq was rewritten"
            )
        else:
            self.known[key] = record.seq

    def deleted(self, tenant: str, run_id: str) -> None:
        self.known.pop((tenant, "run", run_id), None)


# -- the machine --------------------------------------------------------------------------------


class StateMachine(LockstepMachine):
    """Drives ``backing``, the memory reference and the plain model in lockstep."""

    def __init__(self) -> None:
        super().__init__()
        self.real: StateStore = self.runner.open(self.backing.state_store(self.clock)).value
        self.ref = MemoryStateStore(clock=self.clock)
        self.model = PlainStateModel(self.clock)
        self.watch = {
            "real": SeqWatch(self.backing.name),
            "ref": SeqWatch("memory"),
            "model": SeqWatch("model"),
        }
        # An open listing per store: (tenant, session, status, limit, its own next cursor).
        self.paging: dict[str, tuple[str, str | None, RunStatus | None, int, str]] = {}

    def watch_runs(self, values: dict[str, Any], *, created: bool = False) -> None:
        for who, value in values.items():
            records = value if isinstance(value, list) else [value]
            for record in records:
                if record is not None:
                    self.watch[who].saw("run", record, created=created)

    # -- rules ------------------------------------------------------------------------------

    @initialize(
        runs=st.lists(
            st.tuples(tenants, st.sampled_from(RUN_IDS), sessions, statuses),
            min_size=2,
            max_size=6,
        ),
        session_ids=st.lists(st.tuples(tenants, st.sampled_from(SESSION_IDS)), max_size=2),
    )
    def fill(
        self,
        runs: list[tuple[str, str, str | None, RunStatus]],
        session_ids: list[tuple[str, str]],
    ) -> None:
        """Start every run with some runs and sessions stored, so no run only misses."""
        for tenant, run_id, session_id, status in runs:
            self.put_run(tenant, run_id, session_id, status, {"step": 0}, "current")
        for tenant, session_id in session_ids:
            self.put_session(tenant, session_id, {}, "current")

    @rule(seconds=st.sampled_from([0.000001, 0.5, 1, 7, 60, 3600]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # Two rules with an ``op`` each (swarm testing switches whole rules off per run),
    # each with a budget per run (see ``within_budget``); ``advance`` is unbounded.

    @within_budget("change", 25)
    @rule(
        op=st.sampled_from(["put_run", "put_run", "patch_run", "delete_run", "put_session"]),
        tenant=tenants,
        run_id=st.sampled_from(RUN_IDS),
        session_id=sessions,
        status=statuses,
        data=blobs,
        version=versions,
        add=st.tuples(deltas, deltas, costs, deltas, deltas),
    )
    def change(
        self,
        op: str,
        tenant: str,
        run_id: str,
        session_id: str | None,
        status: RunStatus,
        data: dict[str, Any],
        version: int | str,
        add: tuple[int, int, str, int, int],
    ) -> None:
        """put_run, patch_run, delete_run or put_session."""
        self.used["change"] += 1
        if op == "put_run":
            self.put_run(tenant, run_id, session_id, status, data, version)
        elif op == "patch_run":
            self.patch_run(tenant, run_id, *add)
        elif op == "delete_run":
            self.delete_run(tenant, run_id)
        else:
            self.put_session(tenant, session_id or SESSION_IDS[0], data, version)

    @within_budget("look", 15)
    @rule(
        op=st.sampled_from(
            ["get_run", "list_runs", "start_paging", "next_page", "get_session", "list_sessions"]
        ),
        tenant=tenants,
        run_id=st.sampled_from(RUN_IDS),
        session_id=sessions,
        status=st.one_of(st.none(), statuses),
        limit=st.integers(1, 4),
    )
    def look(
        self,
        op: str,
        tenant: str,
        run_id: str,
        session_id: str | None,
        status: RunStatus | None,
        limit: int,
    ) -> None:
        """get_run, a whole listing, a first page, the next page, get_session or list_sessions."""
        self.used["look"] += 1
        if op == "get_run":
            self.get_run(tenant, run_id)
        elif op == "list_runs":
            self.list_all_runs(tenant, session_id, status, limit)
        elif op == "start_paging":
            self.start_paging(tenant, session_id, status, min(limit, 2))
        elif op == "next_page":
            self.next_page()
        elif op == "get_session":
            self.get_session(tenant, session_id or SESSION_IDS[0])
        else:
            self.list_all_sessions(tenant, min(limit, 3))

    # -- the calls ----------------------------------------------------------------------------

    def put_run(
        self,
        tenant: str,
        run_id: str,
        session_id: str | None,
        status: RunStatus,
        data: dict[str, Any],
        version: int | str,
    ) -> None:
        if version == "current":
            row = self.model.runs.get((tenant, run_id))
            version = 0 if row is None else row.version
        record = RunRecord(
            tenant=tenant,
            run_id=run_id,
            session_id=session_id,
            status=status,
            data=data,
            version=int(version),
        )
        outcome, values = self.compare(
            f"put_run({record!r})",
            lambda store: store.put_run(record),
            lambda: self.model.put_run(record),
            run_form,
        )
        if outcome.ok:
            self.watch_runs(values, created=record.version == 0)

    def get_run(self, tenant: str, run_id: str) -> None:
        _, values = self.compare(
            f"get_run({tenant!r}, {run_id!r})",
            lambda store: store.get_run(tenant, run_id),
            lambda: self.model.get_run(tenant, run_id),
            run_form,
        )
        self.watch_runs(values)

    def patch_run(
        self,
        tenant: str,
        run_id: str,
        input_tokens: int,
        output_tokens: int,
        cost: str,
        iterations: int,
        cursor: int,
    ) -> None:
        add = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cost": int(Decimal(cost) * COST_SCALE),
            "iterations": iterations,
            "cursor": cursor,
        }
        _, values = self.compare(
            f"patch_run({tenant!r}, {run_id!r}, {add})",
            lambda store: store.patch_run(
                tenant,
                run_id,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cost=Decimal(cost),
                iterations=iterations,
                cursor=cursor,
            ),
            lambda: self.model.patch_run(tenant, run_id, add),
            run_form,
        )
        self.watch_runs(values)

    def delete_run(self, tenant: str, run_id: str) -> None:
        outcome, _ = self.compare(
            f"delete_run({tenant!r}, {run_id!r})",
            lambda store: store.delete_run(tenant, run_id),
            lambda: self.model.delete_run(tenant, run_id),
        )
        if outcome.ok and outcome.value:
            for watch in self.watch.values():
                watch.deleted(tenant, run_id)

    def list_all_runs(
        self, tenant: str, session_id: str | None, status: RunStatus | None, limit: int
    ) -> None:
        """Every page of a listing, each store following its own cursors."""

        def walk(store: Any) -> Awaitable[list[Page[RunRecord]]]:
            return walk_pages(
                lambda after: store.list_runs(
                    tenant, session_id=session_id, status=status, limit=limit, after=after
                )
            )

        _, values = self.compare(
            f"list_runs({tenant!r}, session_id={session_id!r}, status={status!r}, "
            f"limit={limit}), every page",
            walk,
            lambda: walk_model_pages(
                lambda after: self.model.list_runs(tenant, session_id, status, limit, after)
            ),
            lambda pages: [page_form(page) for page in pages],
        )
        for who, pages in values.items():
            if pages is not None:
                for page in pages:
                    self.watch_runs({who: page.items})

    def start_paging(
        self, tenant: str, session_id: str | None, status: RunStatus | None, limit: int
    ) -> None:
        """A first page; later steps go on from its cursor while other rules change runs."""
        outcome, values = self.compare(
            f"list_runs({tenant!r}, session_id={session_id!r}, status={status!r}, "
            f"limit={limit}), first page",
            lambda store: store.list_runs(
                tenant, session_id=session_id, status=status, limit=limit
            ),
            lambda: self.model.list_runs(tenant, session_id, status, limit, None),
            page_form,
        )
        self.paging.clear()
        if outcome.ok and values["real"].next is not None:
            for who, page in values.items():
                self.paging[who] = (tenant, session_id, status, limit, page.next)

    def next_page(self) -> None:
        if not self.paging:
            return
        tenant, session_id, status, limit, _ = self.paging["real"]
        cursors = {who: state[4] for who, state in self.paging.items()}

        def call(store: Any) -> Awaitable[Page[RunRecord]]:
            who = "real" if store is self.real else "ref"
            return store.list_runs(  # type: ignore[no-any-return]
                tenant, session_id=session_id, status=status, limit=limit, after=cursors[who]
            )

        outcome, values = self.compare(
            f"list_runs({tenant!r}, session_id={session_id!r}, status={status!r}, "
            f"limit={limit}), next page after changes",
            call,
            lambda: self.model.list_runs(tenant, session_id, status, limit, cursors["model"]),
            page_form,
        )
        self.paging.clear()
        if outcome.ok and values["real"].next is not None:
            for who, page in values.items():
                self.paging[who] = (tenant, session_id, status, limit, page.next)

    def put_session(
        self, tenant: str, session_id: str, data: dict[str, Any], version: int | str
    ) -> None:
        if version == "current":
            row = self.model.sessions.get((tenant, session_id))
            version = 0 if row is None else row.version
        record = SessionRecord(
            tenant=tenant, session_id=session_id, data=data, version=int(version)
        )
        outcome, values = self.compare(
            f"put_session({record!r})",
            lambda store: store.put_session(record),
            lambda: self.model.put_session(record),
            session_form,
        )
        if outcome.ok:
            for who, value in values.items():
                self.watch[who].saw("session", value, created=record.version == 0)

    def get_session(self, tenant: str, session_id: str) -> None:
        self.compare(
            f"get_session({tenant!r}, {session_id!r})",
            lambda store: store.get_session(tenant, session_id),
            lambda: self.model.get_session(tenant, session_id),
            session_form,
        )

    def list_all_sessions(self, tenant: str, limit: int) -> None:
        _, values = self.compare(
            f"list_sessions({tenant!r}, limit={limit}), every page",
            lambda store: walk_pages(
                lambda after: store.list_sessions(tenant, limit=limit, after=after)
            ),
            lambda: walk_model_pages(lambda after: self.model.list_sessions(tenant, limit, after)),
            lambda pages: [page_form(page) for page in pages],
        )
        for who, pages in values.items():
            for page in pages or []:
                for record in page.items:
                    self.watch[who].saw("session", record)


def test_state_store_agrees_with_memory_and_the_model(model_backing: Backing) -> None:
    """Every backing answers random StateStore operations as memory and the plain model do."""
    run_machine(StateMachine, model_backing, SETTINGS)
