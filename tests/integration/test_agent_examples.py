"""examples/agents end to end on real Redis and PostgreSQL (issue 36, item 5).

The example's own code (``examples/agents/agents_app``, put on ``sys.path``)
on a backing opened from the test server's URL, as its command line opens it:

- support turns of an ADK ``LlmAgent`` (the stand-in ``CannedModel``: no
  network) run by a ``Worker`` through ADK's ``Runner`` and
  ``StatepactSessionService``: every item done, the replies stored as events,
  and ``sessions.usage(app_name=tenant)`` equal, for each tenant, to the sums
  of the ``usage_metadata`` its sessions' events carry, read the long way;
- ``queue.cancel`` of a turn whose model is answering stops the handler (the
  model call is cancelled, ADK records the invocation as aborted, no reply or
  token is stored) and gives the session's lease back: the next turn of that
  session runs;
- a worker process (``python -m agents_app worker``) SIGKILLed inside the
  graph's slow ``search`` node: once its lease is reaped, another worker claims
  the item and the graph resumes from the checkpoint after ``plan``. The
  nodes' journal (fsynced lines) shows ``plan`` and ``write`` ran once,
  ``search`` started twice and ended once.

About 15 s per backing on a two-core machine, most of it the worker process's
start (importing ADK and LangGraph) and its lease running out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from statepact.models import ItemStatus, WorkItem
from statepact.storage.redis import glob_escape

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agents"
sys.path.insert(0, str(EXAMPLE))

from agents_app.app import AgentsApp, open_backing_for, until  # noqa: E402
from agents_app.research import Journal, research_payload  # noqa: E402
from agents_app.support import turn_payload  # noqa: E402

pytestmark = [pytest.mark.integration]

TURNS = [  # (tenant, user, session, message, the reply the stand-in model gives)
    ("acme", "ada", "chat-1", "Where is my order #1042?", "Order #1042 is shipped."),
    ("acme", "ada", "chat-1", "And #7?", "Order #7 is delivered."),
    ("acme", "cyd", "chat-2", "Has #12 shipped?", "Order #12 is placed."),
    ("globex", "bob", "chat-1", "Status of #5?", "Order #5 is packed."),
]
WAIT = 30.0  # seconds any one wait below may take before the test fails


@pytest.fixture(params=["redis", "postgres"])
def server(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """The URL (and Redis namespace) of this test's own database on that server."""
    if request.param == "redis":
        return (
            request.getfixturevalue("statepact_redis_url"),
            request.getfixturevalue("statepact_redis_namespace"),
        )
    return request.getfixturevalue("statepact_postgres_database"), None


@pytest.fixture
async def app(server: tuple[str, str | None]) -> AsyncIterator[AgentsApp]:
    url, namespace = server
    backing = await open_backing_for(url, namespace=namespace)
    try:
        yield await AgentsApp.open(backing)
        if namespace is not None:  # the sessions' and checkpoints' keys too, not only the queue's
            match = f"{glob_escape(namespace)}:*"
            keys = [key async for key in backing.client.scan_iter(match=match)]
            if keys:
                await backing.client.unlink(*keys)
    finally:
        await backing.close()


async def _enqueue(app: AgentsApp, tenant: str, item_id: str, payload: dict[str, Any]) -> None:
    await app.backing.queue.enqueue(WorkItem(tenant=tenant, item_id=item_id, payload=payload))


async def _replies(app: AgentsApp, tenant: str, user: str, session_id: str) -> set[str]:
    """The texts of the agent's final replies stored in the session."""
    session = await app.sessions.get_session(app_name=tenant, user_id=user, session_id=session_id)
    assert session is not None
    return {
        "".join(part.text or "" for part in event.content.parts or [])
        for event in session.events
        if event.author == "support" and event.is_final_response() and event.content is not None
    }


