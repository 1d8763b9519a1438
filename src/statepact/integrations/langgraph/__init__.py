"""LangGraph on statepact: :class:`StatepactCheckpointSaver`, a ``BaseCheckpointSaver``.

``saver = await StatepactCheckpointSaver.open(backing, tenant="acme")`` on the
``Backing`` of any of the three backings, then ``graph.compile(checkpointer=saver)``.
Needs the ``statepact[langgraph]`` extra; importing this package imports
LangGraph, ``import statepact`` never does. See docs/agent-frameworks.md.
"""

from statepact.integrations.langgraph.saver import PRUNE_STRATEGIES, StatepactCheckpointSaver

__all__ = ["PRUNE_STRATEGIES", "StatepactCheckpointSaver"]
