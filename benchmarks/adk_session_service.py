"""``StatepactSessionService`` beside ADK's own ``DatabaseSessionService``, same PostgreSQL.

Run as ``python benchmarks/adk_session_service.py --url postgresql+asyncpg://...``: the
database must be one you can write to (it is migrated to statepact's head, and ADK's
service creates its own tables, ``sessions``/``events``/``app_states``/``user_states``,
in it). Both services make the same calls, one after the other, in one run:

- ``append_event``: ``--sessions`` sessions get ``--events`` events each, appended in
  turn (one caller), then again by ``--concurrency`` callers at once (one session each);
  each event carries content, usage metadata and a session-state delta, every fifth a
  ``user:`` delta and every tenth an ``app:`` one;
- ``get_session``: every session read whole, then with ``num_recent_events=5``;
- ``list_sessions`` at ``--listed`` sessions (100k by default), seeded with one
  ``INSERT ... SELECT`` per service: statepact's first page, a page from the middle and
  the whole listing; ADK's whole listing (it has no pages).

It prints one line per figure: calls per second, mean and p99 milliseconds, and the
ratio statepact/ADK (above 1.0: statepact is faster). Figures from a shared machine
carry its noise; run it on a quiet one for numbers to publish.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import DatabaseSessionService
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.genai import types
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from statepact.integrations.adk import StatepactSessionService
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import migrate, open_backing

APP = "bench"


def _event(n: int) -> Event:
    delta: dict[str, Any] = {"turn": n, "topic": f"topic-{n % 7}"}
    if n % 5 == 0:
        delta["user:last_turn"] = n
    if n % 10 == 0:
        delta["app:turns_seen"] = n
    return Event(
        invocation_id=f"inv-{n // 4}",
        author="model" if n % 2 else "user",
        content=types.Content(role="model", parts=[types.Part(text="lorem ipsum " * 20)]),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=120 + n, candidates_token_count=40, total_token_count=160 + n
        ),
        actions=EventActions(state_delta=delta),
    )


class Timings:
    def __init__(self) -> None:
        self.samples: list[float] = []
        self.wall = 0.0

    async def time(self, call: Awaitable[Any]) -> Any:
        started = time.perf_counter()
        result = await call
        self.samples.append(time.perf_counter() - started)
        return result

    @property
    def per_second(self) -> float:
        return len(self.samples) / self.wall if self.wall else 0.0

    def line(self, label: str, other: Timings | None = None) -> str:
        ordered = sorted(self.samples)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        mean = statistics.fmean(ordered)
        ratio = f"  {self.per_second / other.per_second:5.2f}x ADK" if other else ""
        return (
            f"{label:<44} {self.per_second:9.1f}/s  mean {mean * 1000:7.2f} ms  "
            f"p99 {p99 * 1000:7.2f} ms  ({len(ordered)} calls){ratio}"
        )


async def _walled(timings: Timings, work: Callable[[], Awaitable[None]]) -> Timings:
    started = time.perf_counter()
    await work()
    timings.wall = time.perf_counter() - started
    return timings


async def run_calls(
    service: BaseSessionService, sessions: int, events: int, concurrency: int, tag: str
) -> dict[str, Timings]:
    made = [
        await service.create_session(app_name=APP, user_id=f"u{i % 10}", session_id=f"{tag}{i}")
        for i in range(sessions)
    ]
    result = {name: Timings() for name in ("append", "append_c", "get", "get_recent")}

    async def append_in_turn() -> None:
        for n in range(events):
            for session in made:
                await result["append"].time(service.append_event(session, _event(n)))

    async def append_at_once() -> None:
        async def one(session: Any) -> None:
            for n in range(events):
                await result["append_c"].time(service.append_event(session, _event(n)))

        for start in range(0, len(made), concurrency):
            await asyncio.gather(*(one(s) for s in made[start : start + concurrency]))

    async def get_whole() -> None:
        for session in made:
            await result["get"].time(
                service.get_session(app_name=APP, user_id=session.user_id, session_id=session.id)
            )

    async def get_recent() -> None:
        config = GetSessionConfig(num_recent_events=5)
        for session in made:
            await result["get_recent"].time(
                service.get_session(
                    app_name=APP, user_id=session.user_id, session_id=session.id, config=config
                )
            )

    await _walled(result["append"], append_in_turn)
    await _walled(result["append_c"], append_at_once)
    await _walled(result["get"], get_whole)
    await _walled(result["get_recent"], get_recent)
    return result


SEED_STATEPACT = """
INSERT INTO statepact_adk_sessions
    (app_name, user_id, session_id, version, state, last_update_time, created_at, updated_at)
