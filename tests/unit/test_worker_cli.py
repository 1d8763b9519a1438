"""``statepact worker``: what it refuses before any server is reached, and how it settles
its server and its policy (the options, the Worker's, the environment's, the default)."""

from __future__ import annotations

import argparse

import pytest

from statepact import cli
from statepact.cli import worker as worker_cli
from statepact.cli._common import CommandError, resolve_queue_server
from statepact.queue import QueuePolicy
from statepact.worker import Worker
from tests._cli import parse

ENVIRONMENT = ("STATEPACT_REDIS_URL", "STATEPACT_POSTGRES_URL", "STATEPACT_DATABASE_URL")


@pytest.fixture(autouse=True)
def no_server_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's own variables are not the test's."""
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


# Nothing listens here; each case is refused before a connection is tried.
NOWHERE = ["--redis", "redis://127.0.0.1:1/0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tests.integration._worker_app:worker", *NOWHERE, "--concurrency", "0"], "--concurrency"),
        (["tests.integration._worker_app", *NOWHERE], "is not of the form package.module:name"),
        (["tests.integration._worker_app:nope", *NOWHERE], "has no 'nope'"),
        (
            ["tests.integration._worker_app:worker", *NOWHERE, "--max-attempts", "0"],
            "--max-attempts: Input should be greater than or equal to 1",
        ),
        (
            ["tests.integration._worker_app:worker", *NOWHERE, "--jitter", "2"],
            "--jitter: Input should be less than or equal to 1",
        ),
        (
            [
                "tests.integration._worker_app:worker",
                *NOWHERE,
                "--backoff-base",
                "10",
                "--backoff-cap",
                "5",
            ],
            "--backoff-cap: must not be below backoff_base",
        ),
        (["tests.integration._worker_app:worker"], "no server given: pass --redis URL"),
        (
            ["tests.integration._worker_app:worker", "--postgres"],
            "--postgres was given without a URL, so it reads STATEPACT_POSTGRES_URL, which is "
            "not set",
        ),
    ],
)
def test_bad_arguments_exit_1_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["worker", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("statepact worker: error: ") and message in err
    assert len(err.splitlines()) == 1


def test_only_one_of_redis_and_postgres(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["worker", "x:y", "--redis", "redis://h/0", "--postgres", "postgresql://h/d"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _where(*argv: str) -> argparse.Namespace:
    args = parse(worker_cli.add_arguments, "app:worker", *argv)
    resolve_queue_server(args)
    return args


def test_the_option_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """argument > environment: an option's URL is used and the variables are not read."""
    monkeypatch.setenv("STATEPACT_POSTGRES_URL", "postgresql://env-host/db")
    monkeypatch.setenv("STATEPACT_DATABASE_URL", "postgresql://other-host/db")  # not read
    args = _where("--postgres", "postgresql://option-host/db")
    assert (args.redis, args.postgres) == (None, "postgresql://option-host/db")
    args = _where("--redis", "redis://option-host/0")
    assert (args.redis, args.postgres) == ("redis://option-host/0", None)


def test_without_an_option_the_variable_that_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEPACT_REDIS_URL", "redis://env-host/0")
    assert (_where().redis, _where().postgres) == ("redis://env-host/0", None)
    monkeypatch.delenv("STATEPACT_REDIS_URL")
    monkeypatch.setenv("STATEPACT_DATABASE_URL", "postgresql://alias-host/db")
    assert _where().postgres == "postgresql://alias-host/db"  # the older name still counts
    monkeypatch.setenv("STATEPACT_POSTGRES_URL", "postgresql://alias-host/db")
    assert _where().postgres == "postgresql://alias-host/db"  # both, the same: fine


def test_both_variables_set_need_a_bare_option_to_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEPACT_REDIS_URL", "redis://env-host/0")
    monkeypatch.setenv("STATEPACT_POSTGRES_URL", "postgresql://env-host/db")
    with pytest.raises(CommandError, match="say which server holds the queue"):
        _where()
    assert _where("--postgres").postgres == "postgresql://env-host/db"
    assert _where("--redis").redis == "redis://env-host/0"


def test_the_two_postgres_variables_must_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEPACT_POSTGRES_URL", "postgresql://one/db")
    monkeypatch.setenv("STATEPACT_DATABASE_URL", "postgresql://two/db")
    with pytest.raises(CommandError, match="name different databases"):
        _where()


def test_policy_precedence_option_then_worker_then_default() -> None:
    """Field by field: an option given, else the Worker's policy, else QueuePolicy()."""
    carried = QueuePolicy(max_attempts=3, backoff_base=2.0, backoff_cap=60.0, jitter=0.0)
    worker = Worker(policy=carried)
    assert worker_cli.carried_policy(worker) == carried
    args = parse(worker_cli.add_arguments, "app:worker", "--max-attempts", "7")
    assert worker_cli.queue_policy(args, carried) == carried.model_copy(update={"max_attempts": 7})
    assert worker_cli.queue_policy(args, None) == QueuePolicy(max_attempts=7)
    bare = parse(worker_cli.add_arguments, "app:worker")
    assert worker_cli.queue_policy(bare, carried) == carried
    assert worker_cli.queue_policy(bare, None) == QueuePolicy()
    assert worker_cli.carried_policy(Worker()) is None
    assert worker_cli.carried_policy(lambda queue: None) is None
