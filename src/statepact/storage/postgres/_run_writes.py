"""``PostgresStateStore``'s run writes: a call's parameters, one write sent (a first
attempt or a resend) and read back, and several calls' writes sent together.

A run write carries a call id so the failover may send it again; the store runs
these on its executor and decides when calls share a statement. Round trips and
resends: docs/backings.md#run-writes-sent-again. Nothing here builds SQL
(``_sql/state/`` does) or retries a call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.engine import RowMapping

from statepact._codec import decimal_to_nanos, decode_json, nanos_to_decimal
from statepact._limits import MAX_COUNTER
from statepact._retry import new_op_id
from statepact.errors import RunNotFoundError
from statepact.models import RunRecord
from statepact.state import CounterDelta, CounterOverflow, RunWrite
from statepact.storage.postgres._client import (
    Executor,
    FirstAttemptCommitted,
    Runner,
    constraint_of,
    sqlstate_of,
)
from statepact.storage.postgres._direct import Prepared
from statepact.storage.postgres._sql import LOCK_NOT_AVAILABLE
from statepact.storage.postgres._sql.state import (
    COUNTERS,
    Attempts,
    CoreStatement,
    StateStatements,
)
from statepact.storage.postgres._state_support import run_record, written_or_refused
from statepact.storage.postgres.schema import WRITE_RETENTION

__all__ = [
    "EACH_PATCH",
    "EACH_UPDATE",
    "Patch",
    "Put",
    "Sql",
    "batch_rows",
    "each",
    "patch_answers",
    "patch_call",
    "patch_once",
    "put_answers",
    "put_call",
    "put_once",
    "send_write",
]

#: The store's statements: compiled for the driver on an engine, Core otherwise.
Sql = StateStatements[Prepared] | StateStatements[CoreStatement]

R = TypeVar("R")

# A batch's arrays (``p_each_<name>``), each from the same parameter of every call.
_EACH = {
    "tenant": "p_tenant",
    "run_id": "p_record_id",
    "op_id": "p_op_id",
    "at": "p_now",
    "cutoff": "p_cutoff",
}
EACH_PATCH = {
    **_EACH,
    **{name: f"p_{name}" for name in COUNTERS},
    **{f"max_{name}": f"p_max_{name}" for name in COUNTERS},
}
EACH_UPDATE = {
    **_EACH,
    "session_id": "p_session_id",
    "status": "p_status",
    "data": "p_data",
    "expected": "p_expected",
}


@dataclass(frozen=True, slots=True)
class Patch:
    """One ``patch_run`` call: its statement's parameters and the deltas it adds."""

    params: dict[str, Any]
    deltas: dict[str, int]


@dataclass(frozen=True, slots=True)
class Put:
    """One ``put_run`` call: the front's write and its statement's parameters."""

    write: RunWrite
    params: dict[str, Any]


def _call_params(now: datetime) -> dict[str, Any]:
    """A run write's call id (the same in every resend) and its sweep cutoff."""
    return {"p_op_id": new_op_id(), "p_cutoff": now - WRITE_RETENTION}


def put_call(write: RunWrite) -> Put:
    """A ``put_run`` call: its statement's parameters, with a new call id."""
    params = {
        "p_tenant": write.tenant,
        "p_record_id": write.run_id,
        "p_session_id": write.session_id,
        "p_status": write.status.value,
        "p_data": write.data.decode("utf-8"),
        "p_now": write.now,
        "p_expected": write.expected_version,
        **_call_params(write.now),
    }
    return Put(write, params)


def patch_call(tenant: str, run_id: str, delta: CounterDelta, now: datetime) -> Patch:
    """A ``patch_run`` call: each counter's delta and the most it may hold before it
    (``p_max_<counter>``), with a new call id."""
    deltas = {
        "input_tokens": delta.input_tokens,
        "output_tokens": delta.output_tokens,
        "cost": delta.cost_nanos,
        "iterations": delta.iterations,
        "cursor": delta.cursor,
    }
    params: dict[str, Any] = {
        "p_tenant": tenant,
        "p_record_id": run_id,
        "p_now": now,
        **_call_params(now),
    }
    for name, amount in deltas.items():
        room = MAX_COUNTER - amount
        if name == "cost":
            params["p_cost"] = nanos_to_decimal(amount)
            params["p_max_cost"] = nanos_to_decimal(room)
        else:
            params[f"p_{name}"] = amount
            params[f"p_max_{name}"] = room
    return Patch(params, deltas)


def each(calls: list[dict[str, Any]], names: Mapping[str, str]) -> dict[str, list[Any]]:
    """The parameters of a batch statement: one array per name, a call's value each."""
    return {f"p_each_{name}": [call[key] for call in calls] for name, key in names.items()}


