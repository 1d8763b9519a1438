"""``PostgresBackend``'s first reads: a transaction's first read takes its snapshot, and
the first reads of several transactions made while one is on its way go together in one
statement, sharing one snapshot (taken while each of their calls was on its way)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from statepact._limits import MAX_BATCH_BYTES, MAX_SHARED_READS
from statepact._shared import SharedRoundTrips
from statepact.storage.postgres._direct import Prepared, Statements
from statepact.storage.postgres._sql.tx import TxStatements
from statepact.tx import Snapshot, StoredValue

__all__ = ["FirstReads"]

Taken = tuple[Snapshot, StoredValue]
#: Runs one piece of work on a connection: a read alone may be abandoned by a cancelled
#: caller (``abandonable``); a shared one is not (other callers wait for it).
Run = Callable[[Callable[[Statements], Awaitable[Any]]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class _FirstRead:
    """A transaction's first read, waiting to be sent (alone or with others)."""

    resource: str
    key: str


def _found(data: str | None, version: int | None) -> StoredValue:
    # No row, or a version-0 placeholder: absent.
    return StoredValue(data, 0 if version is None else int(version))


class FirstReads:
    """Sends one backend's first reads, alone (``read_alone``) or together (``run``)."""

    def __init__(self, sql: TxStatements[Prepared], read_alone: Run, run: Run) -> None:
        self._sql = sql
        self._read_alone = read_alone
        self._run = run
        self._shared: SharedRoundTrips[_FirstRead, Taken] = SharedRoundTrips(
            self._one,
            self._together,
            keys=lambda _read: (),
            size=lambda read: len(read.resource) + len(read.key),
            max_items=MAX_SHARED_READS,
            max_bytes=MAX_BATCH_BYTES,
            name="statepact-first-reads",
        )

    async def send(self, resource: str, key: str) -> Taken:
        return await self._shared.send(_FirstRead(resource, key))

    async def _one(self, read: _FirstRead) -> Taken:
        params = {"resource": read.resource, "key": read.key}

        async def work(conn: Statements) -> Taken:
            token, sequence, data, version = (
                await conn.execute(self._sql.begin_read, params)
            ).one()
            return Snapshot(int(sequence), token), _found(data, version)

        taken: Taken = await self._read_alone(work)
        return taken

    async def _together(self, reads: list[_FirstRead]) -> list[Taken]:
        """Several transactions' first reads in one statement: one snapshot for all of them,
        each key as it sees it."""
        params = {
            "resources": [read.resource for read in reads],
            "keys": [read.key for read in reads],
        }

        async def work(conn: Statements) -> list[Taken]:
            answers: list[Taken] = []
            snapshot: Snapshot | None = None
            for _ord, token, sequence, data, version in (
                await conn.execute(self._sql.begin_read_many, params)
            ).all():
                if snapshot is None:
                    snapshot = Snapshot(int(sequence), token)
                answers.append((snapshot, _found(data, version)))
            return answers

        answers: list[Taken] = await self._run(work)
        return answers
