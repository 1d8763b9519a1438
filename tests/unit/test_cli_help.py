"""``statepact demo|bench|doctor`` through the entry point: help, exit codes, one-line errors."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from statepact import cli
from tests._cli import run_statepact

LOGGING = ["--log-level {debug,info,warning,error}", "--log-format {text,json}"]
DB_OPTIONS = ["--url URL", "--debug", *LOGGING]
QUEUE_WHERE = [
    "--redis [URL]",
    "--postgres [URL]",
    "--queue NAME",
    "--namespace NS",
    "--schema NAME",
    "--no-durable",
]
QUEUE_OPTIONS = [*QUEUE_WHERE, "--json", "--debug", *LOGGING]
POLICY = ["--max-attempts N", "--backoff-base S", "--backoff-cap S", "--jitter F"]
OPTIONS: dict[str, list[str]] = {
    "demo": ["--redis [URL]", "--postgres [URL]", "--seed N", "--debug", *LOGGING],
    "bench": [
        "--backend LIST",
        "--redis [URL]",
        "--postgres [URL]",
        "--concurrency N",
        "--ops N",
        "--tenants LIST",
        "--queued LIST",
        "--claims N",
        "--json",
        "--debug",
        *LOGGING,
    ],
    "doctor": [
        "--redis [URL]",
        "--postgres [URL]",
        "--no-durable",
        "--statement-timeout S|none",
        "--debug",
        *LOGGING,
    ],
    "db": ["ACTION", *DB_OPTIONS],
    "db upgrade": ["REVISION", *DB_OPTIONS],
    "db downgrade": ["REVISION", *DB_OPTIONS],
    "db current": DB_OPTIONS,
    "db check": DB_OPTIONS,
    "worker": [
        "MODULE:OBJECT",
        *QUEUE_WHERE,
        "--concurrency N",
        "--grace-period S",
        *POLICY,
        "--debug",
        *LOGGING,
    ],
    "dashboard": [
        *QUEUE_WHERE,
        *LOGGING,
        "--also-queue NAME",
        "--host HOST",
        "--port PORT",
        "--token TOKEN",
        "--read-only",
        "--tenant TENANT",
        "--debug",
    ],
    "queue": ["ACTION", *LOGGING],
    "queue stats": QUEUE_OPTIONS,
    "queue dead-letters": ["TENANT", "--limit N", "--after CURSOR", *QUEUE_OPTIONS],
    "queue requeue": ["TENANT", "ITEM", *QUEUE_OPTIONS],
    "queue purge-dead": ["TENANT", "--yes", *QUEUE_OPTIONS],
    "queue cancel": ["TENANT", "ITEM", "--reason TEXT", *QUEUE_OPTIONS],
    "queue pause": QUEUE_OPTIONS,
    "queue resume": QUEUE_OPTIONS,
    "queue prune": [
        "--dry-run",
        "--keep-done SECONDS",
        "--keep-cancelled SECONDS",
        "--keep-dead SECONDS",
        *QUEUE_OPTIONS,
    ],
    "queue show": ["TENANT", "ITEM", *QUEUE_OPTIONS],
    "queue queues": QUEUE_OPTIONS,
}


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([*command.split(), "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_help_describes_the_command_and_lists_every_option(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command's and db action's --help has a description and every option with its help."""
    text = _help(name, capsys)
    assert text.startswith(f"usage: statepact {name} ")
    # a description paragraph between the usage and the argument lists
    description = text.split("\n\n")[1]
    assert len(description.split()) >= 5, description
    for option in OPTIONS[name]:
        # the option, then at least a few words of help on its line or the next
        assert re.search(rf"^  {re.escape(option)}\s+\S+(\s+\S+){{2,}}", text, re.M), option


