"""Agent frameworks on statepact: one package per framework, each opened from a ``Backing``.

- ``statepact.integrations.adk``: ``StatepactSessionService``, a Google ADK
  ``BaseSessionService`` (extra ``statepact[adk]``).
- ``statepact.integrations.langgraph``: ``StatepactCheckpointSaver``, a LangGraph
  ``BaseCheckpointSaver`` (extra ``statepact[langgraph]``).

Each integration imports its framework, which ``import statepact`` never does;
it reaches a backing through that backing's public names only. The layout and
import rules: docs/architecture.md; how to use them: docs/agent-frameworks.md.
"""