async def _written(conn: Runner, statement: Any, params: Mapping[str, Any], writes_key: str) -> Any:
    """Run one write statement; its result. ``writes_key`` names the call rows' primary
    key, which a resend meets when its first attempt committed while it waited."""
    try:
        return await conn.execute(statement, params)
    except Exception as exc:
        if sqlstate_of(exc) == "23505" and constraint_of(exc) == writes_key:
            raise FirstAttemptCommitted(
                "a call's first attempt committed while its resend waited"
            ) from exc
        raise


async def _write(
    conn: Runner, statement: Any, params: Mapping[str, Any], writes_key: str
) -> RowMapping | None:
    """Run one write statement; its row, or None when it applied nothing."""
    row: RowMapping | None = (
        (await _written(conn, statement, params, writes_key)).mappings().first()
    )
    return row


async def send_write(
    executor: Executor,
    attempts: Attempts[Any],
    *,
    resent: bool,
    once: Callable[[Runner, Any], Awaitable[R]],
) -> R:
    """Run one call's write on ``executor`` (``once`` on a connection and a statement):
    the first attempt's statement, then the resend's in each attempt after it.
    ``resent``: an earlier send of this call (a batch's) may have applied it."""
    sent = 1 if resent else 0

    async def work(conn: Runner) -> R:
        nonlocal sent
        sent += 1
        # Only an attempt after the first can meet an earlier one applied.
        return await once(conn, attempts.first if sent == 1 else attempts.again)

    return await executor.run(work, idempotent=False, resend_safe=True)


async def put_once(conn: Runner, sql: Sql, call: Put, statement: Any, writes_key: str) -> RunRecord:
    """One attempt of a ``put_run`` call alone: the run written, or the conflict raised."""
    write, params = call.write, call.params

    async def written() -> RunRecord | None:
        row = await _write(conn, statement, params, writes_key)
        if row is None:
            return None
        # A write's row leaves the blob out: it is the one this call sent.
        data = write.value if row["data"] is None else decode_json(row["data"])
        return run_record(row, data)

    async def found() -> RunRecord | int | None:
        row = (await conn.execute(sql.run_after_write, params)).mappings().first()
        if row is not None and row["replayed"]:
            # The first attempt applied, then the resend lost a race to it.
            return run_record(row, decode_json(row["data"]))
        return None if row is None else int(row["version"])

    return await written_or_refused(
        written,
        found,
        kind="run",
        tenant=write.tenant,
        record_id=write.run_id,
        expected=write.expected_version,
    )


async def patch_once(
    conn: Runner, sql: Sql, call: Patch, statement: Any, writes_key: str
) -> RunRecord | CounterOverflow:
    """One attempt of a ``patch_run`` call alone: the run patched, or the counter that
    would pass its limit; a missing run raises."""
    params, deltas = call.params, call.deltas
    while True:
        row = await _write(conn, statement, params, writes_key)
        if row is not None:
            return run_record(row, decode_json(row["data"]))
        # No row: the run is missing, or a counter would pass its limit,
        # or this call's first attempt applied while the resend waited.
        found = (await conn.execute(sql.run_after_write, params)).mappings().first()
        if found is None:
            raise RunNotFoundError(tenant=params["p_tenant"], run_id=params["p_record_id"])
        if found["replayed"]:
            return run_record(found, decode_json(found["data"]))
        for name in COUNTERS:
            count = found[name]
            stored_units = decimal_to_nanos(count) if name == "cost" else count
            if stored_units + deltas[name] > MAX_COUNTER:
                return CounterOverflow(name)
        # Neither: the run changed between the two statements; apply again.


async def batch_rows(
    conn: Runner, statement: Any, params: dict[str, list[Any]], count: int, writes_key: str
) -> list[RowMapping | None]:
    """Run one batch statement of ``count`` calls' writes (``patch_runs``,
    ``update_runs``); each call's row, or None where its write applied nothing.

    Each write carries its call id and the statement skips those already applied,
    so the failover may send the batch again, as it does one write. A run row another
    session holds fails the statement at once (``shared_lock_timeout``): then no
    write applied, and each is sent again alone, where it may wait for its row.
    """
    rows: list[RowMapping | None] = [None] * count
    try:
        result = await _written(conn, statement, params, writes_key)
    except Exception as exc:
        if sqlstate_of(exc) == LOCK_NOT_AVAILABLE:
            return rows  # a run another session holds: each write alone, to wait
        raise
    for row in result.mappings().all():
        rows[row["ord"] - 1] = row
    return rows


def put_answers(calls: list[Put], rows: list[RowMapping | None]) -> list[RunRecord | None]:
    """Each ``put_run`` call's run from a batch's rows (None: its write applied nothing)."""
    # A write's row leaves the blob out: it is the one the call sent.
    return [
        None if row is None else run_record(row, call.write.value)
        for call, row in zip(calls, rows, strict=True)
    ]


def patch_answers(rows: list[RowMapping | None]) -> list[RunRecord | CounterOverflow | None]:
    """Each ``patch_run`` call's run from a batch's rows (None: its write applied nothing)."""
    return [None if row is None else run_record(row, decode_json(row["data"])) for row in rows]
