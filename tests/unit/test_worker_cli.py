"""``statepact worker``: what it refuses before any server is reached."""

from __future__ import annotations

import pytest

from statepact import cli

# Nothing listens here; each case is refused before a connection is tried.
NOWHERE = ["--redis", "redis://127.0.0.1:1/0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tests.integration._worker_app:worker", *NOWHERE, "--concurrency", "0"], "--concurrency"),
        (["tests.integration._worker_app", *NOWHERE], "is not of the form package.module:name"),
        (["tests.integration._worker_app:nope", *NOWHERE], "has no 'nope'"),
    ],
)
def test_bad_arguments_exit_1_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["worker", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("statepact worker: error: ") and message in err
    assert len(err.splitlines()) == 1


def test_redis_or_postgres_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["worker", "tests.integration._worker_app:worker"])
    assert exit_.value.code == 2
    assert "one of the arguments --redis --postgres is required" in capsys.readouterr().err
