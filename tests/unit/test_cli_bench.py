"""``statepact bench`` on the memory backing, with tiny sizes: every scenario, ops/s and ratio."""

from __future__ import annotations

import argparse
import io
import json
import re

import pytest

from statepact.cli import bench
from tests._cli import bench_scenarios, parse

SCENARIOS = bench_scenarios((2, 20), (20, 50))
TINY = [
    *("--concurrency", "4", "--ops", "3", "--tenants", "2,20", "--queued", "20,50"),
    *("--finished", "30"),
]


def _args(*argv: str) -> argparse.Namespace:
    return parse(bench.add_arguments, *argv)


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = bench.command(_args(*argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# The floor each scenario stands beside on memory, and its target (docs/benchmarks.md).
MEMORY_FLOORS = {
    "tx.independent": ("seed.memory.independent", 0.3),
    "tx.hot_key": ("seed.memory.hot", None),
    "tx.read_only": ("seed.memory.readonly", None),
}


def test_json_has_every_scenario_with_ops_and_ratio() -> None:
    """Each scenario is measured, with ops/s and a ratio to the floor beside it, measured
    right after it at the same concurrency; the transaction scenarios stand beside the
    minimal designs, with the target where one is asked."""
    code, out, err = _run(*TINY, "--claims", "5", "--json")
    assert code == 0, err
    payload = json.loads(out)
    results = payload["results"]
    assert [r["scenario"] for r in results] == SCENARIOS
    floors = payload["floors"]
    # one floor sample per scenario on memory, taken right after it, at its concurrency
    assert [f["extra"]["after"] for f in floors] == SCENARIOS
    for result, floor in zip(results, floors, strict=True):
        name, target = MEMORY_FLOORS.get(result["scenario"], ("dict+asyncio.Lock", None))
        assert result["backing"] == floor["backing"] == "memory"
        assert result["floor"] == floor["floor"] == name
        assert floor["scenario"] == f"floor.{name}"
        assert result["target"] == target
        assert result["also"] == []
        assert result["concurrency"] == floor["concurrency"]
        assert result["ops_per_s"] > 0
        assert result["floor_ops_per_s"] == floor["ops_per_s"] > 0
        assert result["ratio"] == pytest.approx(result["ops_per_s"] / floor["ops_per_s"])
        assert floor["seconds"] >= bench.MIN_SECONDS
        assert floor["round_trips_per_op"] is None
    # a transaction design runs the scenario's own shape: its agents, its ops each
    by_floor = {f["floor"]: f for f in floors}
    assert by_floor["seed.memory.hot"]["ops"] % (4 * 3) == 0
    assert by_floor["seed.memory.hot"]["extra"]["retries"] > 0  # agents yield: they conflict
    assert by_floor["seed.memory.independent"]["extra"]["retries"] == 0
    assert "retries" not in by_floor["seed.memory.readonly"]["extra"]
    by_name = {r["scenario"]: r for r in results}
    # transaction and state scenarios run in rounds of their agents x ops, timed for at
    # least MIN_SECONDS as their floors are; the queue's run once
    for name in ("tx.independent", "tx.hot_key", "tx.read_only", "state.get", "state.put"):
        assert by_name[name]["ops"] % 12 == 0 and by_name[name]["ops"] >= 12
        assert by_name[name]["seconds"] >= bench.MIN_SECONDS
    assert by_name["queue.claim_ack.w10"]["ops"] == 12
    assert by_name["queue.claim_cost.t20.q50"]["ops"] == 5
    extra = by_name["queue.claim_cost.t20.q50"]["extra"]
    assert (extra["tenants"], extra["queued"]) == (20, 50)
    assert extra["ms_per_claim_ack"] > 0
    assert by_name["tx.hot_key"]["extra"]["retries"] >= 0
    # stats() with no finished items and with --finished of them, and the ratio of the two
    empty, full = by_name["queue.stats.empty"], by_name["queue.stats.finished"]
    assert (empty["extra"]["finished"], full["extra"]["finished"]) == (0, 30)
    assert empty["ops"] == full["ops"] == 100
    assert full["extra"]["x_empty_p50"] == pytest.approx(
        full["extra"]["p50_ms"] / empty["extra"]["p50_ms"], rel=0.01
    )
    # cancel to handler stop: 20 running items cancelled, each handler stopped promptly
    cancel = by_name["queue.worker.cancel"]["extra"]
    assert by_name["queue.worker.cancel"]["ops"] == 20
    assert 0 < cancel["p50_ms"] <= cancel["p99_ms"] <= cancel["max_ms"] < 1000
    assert payload["params"] == {
        "concurrency": 4,
        "ops": 3,
        "tenants": [2, 20],
        "queued": [20, 50],
        "claims": 5,
        "finished": 30,
    }
    # the progress goes to stderr, one line per step when stderr is not a terminal
    assert err.count("\n") == len(SCENARIOS)
    assert err.splitlines()[-1].startswith(f"[{len(SCENARIOS)}/{len(SCENARIOS)}]")


def test_the_table_shows_ops_per_second_and_ratio() -> None:
    """Without --json: a table with a row per scenario, its ops/s and its ratio to the floor."""
    code, out, _ = _run(
        *("--concurrency", "3", "--ops", "2", "--tenants", "3", "--queued", "6"),
        *("--finished", "10"),
    )
    assert code == 0
    assert "ops/s" in out
    assert "x floor" in out
    assert re.search(r"\btarget = .*: [01] of 1 met in this run;", out), out
    labels = {
        "tx: independent keys (3 agents x 2)": r"seed\.memory\.independent",
        "tx: one hot key, no backoff (3 agents x 2)": r"seed\.memory\.hot",
        "tx: read-only commits (3 agents x 2)": r"seed\.memory\.readonly",
        "state: get_run (3 callers x 2)": r"dict\+asyncio\.Lock",
        "state: put_run (3 callers x 2)": r"dict\+asyncio\.Lock",
        "state: patch_run, own run (3 callers x 2)": r"dict\+asyncio\.Lock",
        "state: patch_run, one run (3 callers x 2)": r"dict\+asyncio\.Lock",
        "queue: enqueue (1 producer)": r"dict\+asyncio\.Lock",
        "queue: claim+ack (10 workers)": r"dict\+asyncio\.Lock",
        "queue: claim+ack, 3 tenants, 6 queued": r"dict\+asyncio\.Lock",
        "queue: stats(), 10 finished, p50": r"dict\+asyncio\.Lock",
        "queue: cancel to handler stop p50": r"dict\+asyncio\.Lock",
    }
    for label, floor in labels.items():
        row = next(line for line in out.splitlines() if label in line)
        target = r"\s+>= 0\.3 (met|not met)" if "independent" in label else ""
        assert re.search(rf"\s[\d,]+\s+{floor}\s+[\d,]+\s+\d+\.\d{{3}}{target}$", row), row


def test_a_server_backing_without_its_url_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking for a server without its URL fails at once, in one line that says what to give."""
    for name in ("STATEPACT_POSTGRES_URL", "STATEPACT_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    code = bench.command(_args("--backend", "memory,postgres"), out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip() == (
        "statepact bench: error: --backend postgres needs --postgres URL or "
        "STATEPACT_POSTGRES_URL (the server to measure); nothing was run"
    )


def test_a_named_backing_takes_its_url_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--backend postgres`` with no --postgres: the variable's URL; the environment alone
    adds no backing, and an option's URL wins over it."""
    monkeypatch.setenv("STATEPACT_POSTGRES_URL", "postgresql://env-host/db")
    monkeypatch.delenv("STATEPACT_DATABASE_URL", raising=False)
    args = _args("--backend", "memory,postgres")
    assert bench.params_from(args).backings == ("memory", "postgres")
    assert args.postgres == "postgresql://env-host/db"
    assert bench.params_from(_args()).backings == ("memory",)
    args = _args("--postgres", "postgresql://option-host/db")
    assert bench.params_from(args).backings == ("memory", "postgres")
    assert args.postgres == "postgresql://option-host/db"
    args = _args("--postgres")  # bare: the variable's
    assert bench.params_from(args).backings == ("memory", "postgres")
    assert args.postgres == "postgresql://env-host/db"


def test_bad_sizes_and_backings_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Flags are checked before anything runs, with a message naming the bad value."""
    for argv, message in [
        (["--backend", "mongo"], "unknown backing mongo"),
        (["--ops", "0"], "'0' must be at least 1"),
        (["--tenants", "ten"], "'ten' is not a whole number"),
    ]:
        with pytest.raises(SystemExit) as exc:
            _args(*argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


def test_the_progress_bar_redraws_in_place_on_a_terminal() -> None:
    """On a terminal the bar is one line redrawn with carriage returns, cleared at the end."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = bench.Progress(2, stream, width=10)
    progress.start("first")
    progress.finish_step()
    progress.start("second")
    progress.finish_step()
    progress.close()
    text = stream.getvalue()
    assert "\n" not in text
    assert "[#####.....]  50.0% first" in text
    assert "[##########] 100.0% second" in text
    assert text.endswith("\r")
