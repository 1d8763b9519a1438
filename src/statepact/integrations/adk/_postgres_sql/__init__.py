"""The statements of the ADK session service on PostgreSQL, built once per table naming.

Each call is one statement (data-modifying CTEs where it writes several tables), run
in its own implicit transaction, so it is atomic without a BEGIN or COMMIT round
trip. The tables are ``schema.AdkTables``; the session's run is the state store's
``runs`` table (its naming, its schema). Every value is a bound parameter, every
time the caller's clock. Why each is shaped so: docs/agent-frameworks.md#adk-on-postgresql.

One module per seam: :mod:`.writes` (create, append, delete), :mod:`.reads`,
:mod:`.leases` and :mod:`.maintain` (retention); what they share is in :mod:`._parts`.
Nothing here runs a statement or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Select, Table

from statepact._limits import MAX_COUNTER
from statepact.integrations.adk._postgres_sql import leases, maintain, reads, writes
from statepact.integrations.adk._postgres_sql._parts import COUNTERS
from statepact.storage.postgres.schema import AdkTables

__all__ = ["COUNTERS", "AdkStatements", "room", "statements"]


@dataclass(frozen=True, slots=True)
class AdkStatements:
    """Every statement of the service for one naming, built once (``statements``)."""

    create: dict[tuple[bool, bool], Select[Any]]
    append: dict[tuple[bool, bool], Select[Any]]
    refusal: Select[Any]
    get: dict[bool, Select[Any]]
    delete: Select[Any]
    page: dict[bool, Select[Any]]
    user_state: Select[Any]
    events: Select[Any]
    usage: dict[bool, Select[Any]]
    acquire: Select[Any]
    renew: Any
    release: Any
    prune_sessions: Select[Any]
    prune_events: Select[Any]
    present: Any


@cache
def statements(t: AdkTables, runs: Table, run_prefix: str) -> AdkStatements:
    both = [(a, u) for a in (False, True) for u in (False, True)]
    return AdkStatements(
        create={(a, u): writes.create_session(t, runs, app=a, user=u) for a, u in both},
        append={(a, u): writes.append_event(t, runs, app=a, user=u) for a, u in both},
        refusal=writes.append_refusal(t, runs),
        get={after: reads.get_session(t, after=after) for after in (False, True)},
        delete=writes.delete_session(t),
        page={by_user: reads.page_sessions(t, by_user=by_user) for by_user in (False, True)},
        user_state=reads.user_state(t),
        events=reads.list_events(t),
        usage={by: reads.usage(runs, by_user=by, prefix=run_prefix) for by in (False, True)},
        acquire=leases.acquire_lease(t),
        renew=leases.renew_lease(t),
        release=leases.release_lease(t),
        prune_sessions=maintain.prune_sessions(t),
        prune_events=maintain.prune_events(t),
        present=reads.present(t),
    )


def room(deltas: dict[str, int]) -> dict[str, int]:
    """``p_room_<counter>``: the highest value each counter may hold before the deltas."""
    return {f"p_room_{name}": MAX_COUNTER - deltas[name] for name in COUNTERS}
