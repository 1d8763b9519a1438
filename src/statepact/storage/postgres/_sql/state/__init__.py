"""The statements of ``PostgresStateStore``: runs and sessions in ``adk_runs``/``adk_sessions``,
one module per seam.

:mod:`.runs` (one run's writes, each as a first attempt and a resend, and the
delete), :mod:`.batch` (several calls' run writes in one statement), :mod:`.reads`
(pages and totals of runs), :mod:`.maintain` (the prune) and :mod:`.sessions`; what
they share is in :mod:`._parts`. Run writes are one statement each, made safe to
send again by the call's row in ``adk_run_writes``
(docs/backings.md#run-writes-sent-again). Every timestamp is a bound parameter from
the injected clock, never the server's ``now()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Generic

from statepact.storage.postgres._sql.state import batch, maintain, reads, runs, sessions
from statepact.storage.postgres._sql.state._parts import (
    COUNTERS,
    CoreStatement,
    S,
    T,
    get_record,
    record_version,
)
from statepact.storage.postgres._sql.state.runs import Attempts
from statepact.storage.postgres.schema import Tables

__all__ = ["COUNTERS", "Attempts", "CoreStatement", "StateStatements", "statements"]


@dataclass(frozen=True, slots=True)
class StateStatements(Generic[S]):
    """Every statement of the state store, by name, each of type ``S`` (as built, or
    compiled for the driver: :meth:`map`)."""

    get_run: S
    run_after_write: S
    # Each run write twice: its first attempt, and a resend (which looks for the first).
    create_run: Attempts[S]
    update_run: Attempts[S]
    patch_run: Attempts[S]
    # Several calls' writes of different runs in one statement (concurrent callers).
    update_runs: S
    patch_runs: S
    # By (whether it filters by session, by status).
    list_runs: Mapping[tuple[bool, bool], S]
    # By (whether it filters by session, by status), as list_runs.
    run_totals: Mapping[tuple[bool, bool], S]
    delete_run: S
    # By whether the prune is of one tenant.
    prune_runs: Mapping[bool, S]
    get_session: S
    session_version: S
    create_session: S
    update_session: S
    list_sessions: S
    delete_session: S

    def map(self, convert: Callable[[S], T]) -> StateStatements[T]:
        """The same set with each statement converted (compiled for the driver, say)."""
        converted: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Attempts):
                converted[field.name] = value.map(convert)
            elif isinstance(value, Mapping):
                converted[field.name] = {key: convert(one) for key, one in value.items()}
            else:
                converted[field.name] = convert(value)
        return StateStatements(**converted)

    @staticmethod
    def build(tables: Tables) -> StateStatements[CoreStatement]:
        run_table, session_table, writes = tables.runs, tables.sessions, tables.run_writes
        return StateStatements(
            get_run=get_record(run_table, "run_id"),
            run_after_write=runs.run_after_write(run_table, writes),
            create_run=runs.create_run(run_table, writes),
            update_run=runs.update_run(run_table, writes),
            patch_run=runs.patch_run(run_table, writes),
            update_runs=batch.update_runs(run_table, writes),
            patch_runs=batch.patch_runs(run_table, writes),
            list_runs=reads.by_filters(run_table, reads.list_runs),
            run_totals=reads.by_filters(run_table, reads.run_totals),
            delete_run=runs.delete_run(run_table, writes),
            prune_runs={
                one_tenant: maintain.prune_runs(run_table, writes, one_tenant=one_tenant)
                for one_tenant in (False, True)
            },
            get_session=get_record(session_table, "session_id"),
            session_version=record_version(session_table, "session_id"),
            create_session=sessions.create_session(session_table),
            update_session=sessions.update_session(session_table),
            list_sessions=sessions.list_sessions(session_table),
            delete_session=sessions.delete_session(session_table),
        )


@cache
def statements(tables: Tables) -> StateStatements[CoreStatement]:
    """The statements of one table naming, built on first use."""
    return StateStatements.build(tables)
