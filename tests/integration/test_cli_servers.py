"""Where the commands find their servers, what they print about them, and what they say
when a server or a driver is not what they need: the installed console script in a
process of its own, on real Redis and PostgreSQL, reading its output.

- Every command reads ``STATEPACT_POSTGRES_URL`` (and ``STATEPACT_REDIS_URL``) when no
  option names the server; ``STATEPACT_DATABASE_URL`` still counts; a worker started
  that way has no password in its arguments (what ``ps`` shows).
- A password holding whitespace is never printed, on any path that prints a URL.
- A database that does not exist is named; a ``postgresql+psycopg://`` URL is refused
  saying that the commands run on asyncpg, and where psycopg is not installed the
  extra is named; a database without the tables gets the upgrade advice once, with
  ``alembic upgrade head`` beside it.
- ``statepact doctor`` passes a database whose only ``statement_timeout`` is the one
  ``create_engine`` sets per connection, and refuses it with ``--statement-timeout
  none`` (no timeout anywhere).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from statepact.storage.postgres import migrate
from statepact.testing.databases import create_database, drop_database, unique_database_name
from tests._cli import installed_statepact, start_statepact

pytestmark = pytest.mark.integration

PASSWORD = "Hunter 2xyz"  # the test servers trust loopback: a password is never checked
SERVER_VARIABLES = ("STATEPACT_REDIS_URL", "STATEPACT_POSTGRES_URL", "STATEPACT_DATABASE_URL")

APP = """
from statepact.worker import Job, Worker


async def noop(job: Job) -> None:
    pass


worker = Worker(handlers={"noop": noop}, poll_interval=0.1)
"""


def environment(**more: str) -> dict[str, str]:
    """This process's environment without the server variables, plus ``more``."""
    env = {k: v for k, v in os.environ.items() if k not in SERVER_VARIABLES}
    return {**env, **more}


def with_password(url: str, password: str = PASSWORD) -> str:
    return make_url(url).set(password=password).render_as_string(hide_password=False)


