"""``statepact demo`` on the memory backing: every story point shows, fast, and repeatably."""

from __future__ import annotations

import argparse
import io
import re
import time
from decimal import Context, Decimal, Inexact, Rounded, localcontext

import pytest

from statepact.cli import _common, demo
from statepact.clock import ManualClock
from statepact.models import RunStatus
from tests._cli import parse


def _args(*argv: str) -> argparse.Namespace:
    return parse(demo.add_arguments, *argv)


def _run(*argv: str) -> tuple[int, str, float]:
    out = io.StringIO()
    started = time.perf_counter()
    code = demo.command(_args(*argv), out=out)
    return code, out.getvalue(), time.perf_counter() - started


def test_the_demo_tells_every_story_point_and_exits_0() -> None:
    """With no server and no arguments but a seed, each promised scene appears in the transcript."""
    code, transcript, seconds = _run("--seed", "3")
    assert code == 0
    assert seconds < 10
    # runs and their counters, as they happen and in the summary table
    assert re.search(
        r"finished acme/run-\d\d: \d+ iterations, \d+\+\d+ tokens, \$0\.\d+", transcript
    )
    assert re.search(r"acme\s+14\s+14\s+\d+\s+\d+\s+\d+\s+0\.\d{9}", transcript)
    # fair claims: round 1 serves the three tenants before any tenant's second item
    first_round = re.search(r"round 1 claims: (.*)", transcript)
    assert first_round is not None
    tenants = re.findall(r"->(\w+)/", first_round.group(1))
    assert tenants[:3] == ["acme", "globex", "initech"]
    assert "fair claims: the first 15 claims" in transcript
    assert "acme 5, globex 5, initech 5" in transcript
    # a crash mid-lease, reaped when the lease lapsed, finished by another worker
    assert "CRASHED after step 1" in transcript
    assert re.search(r"reaper: \S+ lease expired; back to queued", transcript)
    assert re.search(r"resumes \S+ at step 2 of \d", transcript)
    assert re.search(r"crash: (w\d) crashed holding \S+; .* and (?!\1)w\d finished it", transcript)
    # a poison item dead-lettered after its retries
    assert "failed attempt 1 of 3" in transcript
    assert "failed attempt 3 of 3" in transcript
    assert "DEAD-LETTERED" in transcript
    assert "dead letter: globex/run-poison after 3 attempts" in transcript
    # two agents conflicting on one key, one retried by TransactionManager.run
    assert "its commit was refused (ConflictError" in transcript
    assert "attempt 2 reads spent=" in transcript
    assert "spent=12 (= 5 + 7, no lost update)" in transcript
    # a transaction replayed by its idempotency key
    assert "replayed=True" in transcript
    assert "refused with IdempotencyConflictError" in transcript
    # the closing summary names both: one agent took one attempt, the other two, nothing lost
    conflict = re.search(
        r"^conflict: planner and critic raced on budgets/acme; attempts "
        r"\{'(planner|critic)': (\d), '(planner|critic)': (\d)\}; final \{'spent': 12\}$",
        transcript,
        re.M,
    )
    assert conflict is not None
    assert {conflict.group(1), conflict.group(3)} == {"planner", "critic"}
    assert sorted([conflict.group(2), conflict.group(4)]) == ["1", "2"]
    # ... and the replay: the same version both times, the second one replayed
    assert re.search(
        r"^idempotent replay: first commit version (\d+), replay version \1, replayed=True$",
        transcript,
        re.M,
    )


async def test_the_report_matches_what_the_stores_hold() -> None:
    """The summary is read back from the stores: 27 runs succeeded, the poison run failed."""
    clock = ManualClock()
    out = io.StringIO()
    async with _common.open_backings("memory", None, clock=clock, policy=demo.DEMO_POLICY) as b:
        report = await demo.run_demo(b, clock, seed=11, out=out)
        dead = await b.queue.dead_letters("globex")
        stats = await b.queue.stats()
    statuses = {(r.tenant, r.run_id): r.status for r in report.runs}
    assert len(statuses) == 28
    assert statuses[("globex", "run-poison")] is RunStatus.FAILED
    assert sum(s is RunStatus.SUCCEEDED for s in statuses.values()) == 27
    assert [(d.item_id, d.attempts) for d in dead] == [("run-poison", 3)]
    assert (stats.queued, stats.leased, stats.dead) == (0, 0, 1)
    assert report.crashed is not None
    crashed_worker, tenant, run_id = report.crashed
    assert report.finished_by not in (None, crashed_worker)
    assert statuses[(tenant, run_id)] is RunStatus.SUCCEEDED
    assert report.conflict_value == {"spent": 12}
    assert sorted(report.conflict_attempts.values()) == [1, 2]
    assert report.replay is not None
    assert report.replay[0] == report.replay[1]
    assert report.replay[2] is True
    assert report.stale_put is not None
    assert report.stale_put.expected < report.stale_put.actual
    for run in report.runs:
        if run.status is RunStatus.SUCCEEDED:
            assert run.iterations == run.cursor >= 2
            assert run.cost > Decimal(0)


def test_the_same_seed_tells_the_same_story() -> None:
    """``--seed`` makes the transcript repeatable on memory."""
    _, first, _ = _run("--seed", "5")
    _, second, _ = _run("--seed", "5")
    _, other, _ = _run("--seed", "6")
    assert first == second
    assert first != other


def test_an_unreachable_server_is_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A server that does not answer is reported in one line naming the redacted URL."""
    pytest.importorskip("redis")
    code = demo.command(_args("--redis", "redis://:hunter2@127.0.0.1:1/0"), out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("statepact demo: error: cannot reach Redis at redis://:***@")
    assert "hunter2" not in err
    assert "Traceback" not in err


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """``--debug`` prints the traceback before the one-line error."""
    pytest.importorskip("redis")
    code = demo.command(
        _args("--redis", "redis://:hunter2@127.0.0.1:1/0", "--debug"), out=io.StringIO()
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("statepact demo: error: ")


def test_with_both_servers_the_first_failure_ends_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--redis and --postgres: Redis goes first; when it cannot be reached the run stops there,
    in one line without the password, and PostgreSQL is not tried."""
    pytest.importorskip("redis")
    out = io.StringIO()
    code = demo.command(
        _args(
            "--redis",
            "redis://:hunter2@127.0.0.1:1/0",
            "--postgres",
            "postgresql://someone:hunter3@127.0.0.1:1/z",
            "--seed",
            "1",
        ),
        out=out,
    )
    err = capsys.readouterr().err
    assert code == 1
    assert out.getvalue().startswith("statepact demo on redis, seed 1 (1 of 2)\n")
    assert "on postgres" not in out.getvalue()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("statepact demo: error: cannot reach Redis at redis://:***@")
    assert "hunter2" not in err + out.getvalue()
    assert "hunter3" not in err + out.getvalue()


def test_the_demo_counts_cost_exactly_under_any_decimal_context() -> None:
    """The demo's prices and sums run in the package's decimal context: a caller's precision of
    3 with Inexact trapped changes nothing in the transcript."""
    code, plain, _ = _run("--seed", "3")
    with localcontext(Context(prec=3, traps=[Inexact, Rounded])):
        hostile_code, hostile, _ = _run("--seed", "3")
    assert code == hostile_code == 0
    assert hostile == plain