async def test_support_turns_run_by_a_worker_count_tokens_per_tenant(app: AgentsApp) -> None:
    """Each turn item is done, its reply stored; one usage() read per tenant equals the sums
    of its sessions' events' usage_metadata; two turns of one session ran one at a time."""
    for number, (tenant, user, session_id, message, _) in enumerate(TURNS):
        await _enqueue(app, tenant, f"turn-{number}", turn_payload(user, session_id, message))
    async with asyncio.timeout(WAIT), app.worker(lease_for=5.0):
        await until(app.idle)

    for number, (tenant, *_) in enumerate(TURNS):
        item = await app.backing.queue.get_item(tenant, f"turn-{number}")
        assert item is not None and item.status == ItemStatus.DONE, item
    for tenant, user, session_id in {(t[0], t[1], t[2]) for t in TURNS}:
        expected = {t[4] for t in TURNS if t[:3] == (tenant, user, session_id)}
        assert await _replies(app, tenant, user, session_id) == expected
    assert app.model.answered == 2 * len(TURNS)  # a tool call, then the reply, per turn

    for tenant in ("acme", "globex"):
        expected = {"sessions": 0, "input": 0, "output": 0, "iterations": 0, "events": 0}
        for user, session_id in {(t[1], t[2]) for t in TURNS if t[0] == tenant}:
            session = await app.sessions.get_session(
                app_name=tenant, user_id=user, session_id=session_id
            )
            assert session is not None
            expected["sessions"] += 1
            expected["events"] += len(session.events)
            for event in session.events:
                if (usage := event.usage_metadata) is not None:
                    expected["iterations"] += 1
                    expected["input"] += usage.prompt_token_count or 0
                    expected["output"] += usage.candidates_token_count or 0
            run = await app.backing.state.get_run(tenant, app.sessions.run_id(user, session_id))
            assert run is not None and run.input_tokens > 0
        usage = await app.sessions.usage(app_name=tenant)
        assert expected["input"] > 0
        assert (
            usage.sessions,
            usage.input_tokens,
            usage.output_tokens,
            usage.iterations,
            usage.events,
        ) == (
            expected["sessions"],
            expected["input"],
            expected["output"],
            expected["iterations"],
            expected["events"],
        )
    chat = await app.sessions.get_session(app_name="acme", user_id="ada", session_id="chat-1")
    assert chat is not None
    # Not interleaved: each turn's four events (message, tool call, tool answer, reply) together.
    invocations = [event.invocation_id for event in chat.events]
    assert len(invocations) == 8 and len(set(invocations[:4])) == len(set(invocations[4:])) == 1


async def test_cancel_stops_a_running_turn_and_frees_its_session(app: AgentsApp) -> None:
    """queue.cancel of a turn whose model is answering: the handler stops within a heartbeat,
    the model call is cancelled, the session records the invocation as aborted with no reply
    and no token, and the session's lease is given back, so the session's next turn runs."""
    queue = app.backing.queue
    app.model.latency = 60.0
    lease_for = 3.0
    async with app.worker(lease_for=lease_for, grace_period=1.0) as worker:
        await _enqueue(app, "acme", "slow", turn_payload("ada", "chat-9", "Where is #3?"))
        async with asyncio.timeout(WAIT):
            await until(lambda: app.model.started == 1)
        asked = time.monotonic()
        cancelled = await queue.cancel("acme", "slow", reason="the customer hung up")
        assert cancelled is not None and cancelled.status == ItemStatus.CANCELLED
        async with asyncio.timeout(lease_for):  # the notice, or a heartbeat at the latest
            await until(lambda: worker.in_flight == 0)
        stopped_after = time.monotonic() - asked
        assert (app.model.cancelled, app.model.answered) == (1, 0), stopped_after

        item = await queue.get_item("acme", "slow")
        assert item is not None
        assert (item.status, item.last_error) == (ItemStatus.CANCELLED, "the customer hung up")
        session = await app.sessions.get_session(
            app_name="acme", user_id="ada", session_id="chat-9"
        )
        assert session is not None
        # The message, then ADK's record of the aborted invocation: no reply, no usage.
        user_message, aborted = session.events
        assert user_message.author == "user"
        assert (aborted.error_code, aborted.content, aborted.usage_metadata) == (
            "INVOCATION_ABORTED",
            None,
            None,
        )
        assert (await app.sessions.usage(app_name="acme")).iterations == 0

        app.model.latency = 0.0
        await _enqueue(app, "acme", "next", turn_payload("ada", "chat-9", "Where is #3?"))
        async with asyncio.timeout(WAIT):
            await until(app.idle)
    done = await queue.get_item("acme", "next")
    assert done is not None and (done.status, done.attempts) == (ItemStatus.DONE, 1)
    assert await _replies(app, "acme", "ada", "chat-9") == {"Order #3 is delivered."}