def statepact(*argv: str, env: dict[str, str], cwd: Path | None = None) -> tuple[int, str]:
    """The command's exit code and its stdout and stderr together."""
    done = subprocess.run(
        [str(installed_statepact()), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=cwd,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
async def bare_migrated(statepact_postgres_url: str) -> AsyncIterator[str]:
    """A database at the head revision with no statement_timeout for its role or itself,
    as PostgreSQL makes one; dropped after."""
    name = unique_database_name("cli")
    url = await create_database(statepact_postgres_url, name, statement_timeout=None)
    await migrate.upgrade(url)
    try:
        yield url
    finally:
        await drop_database(statepact_postgres_url, name)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "noop_app.py").write_text(APP)
    return tmp_path


async def test_every_command_reads_the_postgres_url_from_the_environment(
    bare_migrated: str, app_dir: Path
) -> None:
    """No option names the database: db, queue, doctor, demo (bare --postgres) and worker
    all use STATEPACT_POSTGRES_URL, print it masked, and never print the password."""
    url = with_password(bare_migrated)
    env = environment(STATEPACT_POSTGRES_URL=url)
    shown = make_url(url).render_as_string(hide_password=True)  # ...:***@...
    transcripts: list[str] = []

    code, text = await asyncio.to_thread(statepact, "db", "current", env=env)
    assert code == 0, text
    assert text.strip() == migrate.head()
    code, text = await asyncio.to_thread(statepact, "db", "check", env=env)
    assert code == 0, text
    assert f"{shown}: matches this release" in text
    transcripts.append(text)
    code, text = await asyncio.to_thread(statepact, "queue", "stats", env=env)
    assert code == 0, text
    assert f"PostgreSQL at {shown}" in text
    transcripts.append(text)
    code, text = await asyncio.to_thread(statepact, "doctor", env=env)
    assert code == 0, text
    assert f"postgres at {shown}" in text
    transcripts.append(text)
    code, text = await asyncio.to_thread(statepact, "demo", "--postgres", "--seed", "1", env=env)
    assert code == 0, text
    assert f"server: {shown}" in text
    assert "dead letter: globex/run-poison after 3 attempts" in text
    transcripts.append(text)

    # The worker: its arguments hold no URL at all, so `ps` shows no password.
    process = await start_statepact("worker", "noop_app:worker", cwd=app_dir, env=env)
    try:
        assert process.stdout is not None
        banner = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        arguments = (await asyncio.to_thread(cmdline.read_bytes)).decode()
        process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    assert "worker\x00noop_app:worker" in arguments and "Hunter" not in arguments
    assert f"on PostgreSQL at {shown}" in banner
    transcripts.append(banner + out.decode() + err.decode())
    for transcript in transcripts:
        assert "Hunter" not in transcript and "2xyz" not in transcript, transcript


async def test_the_older_variable_still_counts_and_the_two_must_agree(
    bare_migrated: str,
) -> None:
    env = environment(STATEPACT_DATABASE_URL=bare_migrated)
    code, text = await asyncio.to_thread(statepact, "queue", "stats", env=env)
    assert code == 0, text
    code, text = await asyncio.to_thread(statepact, "db", "current", env=env)
    assert (code, text.strip()) == (0, migrate.head())
    other = make_url(bare_migrated).set(database="elsewhere").render_as_string(False)
    env = environment(STATEPACT_DATABASE_URL=other, STATEPACT_POSTGRES_URL=bare_migrated)
    for argv in (["db", "current"], ["queue", "stats"], ["doctor"]):
        code, text = await asyncio.to_thread(statepact, *argv, env=env)
        assert code in (1, 2), text
        assert "STATEPACT_POSTGRES_URL and STATEPACT_DATABASE_URL (its older name) name " in text
    # The option wins over both.
    code, text = await asyncio.to_thread(
        statepact, "db", "--url", bare_migrated, "current", env=env
    )
    assert (code, text.strip()) == (0, migrate.head())


async def test_the_redis_url_comes_from_the_environment_too(statepact_redis_url: str) -> None:
    env = environment(STATEPACT_REDIS_URL=statepact_redis_url)
    code, text = await asyncio.to_thread(
        statepact, "queue", "stats", "--namespace", "spenv", env=env
    )
    assert code == 0, text
    assert f"Redis at {statepact_redis_url}, namespace 'spenv'" in text
    code, text = await asyncio.to_thread(statepact, "doctor", env=env)
    assert code == 0, text
    assert f"redis at {statepact_redis_url}" in text


async def test_a_password_with_whitespace_is_never_printed(
    bare_migrated: str, statepact_redis_url: str, app_dir: Path
) -> None:
    """Every path that prints a URL, given one whose password holds a space: masked."""
    url = with_password(bare_migrated)
    shown = make_url(url).render_as_string(hide_password=True)
    redis_url = statepact_redis_url.replace("redis://", f"redis://:{PASSWORD}@")
    nowhere = with_password(make_url(bare_migrated).set(port=1).render_as_string(False))
    env = environment()
    runs = {
        "queue stats": ["queue", "stats", "--postgres", url],
        "doctor": ["doctor", "--postgres", url],
        "db upgrade": ["db", "upgrade", "--url", url],
        "db check": ["db", "check", "--url", url],
        "db downgrade": ["db", "--url", nowhere, "downgrade", "base"],
        "demo, unreachable": ["demo", "--postgres", nowhere],
        "bench, unreachable": ["bench", "--backend", "postgres", "--postgres", nowhere],
        "worker, unreachable": ["worker", "noop_app:worker", "--postgres", nowhere],
        "queue stats on redis": ["queue", "stats", "--redis", redis_url],
        "doctor on redis": ["doctor", "--redis", redis_url],
    }
    # Those that print where they are (a failure to connect may name no server at all).
    printing = {"queue stats", "doctor", "db upgrade", "db check", "demo, unreachable"}
    printing |= {"bench, unreachable", "doctor on redis"}
    for what, argv in runs.items():
        code, text = await asyncio.to_thread(statepact, *argv, env=env, cwd=app_dir)
        print(f"\n{what}: exit {code}\n{text.strip()}")
        assert "Hunter" not in text and "2xyz" not in text, (what, text)
        if what in printing:
            assert ":***@" in text, (what, text)
        if what in ("queue stats", "doctor", "db check"):
            assert code == 0 and shown in text, (what, text)
        if what.endswith("unreachable") or what == "db downgrade":
            assert code == 1, (what, text)


async def test_a_database_that_does_not_exist_is_named(
    statepact_postgres_url: str, app_dir: Path
) -> None:
    name = unique_database_name("gone")
    url = make_url(statepact_postgres_url).set(database=name).render_as_string(False)
    env = environment()
    expected = f'database "{name}" does not exist (SQLSTATE 3D000): create it'
    for argv in (
        ["queue", "stats", "--postgres", url],
        ["worker", "noop_app:worker", "--postgres", url],
        ["db", "--url", url, "current"],
        ["doctor", "--postgres", url],
    ):
        code, text = await asyncio.to_thread(statepact, *argv, env=env, cwd=app_dir)
        assert code == 1, text
        assert expected in text, text
        assert "DBAPIError" not in text and "Traceback" not in text, text


async def test_a_psycopg_url_is_refused_saying_the_commands_run_on_asyncpg(
    bare_migrated: str, app_dir: Path
) -> None:
    url = make_url(bare_migrated).set(drivername="postgresql+psycopg").render_as_string(False)
    env = environment()
    for argv in (
        ["queue", "stats", "--postgres", url],
        ["worker", "noop_app:worker", "--postgres", url],
        ["doctor", "--postgres", url],
    ):
        code, text = await asyncio.to_thread(statepact, *argv, env=env, cwd=app_dir)
        assert code == 1, text
        assert "postgresql+psycopg:// names another driver" in text, text
        assert "statepact's stores run on asyncpg (installed by statepact[postgres])" in text
        assert "give the same URL as postgresql://" in text
        assert "unexpected" not in text and "Traceback" not in text


HIDE_PSYCOPG = """
import sys


class _Hidden:
    def find_spec(self, name, path=None, target=None):
        if name == "psycopg" or name.startswith("psycopg."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Hidden())
"""


async def test_without_psycopg_a_psycopg_url_names_the_extra(
    bare_migrated: str, tmp_path: Path
) -> None:
    """``statepact db`` runs Alembic on the URL's own driver: psycopg, when it is not
    installed (hidden here from the command's process), is named with its extra."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HIDE_PSYCOPG)
    url = make_url(bare_migrated).set(drivername="postgresql+psycopg").render_as_string(False)
    env = environment(PYTHONPATH=str(hook))
    code, text = await asyncio.to_thread(statepact, "db", "--url", url, "current", env=env)
    assert code == 1, text
    assert text.strip() == (
        "statepact db current: error: psycopg is not installed: "
        "pip install 'statepact[postgres-sync]'"
    )
    # The same process with psycopg visible runs the migrations' query on it.
    code, text = await asyncio.to_thread(
        statepact, "db", "--url", url, "current", env=environment()
    )
    assert (code, text.strip()) == (0, migrate.head())


async def test_missing_tables_are_one_line_with_both_upgrades(
    empty_database_url: str, app_dir: Path
) -> None:
    env = environment()
    for argv in (
        ["queue", "stats", "--postgres", empty_database_url],
        ["worker", "noop_app:worker", "--postgres", empty_database_url],
    ):
        code, text = await asyncio.to_thread(statepact, *argv, env=env, cwd=app_dir)
        assert code == 1, text
        (line,) = [line for line in text.splitlines() if "error:" in line]
        assert "table 'adk_schema' does not exist" in line
        assert line.count("statepact db upgrade") == 1, line
        assert "`alembic upgrade head`" in line


async def test_doctor_passes_the_timeout_create_engine_sets_and_refuses_none_anywhere(
    bare_migrated: str,
) -> None:
    """The role and the database set no statement_timeout: the application's engine from
    create_engine sets 30 s per connection, so doctor passes (saying where it came from);
    ``--statement-timeout none`` (an engine that sets none) is refused, with the fix."""
    env = environment()
    started = time.monotonic()
    code, text = await asyncio.to_thread(statepact, "doctor", "--postgres", bare_migrated, env=env)
    assert code == 0, text
    assert (
        "ok       statement_timeout: statement_timeout is 30s, set on each connection by "
        "create_engine (PostgresStoreSettings.statement_timeout)"
    ) in text
    assert text.rstrip().endswith("doctor: every check passed")
    code, text = await asyncio.to_thread(
        statepact, "doctor", "--postgres", bare_migrated, "--statement-timeout", "5", env=env
    )
    assert code == 0 and "statement_timeout is 5s, set on each connection" in text, text
    code, text = await asyncio.to_thread(
        statepact, "doctor", "--postgres", bare_migrated, "--statement-timeout", "none", env=env
    )
    assert code == 1, text
    assert "REFUSED  statement_timeout: statement_timeout is 0 (no limit)" in text
    assert "fix: ALTER ROLE <role> SET statement_timeout" in text
    assert "doctor: 1 check(s) refused" in text
    assert "WARNING" not in text  # verify()'s own log line is the check's, said once
    print(f"\nthree doctor runs: {time.monotonic() - started:.1f} s")
