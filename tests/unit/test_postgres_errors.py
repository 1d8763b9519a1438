"""How the PostgreSQL boundary classifies asyncpg's own errors (no server involved)."""

from __future__ import annotations

import asyncpg
import pytest
from asyncpg.exceptions import _base as asyncpg_base

from statepact.storage.postgres._client import is_connection_error


@pytest.mark.parametrize(
    "error",
    [
        asyncpg_base.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"
        ),
        asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
        asyncpg.InterfaceError("cannot perform operation: connection is closed"),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    ],
)
def test_a_connection_that_cannot_take_a_statement_is_a_connection_error(
    error: Exception,
) -> None:
    """A connection whose protocol is stuck (the server sent an error on its own as it shut
    down) or closed refuses the statement before sending it: a dropped connection."""
    assert is_connection_error(error)


def test_other_interface_errors_are_not_connection_errors() -> None:
    """asyncpg's refusals of a bad call are not outages."""
    assert not is_connection_error(asyncpg.InterfaceError("the server expects 2 arguments"))
