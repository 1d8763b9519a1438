"""A small LangGraph ``StateGraph`` for the saver's tests, and a process that runs it.

The graph is ``plan -> act -> review``: each node appends its name to the
state's ``log`` (so a node run twice shows twice), ``act`` first awaits its
``gate`` (a test holds the run inside the node there, to cancel or kill it),
and ``review`` asks a human with ``interrupt()`` when the state says so.

Run as ``python -m tests.integration._langgraph_graph <backing> <url> <thread>
<started>``: it opens the saver on that backing (its own client), creates the
file ``started`` when ``act`` begins, and waits there until it is killed.
"""

from __future__ import annotations

import asyncio
import operator
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from statepact.integrations.langgraph import StatepactCheckpointSaver


class State(TypedDict, total=False):
    task: str
    log: Annotated[list[str], operator.add]
    ask: bool
    answer: str


def build(
    saver: StatepactCheckpointSaver, *, gate: Callable[[], Awaitable[None]] | None = None
) -> Any:
    """The graph compiled with ``saver``; ``act`` awaits ``gate()`` first, if given."""

    async def plan(state: State) -> State:
        return {"log": ["plan"]}

    async def act(state: State) -> State:
        if gate is not None:
            await gate()
        return {"log": ["act"]}

    async def review(state: State) -> State:
        if state.get("ask"):
            return {"log": ["review"], "answer": interrupt({"question": "ship it?"})}
        return {"log": ["review"]}

    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("act", act)
    builder.add_node("review", review)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    builder.add_edge("act", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=saver)


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


async def open_saver(backing_name: str, url: str) -> tuple[Any, StatepactCheckpointSaver]:
    """A backing of this process's own on ``url``, and a saver of tenant ``acme`` on it."""
    if backing_name == "redis":
        from statepact.settings import RedisStoreSettings
        from statepact.storage.redis import open_backing as open_redis

        backing: Any = await open_redis(RedisStoreSettings(dsn=url, durable=False))
    else:
        from statepact.settings import PostgresStoreSettings
        from statepact.storage.postgres import open_backing as open_postgres

        backing = await open_postgres(PostgresStoreSettings(dsn=url))
    return backing, await StatepactCheckpointSaver.open(backing, tenant="acme")


async def _main(backing_name: str, url: str, thread_id: str, started: str) -> None:
    backing, saver = await open_saver(backing_name, url)

    async def wait_to_be_killed() -> None:
        await asyncio.to_thread(Path(started).touch)
        await asyncio.Event().wait()

    try:
        graph = build(saver, gate=wait_to_be_killed)
        await graph.ainvoke({"task": "ship"}, config(thread_id), durability="sync")
    finally:
        await backing.close()


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:5]))
