"""What ``PostgresStateStore``'s methods share: rows read back as records (a run, a
session; every row comes from the store's own tables, so every field already has its
type), and a versioned write's follow-up read.

Nothing here validates, builds SQL or retries a call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy.engine import RowMapping

from statepact._codec import decimal_to_nanos, nanos_to_decimal
from statepact.errors import StateConflictError
from statepact.models import RunRecord, RunStatus, SessionRecord, stored

__all__ = ["run_record", "session_record", "written_or_refused"]

R = TypeVar("R")


def run_record(row: RowMapping, data: Any) -> RunRecord:
    # Read from this store's own table: every field is of its type already, no validation.
    return stored(
        RunRecord,
        {
            "tenant": row["tenant"],
            "run_id": row["run_id"],
            "session_id": row["session_id"],
            "status": RunStatus(row["status"]),
            "data": data,
            "version": row["version"],
            "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"],
            "cost": _cost(row["cost"]),
            "iterations": row["iterations"],
            "cursor": row["cursor"],
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
            "seq": row["seq"],
        },
    )


def session_record(row: RowMapping, data: Any) -> SessionRecord:
    return SessionRecord.model_construct(
        tenant=row["tenant"],
        session_id=row["session_id"],
        data=data,
        version=row["version"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        seq=row["seq"],
    )


def _cost(value: Decimal) -> Decimal:
    # NUMERIC(38,9) already has nine places; normalise the exponent like memory does.
    return nanos_to_decimal(decimal_to_nanos(value))


async def written_or_refused(
    write: Callable[[], Awaitable[R | None]],
    found: Callable[[], Awaitable[R | int | None]],
    *,
    kind: str,
    tenant: str,
    record_id: str,
    expected: int,
) -> R:
    """A versioned write of a ``kind`` record (a run, a session) holding version
    ``expected``: its record, else what ``found`` reads after it, a record to answer or
    the stored version (None: no record) that refused the write, raised as the conflict.

    A create can find the record there, then gone before the follow-up read: it
    writes again rather than report "expected 0, found 0", three times at most.
    """
    actual = None
    for _ in range(3):
        record = await write()
        if record is not None:
            return record
        answer = await found()
        if answer is not None and not isinstance(answer, int):
            return answer
        actual = answer
        if actual is not None or expected != 0:
            break
    raise StateConflictError(
        tenant=tenant,
        record_id=record_id,
        expected=expected,
        actual=0 if actual is None else actual,
        kind=kind,
    )