SELECT 'listed', 'u' || (i % 1000), 's' || i, 1, '{"k": "\\"v\\""}'::jsonb,
       extract(epoch FROM now()) + i, now(), now()
  FROM generate_series(1, :count) AS i
"""
SEED_ADK = """
INSERT INTO sessions (app_name, user_id, id, state, create_time, update_time)
SELECT 'listed', 'u' || (i % 1000), 's' || i, '{"k": "v"}',
       now(), now() + make_interval(secs => i)
  FROM generate_series(1, :count) AS i
"""


async def seed(url: str, count: int) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM statepact_adk_sessions WHERE app_name = 'listed'"))
            await conn.execute(text("DELETE FROM sessions WHERE app_name = 'listed'"))
            await conn.execute(text(SEED_STATEPACT), {"count": count})
            await conn.execute(text(SEED_ADK), {"count": count})
            await conn.execute(text("ANALYZE statepact_adk_sessions"))
            await conn.execute(text("ANALYZE sessions"))
    finally:
        await engine.dispose()


async def listing(ours: StatepactSessionService, adk: BaseSessionService) -> list[str]:
    lines = []
    first, middle, user, whole, theirs = (Timings() for _ in range(5))
    for _ in range(20):
        await first.time(ours.list_sessions_page(app_name="listed", limit=100))
        page = await middle.time(
            ours.list_sessions_page(app_name="listed", limit=100, after="50000")
        )
        assert len(page.sessions) == 100
        await user.time(ours.list_sessions_page(app_name="listed", user_id="u7", limit=100))
    for timings in (first, middle, user):
        timings.wall = sum(timings.samples)
    listed = await whole.time(ours.list_sessions(app_name="listed"))
    whole.wall = sum(whole.samples)
    counted = len(listed.sessions)
    theirs_listed = await theirs.time(adk.list_sessions(app_name="listed"))
    theirs.wall = sum(theirs.samples)
    lines.append(first.line("statepact list_sessions_page (first 100)"))
    lines.append(middle.line("statepact list_sessions_page (100 after 50k)"))
    lines.append(user.line("statepact list_sessions_page (a user's 100)"))
    lines.append(whole.line(f"statepact list_sessions (all {counted})", theirs))
    lines.append(theirs.line(f"ADK list_sessions (all {len(theirs_listed.sessions)})"))
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="postgresql+asyncpg://... (a database)")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--listed", type=int, default=100_000)
    args = parser.parse_args()

    await migrate.upgrade(args.url, "head")
    adk = DatabaseSessionService(db_url=args.url)
    await adk.prepare_tables()
    async with await open_backing(PostgresStoreSettings(dsn=args.url)) as backing:
        ours = await StatepactSessionService.open(backing)
        tag = f"r{int(time.time())}-"
        theirs = await run_calls(adk, args.sessions, args.events, args.concurrency, "adk" + tag)
        mine = await run_calls(ours, args.sessions, args.events, args.concurrency, "sp" + tag)
        labels = {
            "append": "append_event, one caller",
            "append_c": f"append_event, {args.concurrency} callers",
            "get": f"get_session ({args.events} events)",
            "get_recent": "get_session (num_recent_events=5)",
        }
        for key, label in labels.items():
            print(theirs[key].line(f"ADK {label}"))
            print(mine[key].line(f"statepact {label}", theirs[key]))
        await seed(args.url, args.listed)
        for line in await listing(ours, adk):
            print(line)
    await adk.close()


if __name__ == "__main__":
    asyncio.run(main())