async def test_a_worker_killed_mid_graph_resumes_from_the_checkpoint(
    app: AgentsApp, server: tuple[str, str | None], tmp_path: Path
) -> None:
    """A worker process SIGKILLed inside ``search``: after its lease is reaped another worker
    runs the item again and the graph resumes after ``plan``: plan and write ran once."""
    url, namespace = server
    journal = Journal(tmp_path / "journal")
    lease_for = 2.0
    payload = research_payload("report-1", "queues", search_seconds=1.0)
    await _enqueue(app, "acme", "research-report-1", payload)

    command = [sys.executable, "-m", "agents_app", "worker", url, "--lease-seconds", str(lease_for)]
    command += ["--journal", str(journal.path)]
    if namespace is not None:
        command += ["--namespace", namespace]
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=EXAMPLE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), *sys.path])},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):  # the process imports ADK and LangGraph first
            await until(
                lambda: process.returncode is not None or "search:start queues" in journal.lines()
            )
        assert process.returncode is None, await process.communicate()
        process.send_signal(signal.SIGKILL)
        await process.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
    assert process.returncode == -signal.SIGKILL
    held = await app.backing.queue.get_item("acme", "research-report-1")
    assert held is not None and held.status == ItemStatus.LEASED  # by the dead worker

    async with (
        asyncio.timeout(WAIT),
        app.worker(journal=journal, lease_for=lease_for, reap_every=0.5),
    ):
        await until(app.idle)

    done = await app.backing.queue.get_item("acme", "research-report-1")
    assert done is not None and (done.status, done.attempts) == (ItemStatus.DONE, 2)
    assert journal.lines() == [
        "plan queues",
        "search:start queues",  # the killed run
        "search:start queues",  # the resumed one: plan was not run again
        "search:end queues",
        "write queues",
    ]
    saver = app.saver.for_tenant("acme")
    stored = await saver.aget_tuple({"configurable": {"thread_id": "report-1"}})
    assert stored is not None
    values = stored.checkpoint["channel_values"]
    assert values["log"] == ["plan", "search", "write"]
    assert values["report"].startswith("queues: a finding on what is queues?")


@pytest.mark.parametrize("server", [pytest.param(("memory", None), id="memory")])
async def test_the_readme_demo_runs_in_memory(
    app: AgentsApp, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m agents_app demo`` (in this process): the replies, each tenant's tokens, the
    cancelled turn and the graph's nodes, as the README shows them."""
    from agents_app.demo import demo

    async with asyncio.timeout(WAIT):
        await demo(app)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "acme: Order #7 is delivered."
    assert lines[1] == "  acme used 640 input + 20 output tokens in 4 model calls"
    assert lines[2:4] == [
        "globex: Order #12 is placed.",
        "  globex used 160 input + 10 output tokens in 2 model calls",
    ]
    assert lines[4].startswith("cancelled turn-") and "cancelled (the customer hung up)" in lines[4]
    assert lines[4].endswith("model calls cut short: 1")
    assert lines[5].endswith(": ['plan', 'search', 'write']")
