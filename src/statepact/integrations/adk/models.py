"""What the ADK session service returns beyond ADK's own models (docs/agent-frameworks.md)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from google.adk.events.event import Event
from google.adk.sessions.base_session_service import ListSessionsResponse
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EventPage", "SessionLease", "SessionPage", "SessionUsage"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class SessionPage(ListSessionsResponse):
    """One page of ``list_sessions_page``: sessions in creation order, without events.

    Pass ``next`` as ``after`` for the following page (``None``: the last one).
    """

    next: str | None = None


class EventPage(BaseModel):
    """One page of a session's events in append order; ``next`` as for ``SessionPage``."""

    model_config = ConfigDict(frozen=True)

    events: list[Event] = Field(default_factory=list)
    next: str | None = None


class SessionUsage(BaseModel):
    """What the sessions of an app (or of one of its users) consumed: the sums of their
    runs' counters (``input_tokens``: prompt and tool-use prompt tokens; ``output_tokens``:
    candidates and thoughts tokens; ``iterations``: events carrying usage, one per model
    response; ``events``: events appended). ``cost`` is what the application patched
    into those runs itself; ``sessions`` counts the runs summed."""

    model_config = _FROZEN

    sessions: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    iterations: int = 0
    events: int = 0
    cost: Decimal = Decimal(0)


class SessionLease(BaseModel):
    """A session's lease: while it is live, only appends through it are taken.

    ``token`` is above every token the session issued before (a fencing token);
    ``expires_at`` is by the service's clock.
    """

    model_config = _FROZEN

    app_name: str
    user_id: str
    session_id: str
    owner: str
    token: int
    expires_at: datetime
    ttl: float
