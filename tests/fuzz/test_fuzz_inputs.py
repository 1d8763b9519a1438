"""Bad input, fuzzed: every public call of ``StateStore``, ``WorkQueue`` and
``TransactionManager``, on every backing, with arguments Hypothesis makes up.

The promise under test (the protocols' docstrings, DESIGN section 2): a call
either succeeds, or raises a documented statepact error, or ``ValueError`` /
``TypeError`` whose message starts with the field it refuses, and never a
driver's exception (nor an "unavailable" error: the servers are up, so one
would be a driver error in disguise). A refused call changes nothing: the
store's observable state (read through the public API) and, on a server, every
key or row are compared before and after.

What is thrown at the calls: ids of any Unicode (NUL, lone surrogates, quotes,
``'; DROP TABLE``, key-codec and glob metacharacters, right-to-left marks) and
at and around the 1 KiB id limit in 1-, 2- and 4-byte characters; blobs and
payloads nested around the 128-level limit, thousands of keys wide, serialized
at ``max_value_bytes - 3`` to ``+ 3`` bytes, holding NaN, infinities, integers
past 128 bits, non-string keys, bytes, sets, Decimals, datetimes, and built of
every kind of mapping and sequence (``MappingProxyType``, ``OrderedDict``,
``defaultdict``, ``UserDict``, ``ChainMap``, tuples, ``deque``, ``UserList``)
with ``str``/``int``/``float`` subclasses and enum members at the leaves and
the JSON rule's table (``statepact.testing._inputs``) mixed in, in blobs,
payloads, transaction values and metadata alike; costs with huge and tiny
exponents (``"1e999999999"``), under a decimal context the caller set (low
precision, trapped ``Inexact``/``Rounded``, a tiny ``Emax``), where a patch
that succeeds must have added exactly its deltas; counters,
priorities, limits, tokens and versions that are negative, zero, huge (past
BIGINT) or of the wrong type; durations negative, zero, NaN, infinite, past ten
years, or not durations; records and leases built with ``model_construct`` or
``model_copy``, which skip pydantic's checks, as a careless caller's would.

Budget: ``EXAMPLES`` (60) Hypothesis examples per public call per backing; a
call listed under one test (``settle`` covers heartbeat, ack, fail and release)
is parametrized so each gets its own 60. No deadline; the store of a test is
shared by its examples (each compares its own before and after).
"""

from __future__ import annotations

import decimal
import json
import types
from collections import ChainMap, OrderedDict, UserDict, UserList, defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from decimal import Context, Decimal, localcontext
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from statepact._codec import MAX_DEPTH, MAX_ID_BYTES
from statepact._limits import DEFAULT_MAX_VALUE_BYTES
from statepact.errors import QueueUnavailableError, StatepactError, StatePersistenceError
from statepact.models import ItemStatus, RunRecord, RunStatus, SessionRecord, WorkItem
from statepact.queue import WorkQueue
from statepact.state import StateStore
from statepact.testing._inputs import (
    ACCEPTED_JSON,
    HOSTILE_DECIMAL_CONTEXTS,
    REFUSED_JSON,
    Colour,
    LyingFloat,
    LyingInt,
    LyingText,
    Mood,
    assert_plain_json,
)
from statepact.tx import Isolation, LockMode, TransactionManager
from statepact.tx import Lease as TxLease
from tests.fuzz.conftest import (
    SEED_KEYS,
    SEED_RESOURCES,
    SEED_RUNS,
    SEED_SESSIONS,
    SEED_TENANTS,
    Target,
)
from tests.model._harness import raw_changes

EXAMPLES = 60
LIMIT = DEFAULT_MAX_VALUE_BYTES  # what every fuzzed store is built with
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one seeded store per test, on purpose
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

# -- strategies ---------------------------------------------------------------------------------

# Any code point, NUL and lone surrogates included.
any_text = st.text(st.characters(exclude_categories=()), max_size=24)
TRICKY_IDS = [
    "'; DROP TABLE adk_runs; --",
    "x'); DELETE FROM statepact_values; --",
    "a'b\"c`d",
    "a:b",
    "1:a",
    "4:acme",
    "{tag}",
    "}",
    "{",
    "*",
    "?",
    "[a-z]",
    "%s",
    "%(x)s",
    "$1",
    "\\",
    "\n",
    " ",
    "--",
    "a\x00b",
    "\ud800",
    "a\udfffb",
    "\u202eevil",
    "NULL",
    "redis.call('FLUSHALL')",
    "]] .. redis.call('DEL', KEYS[1]) .. [[",
    "ü",
]
WRONG_TYPES = st.one_of(
    st.none(),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.binary(max_size=4),
    st.lists(st.text(max_size=2), max_size=2),
    st.just(b"acme"),
)


def _repeat(char: str, low: int, high: int) -> st.SearchStrategy[str]:
    return st.integers(low, high).map(lambda n: char * n)


