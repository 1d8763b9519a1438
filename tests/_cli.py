"""Helpers of the tests of ``statepact`` commands (``tests/unit/test_cli_*.py``,
``tests/integration/test_cli_*.py``, the migrations' tests): a command's arguments parsed by
its own parser, the installed command run (or started) in a process, the names of the
bench's scenarios, the demo's summary table, and the Redis keys a command left.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The bench's scenarios in the order it runs them, but for the claim-cost sweep (see
# bench_scenarios).
BENCH_SCENARIOS = [
    "tx.independent",
    "tx.hot_key",
    "tx.read_only",
    "state.get",
    "state.put",
    "state.patch_own",
    "state.patch",
    "queue.enqueue.w1",
    "queue.claim_ack.w1",
    "queue.enqueue.w10",
    "queue.claim_ack.w10",
    "queue.enqueue_many",
    "queue.worker.c10",
    "queue.worker.wake",
    "queue.stats.empty",
    "queue.stats.finished",
    "queue.worker.cancel",
]


def parse(add: Callable[[argparse.ArgumentParser], None], *argv: str) -> argparse.Namespace:
    """``argv`` parsed by a parser that ``add`` (a command's ``add_arguments``) filled."""
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(list(argv))


def installed_statepact() -> Path:
    """The ``statepact`` console script ``pip install`` put beside this interpreter."""
    script = Path(sys.executable).parent / "statepact"
    assert script.is_file(), f"no statepact console script at {script}; run pip install -e ."
    return script


def run_statepact(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The installed ``statepact`` command run with ``argv`` in a process of its own."""
    return subprocess.run(
        [str(installed_statepact()), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


async def start_statepact(
    *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> asyncio.subprocess.Process:
    """The installed ``statepact`` command started with ``argv``, its stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        str(installed_statepact()),
        *argv,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def bench_scenarios(tenants: tuple[int, ...], queued: tuple[int, ...]) -> list[str]:
    """Every scenario the bench runs with ``--tenants`` and ``--queued`` as given, in order."""
    sweep = [f"queue.claim_cost.t{t}.q{q}" for t in tenants for q in queued]
    return [*BENCH_SCENARIOS, *sweep]


def summary_table(transcript: str) -> list[str]:
    """The demo's summary table: its head and a row per tenant."""
    lines = transcript.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("tenant"))
    return lines[start : start + 4]


async def redis_keys(url: str, pattern: str) -> list[Any]:
    """The keys matching ``pattern`` on the Redis at ``url``."""
    from redis.asyncio import Redis

    client: Any = Redis.from_url(url)
    try:
        return [key async for key in client.scan_iter(match=pattern, count=1000)]
    finally:
        await client.aclose()
