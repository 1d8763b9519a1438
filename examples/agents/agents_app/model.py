"""A stand-in for a hosted model: canned answers with token counts, no network.

``CannedModel`` is an ADK ``BaseLlm``, so an ``LlmAgent`` runs it exactly as it
would run Gemini. Its script is fixed: to a new user message it answers with a
call of the ``lookup_order`` tool (for the first ``#<digits>`` in the message);
once the tool has answered, it replies in text with the order's status. Every
answer carries ``usage_metadata`` (prompt tokens growing with the history, as a
real model's do), which statepact's session service adds to the session's run
counters. ``latency`` is how long each answer takes (a model's network time);
``answered`` and ``cancelled`` count what happened to the calls, for the demo
and the tests.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from pydantic import PrivateAttr

__all__ = ["PROMPT_TOKENS_PER_CONTENT", "TOOL_NAME", "CannedModel"]

TOOL_NAME = "lookup_order"
# A prompt's "tokens": a fixed figure per content of the history sent, so a longer
# conversation costs more per answer, as with a hosted model.
PROMPT_TOKENS_PER_CONTENT = 40
ORDER_ID = re.compile(r"#(\d+)")


class CannedModel(BaseLlm):
    """Answers from a fixed script after ``latency`` seconds; see the module docstring."""

    model: str = "canned-model"
    latency: float = 0.0
    _answered: int = PrivateAttr(default=0)
    _cancelled: int = PrivateAttr(default=0)
    _started: int = PrivateAttr(default=0)

    @property
    def started(self) -> int:
        """Calls begun (a call is begun before its ``latency`` passes)."""
        return self._started

    @property
    def answered(self) -> int:
        """Calls that returned an answer."""
        return self._answered

    @property
    def cancelled(self) -> int:
        """Calls cancelled while the model was "thinking"."""
        return self._cancelled

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self._started += 1
        try:
            await asyncio.sleep(self.latency)
        except asyncio.CancelledError:
            self._cancelled += 1
            raise
        content = _answer(llm_request.contents)
        words = sum(len((part.text or "").split()) for part in content.parts or [])
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=PROMPT_TOKENS_PER_CONTENT * len(llm_request.contents),
            candidates_token_count=max(words, 1) * 2,
        )
        self._answered += 1
        yield LlmResponse(content=content, usage_metadata=usage)


def _answer(contents: list[types.Content]) -> types.Content:
    """The script: a tool call for a new message, a text reply once the tool answered."""
    last = contents[-1] if contents else None
    for part in (last.parts or []) if last is not None else []:
        if part.function_response is not None and part.function_response.name == TOOL_NAME:
            result: dict[str, Any] = part.function_response.response or {}
            text = f"Order #{result.get('order_id')} is {result.get('status', 'unknown')}."
            return types.Content(role="model", parts=[types.Part(text=text)])
    message = " ".join(part.text or "" for part in (last.parts or [])) if last else ""
    found = ORDER_ID.search(message)
    if found is None:
        text = "Which order? Give me its number, like #1042."
        return types.Content(role="model", parts=[types.Part(text=text)])
    call = types.FunctionCall(name=TOOL_NAME, args={"order_id": found.group(1)})
    return types.Content(role="model", parts=[types.Part(function_call=call)])