# Around MAX_ID_BYTES (1024) in 1-, 2- and 4-byte UTF-8 characters.
LONG_IDS = st.one_of(
    _repeat("a", MAX_ID_BYTES - 2, MAX_ID_BYTES + 2),
    _repeat("é", MAX_ID_BYTES // 2 - 1, MAX_ID_BYTES // 2 + 1),
    _repeat("😀", MAX_ID_BYTES // 4 - 1, MAX_ID_BYTES // 4 + 1),
)
ids = st.one_of(any_text, st.sampled_from(TRICKY_IDS), LONG_IDS, WRONG_TYPES)
optional_ids = st.one_of(st.none(), ids)


def _nested(depth: int) -> dict[str, Any]:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"d": value}
    return {"root": value}


def _sized(size: int, char: str) -> dict[str, Any]:
    """A blob whose compact JSON is ``size`` bytes (or one less, for a 2-byte char)."""
    overhead = len(b'{"x":""}')
    return {"x": char * ((size - overhead) // len(char.encode()))}


NOT_JSON: list[Any] = [
    float("nan"),
    float("inf"),
    -float("inf"),
    2**128,
    -(2**200),
    b"bytes",
    {1, 2},
    Decimal("1.5"),
    datetime(2026, 1, 1, tzinfo=UTC),
    timedelta(seconds=1),
    object,
]


# The JSON rule's own table: every accepted and refused kind of value, as leaves.
TABLE_VALUES = [value for _, value, _ in ACCEPTED_JSON] + [value for _, value, _ in REFUSED_JSON]
odd_scalars = st.one_of(
    any_text.map(LyingText),
    st.integers().map(LyingInt),
    st.floats(allow_nan=True, allow_infinity=True).map(LyingFloat),
    st.sampled_from([*Colour, *Mood, True, False]),
    st.sampled_from([2**128 - 1, 2**128, -(2**128), 10**400, Decimal("1E+999999999")]),
)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    any_text,
    st.sampled_from(NOT_JSON),
    odd_scalars,
    st.sampled_from(TABLE_VALUES),
)
MAPPINGS: list[Callable[[dict[Any, Any]], Any]] = [
    dict,
    types.MappingProxyType,
    OrderedDict,
    lambda d: defaultdict(list, d),
    UserDict,
    lambda d: ChainMap(d, {"chained": 1}),
]
SEQUENCES: list[Callable[[list[Any]], Any]] = [list, tuple, deque, UserList]
json_keys = st.one_of(
    any_text,
    any_text.map(LyingText),
    st.integers(),
    st.none(),
    st.sampled_from([(1, 2), Colour.RED]),
)


def _made(
    makers: list[Callable[[Any], Any]], contents: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """``contents`` wrapped in one of ``makers`` (a mapping or sequence type)."""
    return st.tuples(st.sampled_from(makers), contents).map(lambda made: made[0](made[1]))


json_values = st.recursive(
    json_leaves,
    lambda kids: st.one_of(
        _made(SEQUENCES, st.lists(kids, max_size=3)),
        _made(MAPPINGS, st.dictionaries(json_keys, kids, max_size=3)),
    ),
    max_leaves=10,
)
blobs = st.one_of(
    st.dictionaries(any_text, json_values, max_size=4),
    _made(MAPPINGS, st.dictionaries(any_text, json_values, max_size=4)),
    st.integers(MAX_DEPTH - 4, MAX_DEPTH + 4).map(_nested),
    st.integers(1, 4000).map(lambda n: {f"k{i}": i for i in range(n)}),
    st.tuples(st.integers(LIMIT - 3, LIMIT + 3), st.sampled_from(["a", "é", "😀"])).map(
        lambda args: _sized(*args)
    ),
    st.sampled_from(NOT_JSON).map(lambda value: {"x": value}),
    st.sampled_from([[], "text", 1, None, [{"a": 1}], ({"a": 1},)]),
)
huge_ints = st.sampled_from([2**62 - 1, 2**62, 2**63 - 1, 2**63, 2**64, 2**100, -(2**63)])
ints = st.one_of(st.integers(-3, 3), st.integers(), huge_ints)
counts = st.one_of(
    ints,
    st.floats(allow_nan=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.booleans(),
    any_text,
    st.none(),
)
huge_exponents = st.one_of(
    st.sampled_from(
        [
            "1e999999999",
            "-1e999999999",
            "1e-999999999",
            "0e999999999",
            "1e999999999999999999999",
            Decimal("1E+999999999"),
            Decimal("1E-999999999"),
            "1." + "0" * 60 + "1",
            "4611686018.427387903",
            "4611686018.427387904",
        ]
    ),
    st.tuples(st.integers(0, 10**20), st.integers(-(10**10), 10**10)).map(
        lambda parts: f"{parts[0]}e{parts[1]}"
    ),
)
costs = st.one_of(
    counts,
    st.sampled_from(["0.000000001", "1e-10", "NaN", "-0", "Infinity", "1e30", "1_000", "٣"]),
    st.decimals(places=12),
    huge_exponents,
)
SIGNALS = [
    decimal.Inexact,
    decimal.Rounded,
    decimal.Overflow,
    decimal.Underflow,
    decimal.Subnormal,
    decimal.Clamped,
    decimal.DivisionByZero,
    decimal.InvalidOperation,
    decimal.FloatOperation,
]
ROUNDINGS = [
    decimal.ROUND_DOWN,
    decimal.ROUND_UP,
    decimal.ROUND_HALF_UP,
    decimal.ROUND_HALF_EVEN,
    decimal.ROUND_FLOOR,
    decimal.ROUND_CEILING,
    decimal.ROUND_05UP,
]
# The decimal context the caller's code runs the call in: None is the default one.
decimal_contexts = st.one_of(
    st.none(),
    st.sampled_from([context for _, context in HOSTILE_DECIMAL_CONTEXTS]),
    st.builds(
        Context,
        prec=st.integers(1, 40),
        rounding=st.sampled_from(ROUNDINGS),
        Emin=st.integers(-999_999, 0),
        Emax=st.integers(0, 999_999),
        capitals=st.integers(0, 1),
        clamp=st.integers(0, 1),
        flags=st.just([]),
        traps=st.lists(st.sampled_from(SIGNALS), unique=True),
    ),
)
durations = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.sampled_from([0, -1, 0.0, -0.0, 1e-9, 10 * 365 * 86_400, 10 * 365 * 86_400 + 1]),
    st.timedeltas(),
    st.sampled_from([timedelta(0), timedelta(seconds=-1), timedelta.max, timedelta.min]),
    any_text,
    st.none(),
    st.booleans(),
)
limits = st.one_of(st.integers(-2, 1002), st.integers(), st.floats(), st.booleans(), any_text)
cursors = st.one_of(
    st.none(),
    any_text,
    st.sampled_from(["²", "٣", "9" * 19, "9" * 20, "0" * 19, "00", "-1", "1.5", " 1", ""]),
    st.integers(),
)
statuses = st.one_of(
    st.sampled_from(list(RunStatus)), st.sampled_from(["PENDING", "Running", "done "]), ids
)
datetimes = st.one_of(
    st.datetimes(timezones=st.just(UTC)), st.datetimes(), st.none(), any_text, st.integers()
)


def build(model: type[BaseModel], fields: dict[str, Any]) -> Any:
    """The model if pydantic takes the fields, else one built with ``model_construct`` (what a
    caller skipping validation would hand over)."""
    try:
        return model(**fields)
    except ValidationError:
        return model.model_construct(**fields)


def seeded_or(values: Iterable[str], fuzzed: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Half the time an id the store holds (so the call reaches a backing), else fuzz."""
    return st.one_of(st.sampled_from(list(values)), fuzzed)


# -- the check ---------------------------------------------------------------------------------


def names_a_field(message: str, fields: set[str]) -> bool:
    """Whether an error message starts with the field it refuses (``"data['a']: ..."``,
    ``"input_tokens/output_tokens/...: ..."``)."""
    head = message.split(":", 1)[0].split("[", 1)[0]
    return bool(head) and all(part.split(".", 1)[0] in fields for part in head.split("/"))


async def _in(context: Context | None, call: Callable[[], Awaitable[Any]]) -> Any:
    """Make the call as caller code running under ``context`` would (None: the default)."""
    if context is None:
        return await call()
    with localcontext(context):
        return await call()


def check(
    target: Target[Any],
    call: Callable[[], Awaitable[Any]],
    *,
    fields: set[str],
    observe: Callable[[], Awaitable[Any]],
    what: str,
    context: Context | None = None,
    succeeded: Callable[[Any, Any], None] | None = None,
) -> bool:
    """Make the call (under the caller's decimal ``context``); it must succeed or be refused as
    documented, and a refusal must leave the store as it was. ``succeeded(before, result)``
    checks what a successful call did. Returns whether the call succeeded."""
    before = target.run(observe())
    raw_before = None if target.raw is None else target.run(target.raw())
    try:
        result = target.run(_in(context, call))
    except (StatePersistenceError, QueueUnavailableError) as exc:
        if isinstance(exc, QueueUnavailableError) or exc.reason == "unavailable":
            pytest.fail(
                f"{target.backing}: {what} raised {type(exc).__name__} with the server up "
                f"(a driver error in disguise?): {exc}"
            )
        refused: BaseException = exc
    except StatepactError as exc:
        refused = exc
    except (ValueError, TypeError) as exc:
        assert not isinstance(exc, ValidationError) or names_a_field(str(exc), fields), (
            f"{target.backing}: {what} raised pydantic's ValidationError: {exc}"
        )
        assert names_a_field(str(exc), fields), (
            f"{target.backing}: {what} raised {type(exc).__name__} that does not start with "
            f"the field it refuses (one of {sorted(fields)}): {exc!r}"
        )
        refused = exc
    except Exception as exc:
        pytest.fail(
            f"{target.backing}: {what} let {type(exc).__module__}.{type(exc).__name__} out: {exc!r}"
        )
    else:
        if succeeded is not None:
            succeeded(before, result)
        return True
    after = target.run(observe())
    assert after == before, (
        f"{target.backing}: {what} was refused ({type(refused).__name__}: {refused}) "
        "but the store's observable state changed"
    )
    if target.raw is not None:
        assert raw_before is not None
        changed = raw_changes(raw_before, target.run(target.raw()))
        assert not changed, (
            f"{target.backing}: {what} was refused ({type(refused).__name__}: {refused}) "
            f"but keys/rows changed: {', '.join(changed[:10])}"
        )
    return False


def _valid_id(value: Any) -> bool:
    if not isinstance(value, str) or not value or "\x00" in value:
        return False
    try:
        return len(value.encode("utf-8")) <= MAX_ID_BYTES
    except UnicodeEncodeError:
        return False


def prior_run(before: Any, tenant: str, run_id: str) -> RunRecord:
    """The run as ``state_observer`` saw it before the call."""
    return next(
        run
        for seen_tenant, runs, _ in before
        if seen_tenant == tenant
        for run in runs
        if run.run_id == run_id
    )


def stored_as_returned(target: Target[StateStore], written: RunRecord) -> None:
    """A successful write returned plain JSON, and a read (in the default context) gives the
    same record back."""
    assert_plain_json(written.data, "data")
    assert target.run(target.store.get_run(written.tenant, written.run_id)) == written


# -- StateStore ---------------------------------------------------------------------------------


def state_observer(target: Target[StateStore], *extra_tenants: Any) -> Callable[[], Awaitable[Any]]:
    """Every run and session of the seeded tenants (and of any valid tenant the call named)."""
    store = target.store
    tenants = [*SEED_TENANTS, *(t for t in extra_tenants if _valid_id(t))]

    async def observe() -> Any:
        seen = []
        for tenant in tenants:
            runs = (await store.list_runs(tenant, limit=1000)).items
            sessions = (await store.list_sessions(tenant, limit=1000)).items
            seen.append((tenant, runs, sessions))
        return seen

    return observe


@FUZZ
@given(
    op=st.sampled_from(["get_run", "delete_run", "get_session"]),
    tenant=seeded_or(SEED_TENANTS, ids),
    record_id=seeded_or([*SEED_RUNS, *SEED_SESSIONS], ids),
    context=decimal_contexts,
)
def test_state_reads_and_deletes(
    fuzz_state: Target[StateStore], op: str, tenant: Any, record_id: Any, context: Any
) -> None:
    store = fuzz_state.store
    call = {
        "get_run": lambda: store.get_run(tenant, record_id),
        "delete_run": lambda: store.delete_run(tenant, record_id),
        "get_session": lambda: store.get_session(tenant, record_id),
    }[op]
    check(
        fuzz_state,
        call,
        fields={"tenant", "run_id", "session_id"},
        observe=state_observer(fuzz_state, tenant),
        what=f"{op}({tenant!r:.60}, {record_id!r:.60}) in {context!r}",
        context=context,
    )


@FUZZ
@given(
    tenant=seeded_or(SEED_TENANTS, ids),
    run_id=seeded_or(SEED_RUNS, ids),
    session_id=seeded_or(SEED_SESSIONS, optional_ids),
    status=statuses,
    data=blobs,
    version=st.one_of(st.integers(0, 3), ints, WRONG_TYPES),
    counters=st.one_of(
        st.just({}), st.fixed_dictionaries({"input_tokens": counts}, optional={"cost": costs})
    ),
    context=decimal_contexts,
)
def test_put_run(
    fuzz_state: Target[StateStore],
    tenant: Any,
    run_id: Any,
    session_id: Any,
    status: Any,
    data: Any,
    version: Any,
    counters: dict[str, Any],
    context: Any,
) -> None:
    record = build(
        RunRecord,
        {
            "tenant": tenant,
            "run_id": run_id,
            "session_id": session_id,
            "status": status,
            "data": data,
            "version": version,
            **counters,
        },
    )
    check(
        fuzz_state,
        lambda: fuzz_state.store.put_run(record),
        fields={
            "record",
            "tenant",
            "run_id",
            "session_id",
            "status",
            "data",
            "version",
            "input_tokens",
            "output_tokens",
            "cost",
            "iterations",
            "cursor",
        },
        observe=state_observer(fuzz_state, tenant),
        what=f"put_run({record!r:.300}) in {context!r}",
        context=context,
        succeeded=lambda _before, written: stored_as_returned(fuzz_state, written),
    )


@FUZZ
@given(
    record=st.one_of(
        WRONG_TYPES,
        st.just({"tenant": "acme"}),
        st.builds(SessionRecord, tenant=st.just("acme"), session_id=st.just("s9")),
    )
)
def test_put_run_with_something_else(fuzz_state: Target[StateStore], record: Any) -> None:
    check(
        fuzz_state,
        lambda: fuzz_state.store.put_run(record),
        fields={"record"},
        observe=state_observer(fuzz_state),
        what=f"put_run({record!r:.100})",
    )


@FUZZ
@given(
    tenant=seeded_or(SEED_TENANTS, ids),
    run_id=seeded_or(SEED_RUNS, ids),
    input_tokens=counts,
    output_tokens=st.one_of(st.just(0), counts),
    cost=costs,
    iterations=st.one_of(st.just(0), counts),
    cursor=st.one_of(st.just(0), counts),
    context=decimal_contexts,
)
def test_patch_run(
    fuzz_state: Target[StateStore],
    tenant: Any,
    run_id: Any,
    input_tokens: Any,
    output_tokens: Any,
    cost: Any,
    iterations: Any,
    cursor: Any,
    context: Any,
) -> None:
    deltas = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "iterations": iterations,
        "cursor": cursor,
    }

    def added_exactly(before: Any, patched: RunRecord) -> None:
        """A patch that succeeded added exactly its deltas, the cost to the last 1e-9."""
        prior = prior_run(before, tenant, run_id)
        with localcontext(Context(prec=80)):
            assert patched.cost == prior.cost + Decimal(cost), (prior.cost, cost, patched.cost)
        for name, delta in deltas.items():
            assert getattr(patched, name) == getattr(prior, name) + delta, name
        assert patched.version == prior.version + 1
        stored_as_returned(fuzz_state, patched)

    check(
        fuzz_state,
        lambda: fuzz_state.store.patch_run(
            tenant,
            run_id,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost=cost,
            iterations=iterations,
            cursor=cursor,
        ),
        fields={
            "tenant",
            "run_id",
            "input_tokens",
            "output_tokens",
            "cost",
            "iterations",
            "cursor",
        },
        observe=state_observer(fuzz_state, tenant),
        what=(
            f"patch_run({tenant!r:.60}, {run_id!r:.60}, input_tokens={input_tokens!r}, "
            f"output_tokens={output_tokens!r}, cost={cost!r}, iterations={iterations!r}, "
            f"cursor={cursor!r}) in {context!r}"
        ),
        context=context,
        succeeded=added_exactly,
    )


@FUZZ
@given(
    op=st.sampled_from(["list_runs", "list_sessions"]),
    tenant=seeded_or(SEED_TENANTS, ids),
    session_id=seeded_or(SEED_SESSIONS, optional_ids),
    status=st.one_of(st.none(), statuses),
    limit=limits,
    after=cursors,
    context=decimal_contexts,
)
def test_listings(
    fuzz_state: Target[StateStore],
    op: str,
    tenant: Any,
    session_id: Any,
    status: Any,
    limit: Any,
    after: Any,
    context: Any,
) -> None:
    store = fuzz_state.store
    call: Callable[[], Awaitable[Any]]
    if op == "list_runs":
        call = lambda: store.list_runs(  # noqa: E731
            tenant, session_id=session_id, status=status, limit=limit, after=after
        )
    else:
        call = lambda: store.list_sessions(tenant, limit=limit, after=after)  # noqa: E731
    check(
        fuzz_state,
        call,
        fields={"tenant", "session_id", "status", "limit", "after"},
        observe=state_observer(fuzz_state, tenant),
        what=(
            f"{op}({tenant!r:.60}, session_id={session_id!r:.60}, status={status!r:.60}, "
            f"limit={limit!r}, after={after!r:.60}) in {context!r}"
        ),
        context=context,
    )


@FUZZ
@given(
    tenant=seeded_or(SEED_TENANTS, ids),
    session_id=seeded_or(SEED_SESSIONS, ids),
    data=blobs,
    version=st.one_of(st.integers(0, 3), ints, WRONG_TYPES),
)
def test_put_session(
    fuzz_state: Target[StateStore], tenant: Any, session_id: Any, data: Any, version: Any
) -> None:
    record = build(
        SessionRecord,
        {"tenant": tenant, "session_id": session_id, "data": data, "version": version},
    )
    check(
        fuzz_state,
        lambda: fuzz_state.store.put_session(record),
        fields={"record", "tenant", "session_id", "data", "version"},
        observe=state_observer(fuzz_state, tenant),
        what=f"put_session({record!r:.300})",
    )


exact_costs = st.decimals(min_value=0, max_value=Decimal("4611686018.427387903"), places=9)
hostile_contexts = st.one_of(
    st.sampled_from([context for _, context in HOSTILE_DECIMAL_CONTEXTS]),
    decimal_contexts.filter(lambda context: context is not None),
)


@FUZZ
@given(
    op=st.sampled_from(["patch_run", "get_run", "list_runs"]),
    tenant=st.sampled_from(SEED_TENANTS),
    run_id=st.sampled_from(SEED_RUNS),
    cost=st.one_of(exact_costs, exact_costs.map(str), huge_exponents, costs),
    context=hostile_contexts,
)
def test_costs_under_the_callers_decimal_context(
    fuzz_state: Target[StateStore], op: str, tenant: str, run_id: str, cost: Any, context: Any
) -> None:
    """Seeded runs, read and patched under a decimal context the caller set: a read returns
    the exact cost, a patch adds exactly its cost or is refused naming cost, writing nothing."""
    store = fuzz_state.store

    def exact(before: Any, result: Any) -> None:
        prior = prior_run(before, tenant, run_id)
        if op == "patch_run":
            with localcontext(Context(prec=80)):
                assert result.cost == prior.cost + Decimal(cost), (prior.cost, cost, result)
            assert result.version == prior.version + 1
            stored_as_returned(fuzz_state, result)
        elif op == "get_run":
            assert result == prior
        else:
            assert prior in result.items

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "patch_run": lambda: store.patch_run(tenant, run_id, cost=cost, iterations=1),
        "get_run": lambda: store.get_run(tenant, run_id),
        "list_runs": lambda: store.list_runs(tenant),
    }
    check(
        fuzz_state,
        calls[op],
        fields={"cost"},
        observe=state_observer(fuzz_state),
        what=f"{op}({tenant!r}, {run_id!r}, cost={cost!r:.80}) in {context!r}",
        context=context,
        succeeded=exact,
    )


@FUZZ
@given(kind=st.sampled_from(["run", "session"]), data=blobs)
def test_every_kind_of_value_in_a_blob(
    fuzz_state: Target[StateStore], kind: str, data: Any
) -> None:
    """A new run's or session's blob built of any mapping, sequence and scalar kind: stored as
    plain JSON, or refused with ValueError naming the path, writing nothing."""
    store = fuzz_state.store
    fresh = f"fresh-{fuzz_state.clock.advance(1).timestamp():.0f}"
    record = RunRecord.model_construct(tenant="acme", run_id=fresh, data=data)
    session = SessionRecord.model_construct(tenant="acme", session_id=fresh, data=data)

    async def call() -> Any:
        return await (store.put_run(record) if kind == "run" else store.put_session(session))

    def succeeded(_before: Any, written: Any) -> None:
        assert_plain_json(written.data, "data")
        read = store.get_run if kind == "run" else store.get_session
        assert fuzz_state.run(read("acme", fresh)) == written

    check(
        fuzz_state,
        call,
        fields={"data"},
        observe=state_observer(fuzz_state),
        what=f"put_{kind}(data={data!r:.300})",
        succeeded=succeeded,
    )


# -- WorkQueue ----------------------------------------------------------------------------------


def enqueued_as_returned(target: Target[WorkQueue], stored: WorkItem) -> None:
    """A successful enqueue returned a plain JSON payload, and get_item gives the same back."""
    assert_plain_json(stored.payload, "payload")
    found = target.run(target.store.get_item(stored.tenant, stored.item_id))
    assert found is not None and found.payload == stored.payload


def batch_enqueued_as_returned(
    target: Target[WorkQueue], items: list[Any], stored: list[WorkItem]
) -> None:
    """A successful enqueue_many answered every item, in order, each as get_item reads it."""
    assert [(s.tenant, s.item_id) for s in stored] == [(i.tenant, i.item_id) for i in items]
    for record in stored:
        enqueued_as_returned(target, record)


def queue_observer(target: Target[WorkQueue], *items: Any) -> Callable[[], Awaitable[Any]]:
    """Stats, every seeded tenant's dead letters and every item the test knows of."""
    queue = target.store
    known = [(t, f"seed-{i}") for t in SEED_TENANTS for i in range(3)]
    known += [
        (item.tenant, item.item_id)
        for item in items
        if isinstance(item, WorkItem) and _valid_id(item.tenant) and _valid_id(item.item_id)
    ]

    async def observe() -> Any:
        dead = [await queue.dead_letters(tenant, limit=1000) for tenant in SEED_TENANTS]
        found = [await queue.get_item(tenant, item_id) for tenant, item_id in known]
        return (await queue.stats(), dead, found)

    return observe


@FUZZ
@given(
    tenant=seeded_or(SEED_TENANTS, ids),
    item_id=seeded_or(["seed-1", "fresh"], ids),
    payload=blobs,
    priority=st.one_of(st.integers(-1001, 1001), ints, WRONG_TYPES),
    queue_name=st.one_of(st.none(), st.just("default"), ids),
    delay=st.one_of(st.none(), durations),
)
def test_enqueue(
    fuzz_queue: Target[WorkQueue],
    tenant: Any,
    item_id: Any,
    payload: Any,
    priority: Any,
    queue_name: Any,
    delay: Any,
) -> None:
    item = build(
        WorkItem,
        {
            "tenant": tenant,
            "item_id": item_id,
            "payload": payload,
            "priority": priority,
            "queue": queue_name,
        },
    )
    check(
        fuzz_queue,
        lambda: fuzz_queue.store.enqueue(item, delay=delay),
        fields={"item", "tenant", "item_id", "payload", "priority", "queue", "delay"},
        observe=queue_observer(fuzz_queue, item),
        what=f"enqueue({item!r:.300}, delay={delay!r})",
        succeeded=lambda _before, stored: enqueued_as_returned(fuzz_queue, stored),
    )


fuzzed_items = st.builds(
    lambda tenant, item_id, payload, priority: build(
        WorkItem, {"tenant": tenant, "item_id": item_id, "payload": payload, "priority": priority}
    ),
    tenant=seeded_or(SEED_TENANTS, ids),
    item_id=seeded_or(["seed-1", "fresh", "fresh-2"], ids),
    payload=blobs,
    priority=st.one_of(st.integers(-1001, 1001), WRONG_TYPES),
)


@FUZZ
@given(
    items=st.lists(st.one_of(fuzzed_items, WRONG_TYPES), min_size=0, max_size=4),
    delay=st.one_of(st.none(), durations),
)
def test_enqueue_many(fuzz_queue: Target[WorkQueue], items: list[Any], delay: Any) -> None:
    """A batch of fuzzed items (repeats, wrong types, an empty batch): stored whole as
    returned, or refused naming ``items`` with nothing of it stored."""
    check(
        fuzz_queue,
        lambda: fuzz_queue.store.enqueue_many(items, delay=delay),
        fields={"items", "delay"},
        observe=queue_observer(fuzz_queue, *items),
        what=f"enqueue_many({items!r:.300}, delay={delay!r})",
        succeeded=lambda _before, stored: batch_enqueued_as_returned(fuzz_queue, items, stored),
    )


@FUZZ
@given(
    batch=st.booleans(),
    worker_id=st.one_of(st.just("w1"), ids),
    lease_for=durations,
    limit=limits,
)
def test_claim(
    fuzz_queue: Target[WorkQueue], batch: bool, worker_id: Any, lease_for: Any, limit: Any
) -> None:
    queue = fuzz_queue.store
    fuzz_queue.run(queue.enqueue(WorkItem(tenant="acme", item_id=f"c-{fuzz_queue.clock.now()}")))
    fuzz_queue.clock.advance(1)
    call: Callable[[], Awaitable[Any]]
    if batch:
        call = lambda: queue.claim_batch(worker_id, lease_for=lease_for, limit=limit)  # noqa: E731
    else:
        call = lambda: queue.claim(worker_id, lease_for=lease_for)  # noqa: E731
    check(
        fuzz_queue,
        call,
        fields={"worker_id", "lease_for", "limit"},
        observe=queue_observer(fuzz_queue),
        what=f"claim{'_batch' if batch else ''}({worker_id!r:.60}, {lease_for!r}, {limit!r})",
    )


forgeries = st.fixed_dictionaries(
    {},
    optional={
        "token": st.one_of(ints, WRONG_TYPES),
        "tenant": ids,
        "item_id": ids,
        "queue": st.one_of(st.none(), ids),
        "lease_seconds": durations,
        "worker_id": ids,
        "status": st.one_of(st.sampled_from(list(ItemStatus)), any_text),
        "expires_at": datetimes,
    },
)


@pytest.mark.parametrize("op", ["heartbeat", "ack", "fail", "release"])
@FUZZ
@given(
    forged=forgeries,
    error=st.one_of(any_text, st.just("e" * 5000), WRONG_TYPES),
    retryable=st.one_of(st.booleans(), WRONG_TYPES),
)
# Found by a local run: a timedelta forged into lease_seconds reached the backings, which
# build the next lease from it (a TypeError naming no field on memory).
@example(forged={"lease_seconds": timedelta(seconds=30)}, error="e", retryable=True)
@example(forged={"lease_seconds": 45}, error="e", retryable=True)
def test_settle(
    fuzz_queue: Target[WorkQueue], op: str, forged: dict[str, Any], error: Any, retryable: Any
) -> None:
    """A live lease, then the same lease with fields forged through ``model_copy``."""
    queue = fuzz_queue.store
    stamp = str(fuzz_queue.clock.advance(1))
    fuzz_queue.run(queue.enqueue(WorkItem(tenant="acme", item_id=f"s-{stamp}")))
    live = fuzz_queue.run(queue.claim("w1", lease_for=3600))
    assert live is not None
    item_fields: dict[str, Any] = {
        k: forged[k] for k in ("tenant", "item_id", "queue", "status") if k in forged
    }
    lease_fields: dict[str, Any] = {
        k: forged[k] for k in ("token", "lease_seconds", "worker_id", "expires_at") if k in forged
    }
    update: dict[str, Any] = {"item": live.item.model_copy(update=item_fields), **lease_fields}
    lease = live.model_copy(update=update)
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "heartbeat": lambda: queue.heartbeat(lease),
        "ack": lambda: queue.ack(lease),
        "fail": lambda: queue.fail(lease, error, retryable=retryable),
        "release": lambda: queue.release(lease),
    }
    check(
        fuzz_queue,
        calls[op],
        fields={"lease", "error", "retryable", "token", "lease_seconds"},
        observe=queue_observer(fuzz_queue, live.item, lease.item),
        what=f"{op}(forged {forged!r:.300}, error={error!r:.40}, retryable={retryable!r})",
    )


@pytest.mark.parametrize("op", ["dead_letters", "requeue", "get_item"])
@FUZZ
@given(
    tenant=seeded_or(SEED_TENANTS, ids),
    item_id=seeded_or(["seed-0", "seed-1"], ids),
    limit=st.one_of(st.just(100), limits),
)
def test_inspect_and_recover(
    fuzz_queue: Target[WorkQueue], op: str, tenant: Any, item_id: Any, limit: Any
) -> None:
    queue = fuzz_queue.store
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "dead_letters": lambda: queue.dead_letters(tenant, limit=limit),
        "requeue": lambda: queue.requeue(build(WorkItem, {"tenant": tenant, "item_id": item_id})),
        "get_item": lambda: queue.get_item(tenant, item_id),
    }
    succeeded = check(
        fuzz_queue,
        calls[op],
        fields={"tenant", "item_id", "item", "limit"},
        observe=queue_observer(fuzz_queue),
        what=f"{op}({tenant!r:.60}, {item_id!r:.60}, limit={limit!r})",
    )
    if op == "requeue" and succeeded:
        # Put the seeded dead item back where it was, for the next example.
        lease = fuzz_queue.run(queue.claim("w1", lease_for=60))
        assert lease is not None
        fuzz_queue.run(queue.fail(lease, "again", retryable=False))


@FUZZ
@given(
    item=st.one_of(
        WRONG_TYPES, st.just({"tenant": "acme"}), st.just(RunRecord(tenant="a", run_id="b"))
    )
)
def test_queue_calls_with_something_else(fuzz_queue: Target[WorkQueue], item: Any) -> None:
    queue = fuzz_queue.store
    for name, call in (
        ("enqueue", lambda: queue.enqueue(item)),
        ("requeue", lambda: queue.requeue(item)),
        ("heartbeat", lambda: queue.heartbeat(item)),
        ("ack", lambda: queue.ack(item)),
        ("fail", lambda: queue.fail(item, "x")),
        ("release", lambda: queue.release(item)),
    ):
        assert not check(
            fuzz_queue,
            call,
            fields={"item", "lease"},
            observe=queue_observer(fuzz_queue),
            what=f"{name}({item!r:.80})",
        )


@FUZZ
@given(payload=blobs)
def test_every_kind_of_value_in_a_payload(fuzz_queue: Target[WorkQueue], payload: Any) -> None:
    """A new item's payload built of any mapping, sequence and scalar kind: stored as plain
    JSON, or refused with ValueError naming the path, storing nothing."""
    fresh = f"fresh-{fuzz_queue.clock.advance(1).timestamp():.0f}"
    item = WorkItem.model_construct(tenant="acme", item_id=fresh, payload=payload)
    check(
        fuzz_queue,
        lambda: fuzz_queue.store.enqueue(item),
        fields={"payload"},
        observe=queue_observer(fuzz_queue, item),
        what=f"enqueue(payload={payload!r:.300})",
        succeeded=lambda _before, stored: enqueued_as_returned(fuzz_queue, stored),
    )


# -- TransactionManager -------------------------------------------------------------------------


def tx_observer(target: Target[TransactionManager]) -> Callable[[], Awaitable[Any]]:
    """The seeded keys' latest values and history, the registry, and the seeded lease."""
    manager = target.store

    async def observe() -> Any:
        async with manager.transaction(isolation="read_committed") as tx:
            values = [await tx.read(r, k) for r in SEED_RESOURCES for k in SEED_KEYS]
        history = [await manager.history(r, k, 50) for r in SEED_RESOURCES for k in SEED_KEYS]
        info = [await manager.resource_info(r) for r in SEED_RESOURCES]
        return (values, history, info)

    return observe


async def _read_back(manager: TransactionManager, resource: str, key: str) -> Any:
    async with manager.transaction(isolation="read_committed") as tx:
        return await tx.read(resource, key)


tx_leases = st.builds(
    TxLease,
    resource=seeded_or(SEED_RESOURCES, ids),
    owner=st.one_of(st.just("seeder"), ids),
    token=st.one_of(st.integers(0, 3), ints, WRONG_TYPES),
    expires_at=datetimes,
    ttl=durations,
)


@FUZZ
@given(
    isolation=st.one_of(st.sampled_from(list(Isolation)), any_text, WRONG_TYPES),
    idempotency_key=st.one_of(st.none(), ids),
    fencing=st.one_of(st.none(), tx_leases, WRONG_TYPES),
)
def test_transaction_arguments(
    fuzz_tx: Target[TransactionManager], isolation: Any, idempotency_key: Any, fencing: Any
) -> None:
    manager = fuzz_tx.store

    async def call() -> None:
        async with manager.transaction(isolation, idempotency_key, fencing) as tx:
            tx.write("fuzz", "k", {"at": str(fuzz_tx.clock.now())})

    fuzz_tx.clock.advance(1)
    check(
        fuzz_tx,
        call,
        fields={"isolation", "idempotency_key", "fencing"},
        observe=tx_observer(fuzz_tx),
        what=f"transaction({isolation!r:.60}, {idempotency_key!r:.60}, {fencing!r:.200})",
    )


@pytest.mark.parametrize("op", ["read", "write", "delete", "lock"])
@FUZZ
@given(
    resource=seeded_or(SEED_RESOURCES, ids),
    key=seeded_or(SEED_KEYS, ids),
    value=st.one_of(json_values, blobs),
    mode=st.one_of(st.sampled_from(list(LockMode)), any_text, WRONG_TYPES),
    timeout=st.one_of(st.none(), st.just(0), durations),
)
def test_transaction_steps(
    fuzz_tx: Target[TransactionManager],
    op: str,
    resource: Any,
    key: Any,
    value: Any,
    mode: Any,
    timeout: Any,
) -> None:
    """One step in a transaction; it commits when the step was accepted, and a value written
    reads back as plain JSON."""
    manager = fuzz_tx.store

    def written_plain(_before: Any, _result: Any) -> None:
        if op == "write":
            assert_plain_json(fuzz_tx.run(_read_back(manager, resource, key)), "value")

    async def call() -> None:
        async with manager.transaction(isolation="serializable") as tx:
            if op == "read":
                await tx.read(resource, key)
            elif op == "write":
                tx.write(resource, key, value)
            elif op == "delete":
                tx.delete(resource, key)
            else:
                await tx.lock(resource, key, mode, timeout=timeout)

    check(
        fuzz_tx,
        call,
        fields={"resource", "key", "value", "mode", "timeout"},
        observe=tx_observer(fuzz_tx),
        what=(
            f"{op}({resource!r:.60}, {key!r:.60}, value={value!r:.100}, mode={mode!r:.40}, "
            f"timeout={timeout!r})"
        ),
        succeeded=written_plain,
    )


@pytest.mark.parametrize("op", ["acquire_lease", "renew_lease", "release_lease"])
@FUZZ
@given(
    resource=seeded_or(SEED_RESOURCES, ids),
    owner=st.one_of(st.just("seeder"), ids),
    ttl=st.one_of(st.just(5), durations),
    lease=st.one_of(tx_leases, WRONG_TYPES),
)
def test_leases(
    fuzz_tx: Target[TransactionManager], op: str, resource: Any, owner: Any, ttl: Any, lease: Any
) -> None:
    manager = fuzz_tx.store
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "acquire_lease": lambda: manager.acquire_lease(resource, owner, ttl),
        "renew_lease": lambda: manager.renew_lease(lease, ttl),
        "release_lease": lambda: manager.release_lease(lease),
    }
    check(
        fuzz_tx,
        calls[op],
        fields={"resource", "owner", "ttl", "lease", "token", "expires_at"},
        observe=tx_observer(fuzz_tx),
        what=f"{op}({resource!r:.60}, {owner!r:.60}, ttl={ttl!r}, lease={lease!r:.200})",
    )


@pytest.mark.parametrize("op", ["history", "register_resource", "resource_info", "run"])
@FUZZ
@given(
    resource=seeded_or(SEED_RESOURCES, ids),
    key=seeded_or(SEED_KEYS, ids),
    limit=st.one_of(st.just(10), limits),
    metadata=st.one_of(st.none(), blobs),
    retries=st.one_of(st.integers(-2, 2), WRONG_TYPES),
)
def test_history_registry_and_run(
    fuzz_tx: Target[TransactionManager],
    op: str,
    resource: Any,
    key: Any,
    limit: Any,
    metadata: Any,
    retries: Any,
) -> None:
    manager = fuzz_tx.store

    async def fn(tx: Any) -> None:
        tx.write(resource, key, {"by": "run"})

    def registered_plain(_before: Any, _result: Any) -> None:
        if op == "register_resource":
            info = fuzz_tx.run(manager.resource_info(resource))
            assert info is not None
            assert_plain_json(info.metadata, "metadata")

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "history": lambda: manager.history(resource, key, limit),
        "register_resource": lambda: manager.register_resource(resource, metadata),
        "resource_info": lambda: manager.resource_info(resource),
        "run": lambda: manager.run(fn, retries=retries),
    }
    check(
        fuzz_tx,
        calls[op],
        fields={"resource", "key", "name", "limit", "metadata", "retries"},
        observe=tx_observer(fuzz_tx),
        what=(
            f"{op}({resource!r:.60}, {key!r:.60}, limit={limit!r}, "
            f"metadata={metadata!r:.100}, retries={retries!r})"
        ),
        succeeded=registered_plain,
    )


@FUZZ
@given(where=st.sampled_from(["value", "metadata"]), value=st.one_of(json_values, blobs))
def test_every_kind_of_value_in_a_transaction(
    fuzz_tx: Target[TransactionManager], where: str, value: Any
) -> None:
    """A transaction value (any JSON value) or resource metadata (an object) built of any
    mapping, sequence and scalar kind: stored as plain JSON, or refused naming the path."""
    manager = fuzz_tx.store

    async def write() -> None:
        async with manager.transaction() as tx:
            tx.write(SEED_RESOURCES[0], SEED_KEYS[0], value)

    def stored_plain(_before: Any, _result: Any) -> None:
        if where == "value":
            found = fuzz_tx.run(_read_back(manager, SEED_RESOURCES[0], SEED_KEYS[0]))
            assert_plain_json(found, "value")
        else:
            info = fuzz_tx.run(manager.resource_info(SEED_RESOURCES[1]))
            assert info is not None
            assert_plain_json(info.metadata, "metadata")

    fuzz_tx.clock.advance(1)
    check(
        fuzz_tx,
        write if where == "value" else lambda: manager.register_resource(SEED_RESOURCES[1], value),
        fields={where},
        observe=tx_observer(fuzz_tx),
        what=f"{where}={value!r:.300}",
        succeeded=stored_plain,
    )


def test_the_budget_is_what_the_docstring_says() -> None:
    """The module docstring states the budget; keep them in step."""
    assert f"``EXAMPLES`` ({EXAMPLES})" in (__doc__ or "")
    assert len(json.dumps(_sized(LIMIT, "a"), separators=(",", ":")).encode()) == LIMIT
