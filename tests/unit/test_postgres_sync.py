"""The blocking bound adapters' one piece of machinery: a bound call run to its end on the
calling thread (``statepact.storage.postgres.sync``); the calls themselves are tested on a
real PostgreSQL in ``tests/integration/test_postgres_sync_bound.py``."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("sqlalchemy")

from statepact.storage.postgres.sync import _blocking


async def _answer() -> int:
    return 42


async def _raises() -> int:
    raise LookupError("the run is gone")


async def _waits() -> int:
    await asyncio.sleep(0)
    return 1


def test_a_call_that_never_waits_answers_or_raises_here() -> None:
    assert _blocking(_answer()) == 42
    with pytest.raises(LookupError, match="the run is gone"):
        _blocking(_raises())


def test_a_call_that_would_wait_is_refused_and_closed() -> None:
    call = _waits()
    with pytest.raises(RuntimeError, match="waited on an event loop"):
        _blocking(call)
    assert call.cr_frame is None  # closed: nothing of it runs later
