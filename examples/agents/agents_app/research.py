"""The LangGraph part: a research graph whose runs are work items, resumable after a crash.

The graph is ``plan -> search -> write``; ``search`` stands for a slow tool call
(``search_seconds`` of the run's input). It is compiled with
``StatepactCheckpointSaver``, so each finished node is a checkpoint in statepact
(``durability="sync"``: stored before the next node starts).

One item is one run: ``{"task": "research", "thread_id": ..., "topic": ...}``.
The handler looks at the thread's stored state first:

- nothing stored: a new run, from ``plan``;
- a checkpoint with nodes still to run (a worker died mid-run, its lease was
  reaped and the item claimed again): ``ainvoke(None)`` resumes from there, so the
  nodes that finished are not run again;
- a finished run (the worker died after the graph ended, before the ack): its
  stored result, without running anything.

Each node appends a line to an optional *journal* file as it starts and ends
(``plan``, ``search:start``, ``search:end``, ``write``), written through at once,
so what ran survives a SIGKILL of the worker: the demo and the tests read it.
"""

from __future__ import annotations

import asyncio
import operator
import os
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from statepact.integrations.langgraph import StatepactCheckpointSaver
from statepact.worker import DoNotRetry, Job

__all__ = ["TASK", "Journal", "ResearchGraph", "ResearchState", "build_graph", "research_payload"]

TASK = "research"


class ResearchState(TypedDict, total=False):
    topic: str
    search_seconds: float
    questions: list[str]
    findings: list[str]
    report: str
    log: Annotated[list[str], operator.add]  # each node's name as it finishes


class Journal:
    """Lines appended to a file and synced at once: what ran, even in a killed process."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    async def write(self, line: str) -> None:
        if self.path is not None:
            await asyncio.to_thread(self._append, self.path, line)

    @staticmethod
    def _append(path: Path, line: str) -> None:
        with path.open("a", encoding="utf-8") as file:
            file.write(line + "\n")
            file.flush()
            os.fsync(file.fileno())

    def lines(self) -> list[str]:
        if self.path is None or not self.path.exists():
            return []
        return self.path.read_text(encoding="utf-8").splitlines()


def build_graph(saver: StatepactCheckpointSaver, journal: Journal) -> Any:
    """The research graph, compiled with ``saver``; each node writes to ``journal``."""

    async def plan(state: ResearchState) -> ResearchState:
        await journal.write(f"plan {state['topic']}")
        questions = [f"what is {state['topic']}?", f"who uses {state['topic']}?"]
        return {"questions": questions, "log": ["plan"]}

    async def search(state: ResearchState) -> ResearchState:
        await journal.write(f"search:start {state['topic']}")
        await asyncio.sleep(state.get("search_seconds", 0.0))  # the slow tool call
        findings = [f"a finding on {question}" for question in state["questions"]]
        await journal.write(f"search:end {state['topic']}")
        return {"findings": findings, "log": ["search"]}

    async def write(state: ResearchState) -> ResearchState:
        await journal.write(f"write {state['topic']}")
        report = f"{state['topic']}: " + "; ".join(state["findings"])
        return {"report": report, "log": ["write"]}

    builder = StateGraph(ResearchState)
    builder.add_node("plan", plan)
    builder.add_node("search", search)
    builder.add_node("write", write)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "search")
    builder.add_edge("search", "write")
    builder.add_edge("write", END)
    return builder.compile(checkpointer=saver)


def research_payload(thread_id: str, topic: str, *, search_seconds: float = 0.5) -> dict[str, Any]:
    """The payload of one research run's work item."""
    return {"task": TASK, "thread_id": thread_id, "topic": topic, "search_seconds": search_seconds}


class ResearchGraph:
    """Runs research graphs for the worker; ``run`` is the handler of :data:`TASK`."""

    def __init__(self, saver: StatepactCheckpointSaver, journal: Journal | None = None) -> None:
        self.saver = saver
        self.journal = journal or Journal(None)

    async def run(self, job: Job) -> str:
        """The run of ``job``'s thread: started, resumed, or read back finished; its report."""
        try:
            thread_id, topic = str(job.payload["thread_id"]), str(job.payload["topic"])
        except KeyError as missing:
            raise DoNotRetry(f"a {TASK} payload needs {missing}") from None
        # The tenant's own saver: two tenants' threads of one id never meet.
        graph = build_graph(self.saver.for_tenant(job.item.tenant), self.journal)
        config = {"configurable": {"thread_id": thread_id}}
        stored = await graph.aget_state(config)
        if stored.next:  # a run cut short: resume after its last checkpoint
            result = await graph.ainvoke(None, config, durability="sync")
        elif stored.values:  # finished already; only the ack was lost
            result = stored.values
        else:
            start: ResearchState = {
                "topic": topic,
                "search_seconds": float(job.payload.get("search_seconds", 0.0)),
                "log": [],
            }
            result = await graph.ainvoke(start, config, durability="sync")
        return str(result["report"])
