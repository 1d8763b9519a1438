"""The ADK part: a support agent whose turns are work items.

One item is one turn of one conversation: ``{"task": "support_turn", "user":
..., "session": ..., "message": ...}`` in the queue under the customer's
tenant. The handler runs the turn with ADK's own ``Runner`` over
``StatepactSessionService``, so the conversation (its events and state) and its
cost (the run counters fed by each answer's ``usage_metadata``) are stored in
statepact, under the same tenant: ``await sessions.usage(app_name=tenant)`` is
what that customer's agents consumed, in one read.

Two turns of one session never interleave: the turn holds the session's lease
(``sessions.leased``) while it runs, and a second turn that finds it held is
retried a second later. A turn cancelled (``queue.cancel``, or the worker's
shutdown) stops where it is, the model call included; the lease is given back
on the way out.
"""

from __future__ import annotations

import contextlib
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.models.base_llm import BaseLlm
from google.adk.runners import Runner
from google.genai import types

from agents_app.model import TOOL_NAME
from statepact.integrations.adk import StatepactSessionService
from statepact.worker import DoNotRetry, Job, Retry

__all__ = ["TASK", "SupportAgent", "build_agent", "lookup_order", "turn_payload"]

TASK = "support_turn"
# The session lease outlives any turn: a turn is a few model calls. A worker that
# dies mid-turn leaves it to expire, and the item's retry waits for that.
SESSION_LEASE_SECONDS = 120.0
ORDER_STATUSES = ("placed", "packed", "shipped", "delivered")


async def lookup_order(order_id: str) -> dict[str, str]:
    """Look up an order's status by its number (a stand-in for the order service)."""
    return {"order_id": order_id, "status": ORDER_STATUSES[int(order_id) % len(ORDER_STATUSES)]}


def build_agent(model: BaseLlm) -> LlmAgent:
    """The support agent: ``model`` (a ``CannedModel`` here, Gemini in production) and
    one tool."""
    assert lookup_order.__name__ == TOOL_NAME
    return LlmAgent(
        name="support",
        model=model,
        instruction="Answer questions about orders. Look an order up before answering.",
        tools=[lookup_order],
    )


def turn_payload(user: str, session: str, message: str) -> dict[str, Any]:
    """The payload of one turn's work item."""
    return {"task": TASK, "user": user, "session": session, "message": message}


class SupportAgent:
    """Runs turns of ``agent`` for the worker; ``turn`` is the handler of :data:`TASK`."""

    def __init__(self, sessions: StatepactSessionService, agent: LlmAgent) -> None:
        self.sessions = sessions
        self.agent = agent

    async def turn(self, job: Job) -> str:
        """One turn: the user's message in, the agent's reply (also stored as an event) out."""
        try:
            user, session_id, message = (
                str(job.payload[field]) for field in ("user", "session", "message")
            )
        except KeyError as missing:
            raise DoNotRetry(f"a {TASK} payload needs {missing}") from None
        app = job.item.tenant  # the customer: ADK's app name is statepact's tenant
        if (
            await self.sessions.get_session(app_name=app, user_id=user, session_id=session_id)
            is None
        ):
            with contextlib.suppress(AlreadyExistsError):  # another turn created it meanwhile
                await self.sessions.create_session(
                    app_name=app, user_id=user, session_id=session_id
                )
        async with self.sessions.leased(
            app_name=app,
            user_id=user,
            session_id=session_id,
            # One owner per attempt: the same worker's other turns must not take it over.
            owner=f"{job.worker_id}:{job.item.item_id}:{job.attempts}",
            ttl=SESSION_LEASE_SECONDS,
        ) as leased:
            if leased is None:
                raise Retry(1.0, "another turn of this session is running")
            runner = Runner(agent=self.agent, app_name=app, session_service=leased)
            reply = ""
            async for event in runner.run_async(
                user_id=user,
                session_id=session_id,
                new_message=types.Content(role="user", parts=[types.Part(text=message)]),
            ):
                if event.is_final_response() and event.content is not None:
                    reply = "".join(part.text or "" for part in event.content.parts or [])
            return reply