def test_db_help_says_what_url_is_and_names_each_action(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``statepact db --help``: the URL's form and variable, and a line for each action."""
    text = _help("db", capsys)
    assert re.search(r"--url URL\s+the database\s+\(postgresql://user\[:password\]@", text)
    assert re.search(r"\$STATEPACT_POSTGRES_URL, else\s+\$STATEPACT_DATABASE_URL", text)
    for action in ("upgrade", "downgrade", "current", "check"):
        assert re.search(rf"^    {action}\s+\S+(\s+\S+){{2,}}", text, re.M), action


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_option_of_every_command_has_help_text() -> None:
    """Walking the whole parser: every argument of every (sub)command says what it is."""
    seen = set()
    for path, parser in _parsers(cli.build_parser()):
        seen.add(" ".join(path))
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            what = " ".join(path) + " " + (action.option_strings or [str(action.metavar)])[0]
            assert action.help and len(action.help.split()) >= 3, what
            assert action.help != argparse.SUPPRESS, what
    assert seen == {"", *OPTIONS}


def test_the_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """``statepact --help`` names every command with a line each."""
    text = _help("", capsys)
    assert text.startswith("usage: statepact ")
    assert re.search(r"^  COMMAND\s+\w+(\s+\S+){2,}", text, re.M)
    for name in ("demo", "bench", "doctor", "db", "worker", "queue"):
        assert re.search(rf"^    {name}\s+\S+(\s+\S+){{2,}}", text, re.M), name


def test_demo_through_the_entry_point_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    """``statepact demo`` with no server: the story and the summary, exit code 0."""
    assert cli.main(["demo", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("statepact demo on memory, seed 1")
    assert "== summary (memory: in-process memory)" in out


def test_doctor_refuses_a_database_that_is_not_an_index(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """doctor --redis redis://host/x: refused before connecting, naming the database; exit 1."""
    assert cli.main(["doctor", "--redis", "redis://:hunter2@127.0.0.1:1/x"]) == 1
    out = capsys.readouterr().out
    assert (
        "REFUSED  reachable: 'redis://:***@127.0.0.1:1/x' names database 'x', which is not an index"
    ) in out
    assert "hunter2" not in out


def test_doctor_without_a_server_says_what_to_give(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to check (no option, no variable) is a usage error (exit 2) in one line."""
    for name in ("STATEPACT_REDIS_URL", "STATEPACT_POSTGRES_URL", "STATEPACT_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "statepact doctor: error: nothing to check: give --redis URL and/or --postgres URL, "
        "or set STATEPACT_REDIS_URL and/or STATEPACT_POSTGRES_URL\n"
    )


def test_the_installed_command_runs_the_demo_in_a_fresh_process() -> None:
    """The README's ``statepact demo``: the installed console script, exit 0, nothing on stderr."""
    result = run_statepact("demo", "--seed", "2")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "dead letter: globex/run-poison after 3 attempts" in result.stdout


def test_an_unknown_backing_for_bench_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse refuses a bad value with the command's usage line and exit code 2."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--backend", "sqlite"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: statepact bench" in err
    assert "unknown backing sqlite; choose from memory, redis, postgres" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["demo", "--redis", "foo://:hunter2@x"],
            "statepact demo: error: --redis: 'foo://:***@x' is not a Redis URL; use "
            "redis://[user:password@]host:port/db, rediss:// for TLS, or unix://path",
        ),
        (
            ["demo", "--redis", "redis://:hunter2@127.0.0.1:1/x"],
            "statepact demo: error: --redis: 'redis://:***@127.0.0.1:1/x' names database "
            "'x', which is not an index; use redis://[:password@]host:port/<n> with n a "
            "number such as 0",
        ),
        (
            ["demo", "--postgres", "not a url"],
            "statepact demo: error: --postgres 'not a url': not a database URL; "
            "use postgresql://user[:password]@host:port/database",
        ),
        (
            ["queue", "stats", "--redis", "redis://:hunter2@127.0.0.1:1/x"],
            "statepact queue stats: error: --redis: 'redis://:***@127.0.0.1:1/x' names "
            "database 'x', which is not an index; use redis://[:password@]host:port/<n> with "
            "n a number such as 0",
        ),
        (
            ["queue", "dead-letters", "acme", "--limit", "0", "--redis", "redis://x:1/0"],
            "statepact queue dead-letters: error: --limit: must be between 1 and 1000, got 0",
        ),
        (
            ["queue", "stats", "--redis", "redis://127.0.0.1:1/0", "--namespace", "a{b"],
            "statepact queue stats: error: --namespace: must not contain '{', '}' or NUL",
        ),
        (
            ["queue", "stats", "--postgres", "postgresql://127.0.0.1:1/x", "--schema", "a-b"],
            "statepact queue stats: error: --schema: 'a-b' is not a plain SQL identifier",
        ),
        (
            ["bench", "--backend", "redis"],
            "statepact bench: error: --backend redis needs --redis URL or STATEPACT_REDIS_URL "
            "(the server to measure); nothing was run",
        ),
    ],
)
def test_a_mistake_is_one_line_saying_what_to_do(
    argv: list[str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad URL or a missing one is one line on stderr, password masked; exit code 1."""
    for name in ("STATEPACT_REDIS_URL", "STATEPACT_POSTGRES_URL", "STATEPACT_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    pytest.importorskip("redis")
    pytest.importorskip("sqlalchemy")
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err == expected + "\n"
    assert "hunter2" not in captured.out + captured.err


def test_the_command_line_loads_no_driver_until_a_server_is_asked_for() -> None:
    """Building the parser and running the memory demo import neither redis nor SQLAlchemy."""
    probe = (
        "import io, json, sys\n"
        "from statepact import cli\n"
        "from statepact.cli import demo\n"
        "parser = cli.build_parser()\n"
        "args = parser.parse_args(['demo', '--seed', '1'])\n"
        "assert demo.command(args, out=io.StringIO()) == 0\n"
        "drivers = ('redis', 'hiredis', 'sqlalchemy', 'asyncpg', 'alembic')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in drivers)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "argv",
    [
        ["db", "--url", "postgresql://u@h/d", "--debug", "check"],
        ["db", "check", "--url", "postgresql://u@h/d", "--debug"],
    ],
)
def test_db_takes_url_and_debug_before_or_after_the_action(argv: list[str]) -> None:
    """``statepact db --help`` lists --url, so it works there as well as after the action."""
    args = cli.build_parser().parse_args(argv)
    assert (args.db_action, args.url, args.debug) == ("check", "postgresql://u@h/d", True)
    args = cli.build_parser().parse_args(["db", "current"])
    assert (args.url, args.debug) == (None, False)
