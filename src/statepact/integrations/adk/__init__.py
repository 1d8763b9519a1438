"""Google ADK on statepact: ``StatepactSessionService``, an ADK ``BaseSessionService``.

::

    from statepact.integrations.adk import StatepactSessionService

    service = await StatepactSessionService.open(backing)   # memory, Redis or PostgreSQL
    runner = Runner(agent=agent, app_name="support", session_service=service)

Needs the extra ``statepact[adk]`` (google-adk 2.x); on PostgreSQL, the tables of
revision ``statepact_0006`` (``alembic upgrade head`` / ``statepact db upgrade``).
Mapping, costs, conflicts, leases and retention: docs/agent-frameworks.md.
"""

from statepact.integrations.adk.errors import SessionConflictError, SessionLeasedError
from statepact.integrations.adk.models import EventPage, SessionLease, SessionPage, SessionUsage
from statepact.integrations.adk.service import StatepactSessionService

__all__ = [
    "EventPage",
    "SessionConflictError",
    "SessionLease",
    "SessionLeasedError",
    "SessionPage",
    "SessionUsage",
    "StatepactSessionService",
]
