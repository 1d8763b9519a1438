"""The LangGraph checkpoint store on PostgreSQL: four tables of statepact's metadata.

Each call is one statement of ``_postgres_sql.py``, run by the PostgreSQL
backing's own executor (``DirectExecutor``: a pooled connection's asyncpg
connection, the backing's failover and error translation), outside any
transaction (autocommit: a statement is its own). No lock is shared between
savers or calls: two puts contend only on their own thread's row. Tables come
from statepact's Alembic revisions (``statepact_0007``), never from here.

This module must never create or alter a table, and never read a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from statepact.errors import SchemaVersionError, StatePersistenceError
from statepact.integrations.langgraph import _postgres_sql as sql
from statepact.integrations.langgraph._store import (
    CheckpointRow,
    ListQuery,
    StoredCheckpoint,
    WriteRow,
)
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import DirectExecutor, Prepared

__all__ = ["PostgresCheckpointStore"]

_CHECK = Prepared(sql.CHECK)
_PUT = Prepared(sql.PUT)
_PUT_WRITES = Prepared(sql.PUT_WRITES)
_DELETE_THREADS = Prepared(sql.DELETE_THREADS)
_DELETE_FOR_RUNS = Prepared(sql.DELETE_FOR_RUNS)
_PRUNE = Prepared(sql.PRUNE)
_DELTA_THREADS = Prepared(sql.DELTA_THREADS)
_COPY = Prepared(sql.COPY)
_SWEEP = Prepared(sql.SWEEP)
_READS: dict[tuple[bool, ...], Prepared] = {}


def _unavailable(message: str) -> StatePersistenceError:
    return StatePersistenceError(message, reason="unavailable")


def _read(query: ListQuery) -> tuple[Prepared, dict[str, Any]]:
    """The page statement for ``query``'s conditions, and its parameters."""
    flags = (
        query.thread_id is not None,
        query.checkpoint_ns is not None,
        query.checkpoint_id is not None,
        query.before is not None,
        query.below is not None,
        query.metadata_json is not None,
    )
    statement = _READS.get(flags)
    if statement is None:
        thread, namespace, checkpoint, before, below, filtered = flags
        statement = _READS[flags] = Prepared(
            sql.read(
                thread=thread,
                namespace=namespace,
                checkpoint=checkpoint,
                before=before,
                below=below,
                filtered=filtered,
            )
        )
    params: dict[str, Any] = {
        "p_thread_id": query.thread_id,
        "p_checkpoint_ns": query.checkpoint_ns,
        "p_checkpoint_id": query.checkpoint_id,
        "p_before": query.before,
        "p_filter": None if query.metadata_json is None else query.metadata_json.decode(),
        "p_limit": query.limit,
    }
    if query.below is not None:
        params["p_below_id"] = query.below.checkpoint_id
        params["p_below_thread"] = query.below.thread_id
        params["p_below_ns"] = query.below.checkpoint_ns
    return statement, params


