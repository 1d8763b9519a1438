"""``StatepactCheckpointSaver`` beside LangGraph's ``AsyncPostgresSaver``: ``put`` + ``get_tuple``.

Run as ``python benchmarks/langgraph_checkpoint_saver.py --dsn postgresql://...``
(a database you may write to: it is migrated with statepact's revisions and
``AsyncPostgresSaver.setup()`` creates LangGraph's tables beside them). Needs
``statepact[dev]`` (``langgraph-checkpoint-postgres``, ``psycopg[binary]``).

Both savers get the same calls on the same server, one after the other, each
on a pool of ``--pool`` connections (statepact: ``create_engine``; LangGraph: a
psycopg ``AsyncConnectionPool`` with autocommit, its recommended set-up): a
warm-up, then ``--rounds`` rounds of ``aput`` of a checkpoint followed by
``aget_tuple`` of the thread's latest, from ``--concurrency`` tasks, each on a
thread of its own; the two savers take turns ``--repeats`` times and each
reports its median, so neither gains from the machine's quieter moments. The
checkpoint is shaped like a chat graph's: a message list that grows by one
message a step, a few small channels, and ``new_versions`` naming only the
channels the step wrote. Prints one JSON line per saver and
the ratio (statepact's rate over LangGraph's, above 1.0 is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from statepact.integrations.langgraph import StatepactCheckpointSaver
from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres import migrate, open_backing


def _message(step: int) -> dict[str, Any]:
    return {"role": "assistant" if step % 2 else "user", "content": f"message {step} " * 12}


async def _thread(saver: BaseCheckpointSaver[Any], rounds: int) -> None:
    """``rounds`` steps of one thread: put the step's checkpoint, read the latest back."""
    thread_id = uuid.uuid4().hex
    parent: str | None = None
    messages: list[dict[str, Any]] = []
    versions: dict[str, Any] = {}
    for step in range(rounds):
        messages.append(_message(step))
        values = {"messages": list(messages), "step": step, "route": "act", "done": False}
        new = {"messages": saver.get_next_version(versions.get("messages"), None)}
        if step == 0:
            for channel in ("step", "route", "done"):
                new[channel] = saver.get_next_version(None, None)
        else:
            new["step"] = saver.get_next_version(versions["step"], None)
        versions.update(new)
        checkpoint = {
            "v": 4,
            "id": str(uuid.uuid1()),
            "ts": "2026-12-07T00:00:00+00:00",
            "channel_values": values,
            "channel_versions": dict(versions),
            "versions_seen": {"agent": dict(versions)},
            "updated_channels": list(new),
        }
        configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
        if parent is not None:
            configurable["checkpoint_id"] = parent
        stored = await saver.aput(
            {"configurable": configurable},
            checkpoint,  # type: ignore[arg-type]
            {"source": "loop", "step": step, "parents": {}},
            new,
        )
        parent = stored["configurable"]["checkpoint_id"]
        got = await saver.aget_tuple(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        )
        assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == step + 1


async def _measure(saver: BaseCheckpointSaver[Any], rounds: int, concurrency: int) -> float:
    """put + get_tuple pairs a second over ``concurrency`` threads of ``rounds`` steps."""
    await asyncio.gather(*(_thread(saver, 5) for _ in range(concurrency)))  # warm-up
    started = time.perf_counter()
    await asyncio.gather(*(_thread(saver, rounds) for _ in range(concurrency)))
    return rounds * concurrency / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dsn", required=True, help="postgresql://user@host:port/db")
    parser.add_argument("--rounds", type=int, default=200, help="steps per thread")
    parser.add_argument("--concurrency", type=int, default=10, help="threads at once")
    parser.add_argument("--pool", type=int, default=10, help="connections per saver")
    parser.add_argument("--repeats", type=int, default=3, help="turns of each saver")
    args = parser.parse_args()
    plain = args.dsn.replace("postgresql+asyncpg://", "postgresql://")

    await migrate.upgrade(plain)
    settings = PostgresStoreSettings(dsn=plain, pool_size=args.pool, max_overflow=0)
    results: dict[str, float] = {}
    for concurrency in (1, args.concurrency):
        ours_runs: list[float] = []
        theirs_runs: list[float] = []
        for _ in range(args.repeats):
            async with await open_backing(settings) as backing:
                ours = await StatepactCheckpointSaver.open(backing, tenant="bench")
                ours_runs.append(await _measure(ours, args.rounds, concurrency))
            async with AsyncConnectionPool(
                plain,
                min_size=args.pool,
                max_size=args.pool,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                open=False,
            ) as pool:
                theirs = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
                await theirs.setup()
                theirs_runs.append(await _measure(theirs, args.rounds, concurrency))
        results[f"statepact.c{concurrency}"] = statistics.median(ours_runs)
        results[f"langgraph.c{concurrency}"] = statistics.median(theirs_runs)
        ratio = results[f"statepact.c{concurrency}"] / results[f"langgraph.c{concurrency}"]
        print(
            json.dumps(
                {
                    "scenario": "langgraph.put+get_tuple",
                    "concurrency": concurrency,
                    "rounds_per_thread": args.rounds,
                    "repeats": args.repeats,
                    "statepact_ops_per_s": round(results[f"statepact.c{concurrency}"], 1),
                    "async_postgres_saver_ops_per_s": round(
                        results[f"langgraph.c{concurrency}"], 1
                    ),
                    "ratio": round(ratio, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
