"""``python -m agents_app demo [URL]``: the walk-through of ../README.md in one process.

Three support turns for two tenants, run by a worker; what each tenant's
sessions cost, in one read each; a turn cancelled while its model is answering;
a research graph run to its end. (Killing a worker mid-graph needs two
processes: the README shows it with ``python -m agents_app worker``.)
"""

from __future__ import annotations

import time
import uuid

from agents_app.app import AgentsApp, until
from agents_app.research import research_payload
from agents_app.support import turn_payload
from statepact.models import WorkItem


async def last_reply(app: AgentsApp, tenant: str, user: str, session_id: str) -> str:
    session = await app.sessions.get_session(app_name=tenant, user_id=user, session_id=session_id)
    assert session is not None
    content = session.events[-1].content
    return "".join(part.text or "" for part in (content.parts or [])) if content else ""


async def demo(app: AgentsApp) -> None:
    queue = app.backing.queue
    run = uuid.uuid4().hex[:6]  # new ids each time, so a second demo on a server starts clean
    chats = {"acme": ("ada", f"chat-{run}"), "globex": ("bob", f"chat-{run}")}
    turns = [
        ("acme", "Where is my order #1042?"),
        ("acme", "And #7?"),
        ("globex", "Has #12 shipped?"),
    ]
    async with app.worker(lease_for=3.0, grace_period=1.0) as worker:
        # 1. Support turns: one item per turn; two turns of one chat run one after the other.
        for number, (tenant, message) in enumerate(turns):
            user, chat = chats[tenant]
            payload = turn_payload(user, chat, message)
            await queue.enqueue(
                WorkItem(tenant=tenant, item_id=f"turn-{run}-{number}", payload=payload)
            )
        await until(app.idle)
        for tenant, (user, chat) in chats.items():
            print(f"{tenant}: {await last_reply(app, tenant, user, chat)}")
            usage = await app.sessions.usage(app_name=tenant)  # one read per tenant
            print(
                f"  {tenant} used {usage.input_tokens} input + {usage.output_tokens} output tokens"
                f" in {usage.iterations} model calls"
            )

        # 2. Cancel a turn while its model is answering: the handler stops there.
        app.model.latency = 60.0
        started = app.model.started
        user, chat = chats["acme"]
        slow = WorkItem(
            tenant="acme", item_id=f"turn-{run}-slow", payload=turn_payload(user, chat, "And #99?")
        )
        await queue.enqueue(slow)
        await until(lambda: app.model.started > started)
        asked = time.monotonic()
        await queue.cancel("acme", slow.item_id, reason="the customer hung up")
        await until(lambda: worker.in_flight == 0)
        item = await queue.get_item("acme", slow.item_id)
        assert item is not None
        print(
            f"cancelled {slow.item_id}: {item.status} ({item.last_error}), handler stopped in"
            f" {time.monotonic() - asked:.1f} s; model calls cut short: {app.model.cancelled}"
        )
        app.model.latency = 0.0

        # 3. A research graph: plan -> search -> write, a checkpoint after each node.
        thread = f"report-{run}"
        payload = research_payload(thread, "durable agents", search_seconds=0.2)
        await queue.enqueue(WorkItem(tenant="acme", item_id=f"research-{thread}", payload=payload))
        await until(app.idle)
        saver = app.saver.for_tenant("acme")
        stored = await saver.aget_tuple({"configurable": {"thread_id": thread}})
        assert stored is not None
        print(f"research {thread}: {stored.checkpoint['channel_values'].get('log')}")