class PostgresCheckpointStore:
    """Checkpoints in ``statepact_lg_*``; see the module docstring."""

    def __init__(self, engine: AsyncEngine, *, settings: PostgresStoreSettings) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                f"backing: its client must be an SQLAlchemy AsyncEngine, got {type(engine)}"
            )
        self._executor = DirectExecutor(
            engine,
            policy=settings.retry_policy,
            unavailable=_unavailable,
            what="LangGraph checkpoint saver",
        )

    def __repr__(self) -> str:
        return "PostgresCheckpointStore()"

    async def _run(self, statement: Prepared, params: dict[str, Any], *, read: bool = False) -> Any:
        async def work(runner: Any) -> Any:
            return await runner.execute(statement, params)

        return await self._executor.run(work, idempotent=True, abandonable=read)

    async def check(self) -> None:
        rows = await self._run(_CHECK, {}, read=True)
        row = rows.one()
        missing = [name for name, found in zip(sql.TABLES, row, strict=True) if found is None]
        if missing:
            raise SchemaVersionError(
                f"PostgreSQL: the LangGraph checkpoint saver's tables are missing "
                f"({', '.join(missing)}); they come with statepact's migrations: run "
                "`alembic upgrade head` (with statepact's revisions in your env.py) or "
                "`statepact db upgrade`"
            )

    async def put(self, tenant: str, row: CheckpointRow) -> None:
        blobs = row.blobs
        await self._run(
            _PUT,
            {
                "p_tenant": tenant,
                "p_thread_id": row.thread_id,
                "p_checkpoint_ns": row.checkpoint_ns,
                "p_checkpoint_id": row.checkpoint_id,
                "p_parent_id": row.parent_id,
                "p_run_id": row.run_id,
                "p_type": row.kind,
                "p_data": row.data,
                "p_metadata": row.metadata.decode(),
                "p_channels": [channel for channel, _ in row.versions],
                "p_versions": [version for _, version in row.versions],
                "p_blob_channels": [blob.channel for blob in blobs],
                "p_blob_versions": [blob.version for blob in blobs],
                "p_blob_types": [blob.kind for blob in blobs],
                "p_blob_data": [blob.data for blob in blobs],
                "p_at": row.at,
            },
        )

    async def put_writes(
        self,
        tenant: str,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[WriteRow],
    ) -> None:
        await self._run(
            _PUT_WRITES,
            {
                "p_tenant": tenant,
                "p_thread_id": thread_id,
                "p_checkpoint_ns": checkpoint_ns,
                "p_checkpoint_id": checkpoint_id,
                "p_task_id": writes[0].task_id,
                "p_task_path": writes[0].task_path,
                "p_idx": [write.idx for write in writes],
                "p_channels": [write.channel for write in writes],
                "p_types": [write.kind for write in writes],
                "p_data": [write.data for write in writes],
            },
        )

    async def get(
        self, tenant: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        page = await self.page(
            tenant,
            ListQuery(
                thread_id=thread_id,
                checkpoint_ns=checkpoint_ns,
                checkpoint_id=checkpoint_id,
                before=None,
                below=None,
                metadata=None,
                metadata_json=None,
                limit=1,
            ),
        )
        return page[0] if page else None

    async def page(self, tenant: str, query: ListQuery) -> list[StoredCheckpoint]:
        statement, params = _read(query)
        rows = await self._run(statement, {**params, "p_tenant": tenant}, read=True)
        return _checkpoints(rows)

    async def delete_thread(self, tenant: str, thread_id: str) -> None:
        await self._run(_DELETE_THREADS, {"p_tenant": tenant, "p_thread_ids": [thread_id]})

    async def delete_for_runs(self, tenant: str, run_ids: Sequence[str]) -> None:
        await self._run(_DELETE_FOR_RUNS, {"p_tenant": tenant, "p_run_ids": list(run_ids)})

    async def copy_thread(self, tenant: str, source: str, target: str, at: datetime) -> None:
        await self._run(
            _COPY, {"p_tenant": tenant, "p_source": source, "p_target": target, "p_at": at}
        )

    async def prune(self, tenant: str, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        await self._run(
            _PRUNE if keep_latest else _DELETE_THREADS,
            {"p_tenant": tenant, "p_thread_ids": list(thread_ids)},
        )

    async def uses_delta_channels(self, tenant: str, thread_ids: Sequence[str]) -> list[str]:
        rows = await self._run(
            _DELTA_THREADS,
            {"p_tenant": tenant, "p_thread_ids": list(thread_ids)},
            read=True,
        )
        return sorted(row[0] for row in rows)

    async def sweep(self, tenant: str, cutoff: datetime, batch: int) -> int:
        rows = await self._run(_SWEEP, {"p_tenant": tenant, "p_cutoff": cutoff, "p_batch": batch})
        return int(rows.scalar_one())


def _checkpoints(rows: Any) -> list[StoredCheckpoint]:
    """The page's rows, one per checkpoint, by ``(checkpoint_id, thread_id, checkpoint_ns)``
    descending."""
    found = []
    for row in rows:
        writes: tuple[WriteRow, ...] = ()
        if row["write_tasks"] is not None:
            writes = tuple(
                WriteRow(task_id, idx, channel, kind, data, path)
                for task_id, idx, channel, kind, data, path in zip(
                    row["write_tasks"],
                    row["write_idx"],
                    row["write_channels"],
                    row["write_types"],
                    row["write_data"],
                    row["write_paths"],
                    strict=True,
                )
            )
        values: tuple[tuple[str, str, bytes], ...] = ()
        if row["blob_channels"] is not None:
            values = tuple(
                zip(row["blob_channels"], row["blob_types"], row["blob_data"], strict=True)
            )
        found.append(
            StoredCheckpoint(
                thread_id=row["thread_id"],
                checkpoint_ns=row["checkpoint_ns"],
                checkpoint_id=row["checkpoint_id"],
                parent_id=row["parent_checkpoint_id"],
                kind=row["type"],
                data=row["checkpoint"],
                metadata=row["metadata"].encode(),
                values=values,
                writes=writes,
            )
        )
    found.sort(key=lambda c: (c.checkpoint_id, c.thread_id, c.checkpoint_ns), reverse=True)
    return found
