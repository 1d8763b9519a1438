"""The Alembic revisions on a real PostgreSQL: upgrade, downgrade, no drift, the CLI, the wheel.

- ``upgrade head`` on an empty database creates every table of the metadata
  and writes the ``adk_schema`` version row; ``downgrade base`` removes them.
- The head revision and ``schema.metadata`` do not drift: Alembic's
  autogenerate comparison finds nothing.
- ``alembic/env.py`` takes a connection handed to it (``migrate.upgrade``) or a
  URL (the ``alembic`` command with ``-x url=``); two upgrades at once apply
  the revisions once.
- ``statepact db ...`` works in this checkout and from the wheel installed in a
  fresh virtualenv (the wheel ships the revisions; marked slow).
- the installed ``statepact db check`` passes right after ``db upgrade`` and
  fails, naming the drift, after a manual ``ALTER TABLE`` or ``DROP INDEX``.
- a database an earlier release stamped with the bare ids ``0001``-``0003``
  reads as the prefixed ids, upgrades cleanly and has its record rewritten;
- ``statepact db upgrade|downgrade --sql`` prints scripts without a database,
  which applied build (and remove) a schema ``verify()`` and ``check()`` accept.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import venv
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from statepact import cli
from statepact.clock import ManualClock
from statepact.errors import SchemaVersionError
from statepact.storage.postgres import PostgresStateStore, migrate
from statepact.storage.postgres.schema import SCHEMA_VERSION, metadata
from tests._cli import run_statepact
from tests.fixtures.postgres import (
    apply_sql_script,
    run_in_thread,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
OWN_TABLES = frozenset(metadata.tables)


async def _tables(url: str) -> set[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            )
            return {row[0] for row in rows}
    finally:
        await engine.dispose()


async def _scalar(url: str, sql: str) -> object:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text(sql))).scalar()
    finally:
        await engine.dispose()


def _drift(connection: Connection) -> list[object]:
    context = MigrationContext.configure(
        connection,
        opts={
            "compare_type": True,
            "compare_server_default": True,
            "include_name": lambda name, type_, _parents: (
                name in OWN_TABLES if type_ == "table" else True
            ),
        },
    )
    return list(compare_metadata(context, metadata))


async def test_upgrade_head_on_an_empty_database(empty_database_url: str) -> None:
    """upgrade head creates every table of the metadata and the version rows."""
    assert await migrate.current(empty_database_url) is None
    await migrate.upgrade(empty_database_url)
    tables = await _tables(empty_database_url)
    assert tables >= OWN_TABLES
    assert "statepact_alembic_version" in tables
    assert "alembic_version" not in tables
    assert await migrate.current(empty_database_url) == migrate.head()
    version = await _scalar(
        empty_database_url, "SELECT version FROM adk_schema WHERE component = 'statepact'"
    )
    assert version == SCHEMA_VERSION
    assert await _scalar(empty_database_url, "SELECT seq FROM statepact_meta WHERE id = 1") == 0


async def test_head_and_metadata_do_not_drift(empty_database_url: str) -> None:
    """Autogenerate against the metadata finds no difference with the head revision."""
    await migrate.upgrade(empty_database_url)
    engine = create_async_engine(empty_database_url)
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(_drift) == []
    finally:
        await engine.dispose()
    assert await migrate.check(empty_database_url) == []


async def test_downgrade_base_then_upgrade_again(empty_database_url: str) -> None:
    """downgrade base removes every statepact table; upgrading again rebuilds them."""
    await migrate.upgrade(empty_database_url)
    await migrate.downgrade(empty_database_url, "base")
    tables = await _tables(empty_database_url)
    assert not (OWN_TABLES & tables)
    assert await migrate.current(empty_database_url) is None
    assert await _scalar(empty_database_url, "SELECT to_regclass('adk_work_token_seq')") is None
    await migrate.upgrade(empty_database_url)
    assert await _tables(empty_database_url) >= OWN_TABLES


async def test_each_revision_goes_up_and_down(empty_database_url: str) -> None:
    """Every revision upgrades and downgrades one step at a time."""
    shipped = list(migrate.revisions())
    for revision in shipped:
        await migrate.upgrade(empty_database_url, revision)
        assert await migrate.current(empty_database_url) == revision
    for previous in [*reversed(shipped[:-1]), None]:
        await migrate.downgrade(empty_database_url, "-1")
        assert await migrate.current(empty_database_url) == previous


async def test_two_upgrades_at_once_apply_the_revisions_once(empty_database_url: str) -> None:
    """Upgrades started together in one process take turns and apply the revisions once."""
    await asyncio.gather(*(migrate.upgrade(empty_database_url) for _ in range(3)))
    assert await migrate.current(empty_database_url) == migrate.head()
    rows = await _scalar(empty_database_url, "SELECT count(*) FROM statepact_alembic_version")
    assert rows == 1


async def test_upgrade_joins_a_callers_transaction(empty_database_url: str) -> None:
    """Handed an AsyncConnection, the revisions run in the caller's transaction."""
    engine = create_async_engine(empty_database_url)
    try:
        async with engine.connect() as conn:
            await conn.begin()
            await migrate.upgrade(conn)
            assert await migrate.current(conn) == migrate.head()
            await conn.rollback()
    finally:
        await engine.dispose()
    assert await migrate.current(empty_database_url) is None
    assert not (OWN_TABLES & await _tables(empty_database_url))


def test_the_alembic_command_takes_a_url_and_processes_take_turns(
    empty_database_url_sync: str,
) -> None:
    """`alembic -x url=...` from the checkout, three processes at once: applied once."""
    url = make_url(empty_database_url_sync).render_as_string(hide_password=False)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "alembic", "-x", f"url={url}", "upgrade", "head"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for process in processes:
        _out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    assert run_in_thread(lambda: migrate.current(empty_database_url_sync)) == migrate.head()
    count = run_in_thread(
        lambda: _scalar(empty_database_url_sync, "SELECT count(*) FROM statepact_alembic_version")
    )
    assert count == 1


def _statepact(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_statepact_db_commands(empty_database_url_sync: str) -> None:
    """statepact db upgrade/current/check/downgrade, with a plain postgresql:// URL."""
    url = make_url(empty_database_url_sync).set(drivername="postgresql")
    plain = url.render_as_string(hide_password=False)
    code, out, _err = _statepact("db", "current", "--url", plain)
    assert (code, out.strip()) == (0, "none")
    code, out, err = _statepact("db", "upgrade", "--url", plain)
    assert code == 0, err
    assert f"at revision {migrate.head()}" in out
    code, out, _err = _statepact("db", "check", "--url", plain)
    assert code == 0
    assert "matches this release" in out
    code, out, _err = _statepact("db", "downgrade", "base", "--url", plain)
    assert code == 0
    code, out, _err = _statepact("db", "check", "--url", plain)
    assert code == 1
    assert "revision is none" in out


def test_statepact_db_errors_are_one_line_without_the_password() -> None:
    """A failure prints one line naming the problem, never the URL's password."""
    code, _out, err = _statepact(
        "db", "upgrade", "--url", "postgresql://someone:s3cret-pw@127.0.0.1:9/nowhere"
    )
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "unreachable" in err
    assert "s3cret-pw" not in err
    code, _out, err = _statepact("db", "upgrade")
    assert code == 2
    assert "STATEPACT_DATABASE_URL" in err


async def _execute(url: str, statement: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("drift", "named"),
    [
        pytest.param(
            "ALTER TABLE adk_runs ADD COLUMN stray integer",
            "remove_column: adk_runs, adk_runs.stray",
            id="stray-column",
        ),
        pytest.param(
            "DROP INDEX ix_adk_runs_status_seq",
            "add_index: adk_runs.ix_adk_runs_status_seq",
            id="dropped-index",
        ),
        pytest.param(
            "ALTER TABLE adk_work SET (autovacuum_vacuum_scale_factor = 0.2)",
            "table adk_work: storage option autovacuum_vacuum_scale_factor is 0.2, expected 0.01",
            id="autovacuum-option",
        ),
    ],
)
def test_db_check_passes_after_upgrade_and_fails_after_a_manual_alter_table(
    empty_database_url_sync: str, drift: str, named: str
) -> None:
    """The installed ``statepact db check``: exit 0 right after ``db upgrade``; after a hand-made
    change to a scratch database, exit 1 with a line naming what drifted, password masked."""
    url = make_url(empty_database_url_sync)
    # The test server trusts loopback, so a password it does not need still rides in the URL.
    password = url.password or "s3cret-drift-pw"
    plain = url.set(drivername="postgresql", password=password).render_as_string(
        hide_password=False
    )
    upgrade = run_statepact("db", "upgrade", "--url", plain)
    assert upgrade.returncode == 0, upgrade.stderr
    assert f"at revision {migrate.head()}" in upgrade.stdout
    clean = run_statepact("db", "check", "--url", plain)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"matches this release (revision {migrate.head()})" in clean.stdout
    assert str(password) not in clean.stdout + clean.stderr

    run_in_thread(lambda: _execute(empty_database_url_sync, drift))
    drifted = run_statepact("db", "check", "--url", plain)
    assert drifted.returncode == 1, drifted.stdout + drifted.stderr
    assert drifted.stderr == ""
    lines = drifted.stdout.splitlines()
    assert lines[0] == f"  {named}"
    assert lines[-1].endswith(": 1 difference(s) from this release")
    assert ":***@" in lines[-1]
    assert str(password) not in drifted.stdout


@pytest.mark.slow
def test_statepact_db_upgrade_from_the_installed_wheel(
    tmp_path: Path, empty_database_url_sync: str
) -> None:
    """The wheel, installed in a fresh virtualenv with the postgres extra, runs the revisions."""
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("statepact-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"statepact[postgres] @ {wheel.as_uri()}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    # Run from a directory with no alembic/ in sight: only the wheel's copy can be used.
    url = make_url(empty_database_url_sync).render_as_string(hide_password=False)
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    upgrade = subprocess.run(
        [str(env_dir / "bin" / "statepact"), "db", "upgrade", "--url", url],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import statepact.storage.postgres.migrate as m; print(m.migrations_dir())",
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(env_dir)
    tables = run_in_thread(lambda: _tables(empty_database_url_sync))
    assert tables >= OWN_TABLES
    assert run_in_thread(lambda: migrate.current(empty_database_url_sync)) == migrate.head()


# -- revision ids of earlier releases -------------------------------------------------------


async def _stamp(url: str, revision: str) -> None:
    """Record ``revision`` as an earlier release would have (bare ids, no prefix)."""
    await _execute(url, f"UPDATE statepact_alembic_version SET version_num = '{revision}'")
    await _execute(url, f"UPDATE adk_schema SET revision = '{revision}'")


@pytest.mark.parametrize("old", ["0001", "0002", "0003"])
async def test_a_database_stamped_with_an_old_id_upgrades_cleanly(
    empty_database_url: str, old: str, clock: ManualClock
) -> None:
    """A database an earlier release left at 0001, 0002 or 0003 reads as statepact_000N,
    upgrades to head with the record rewritten, and opens."""
    new = migrate.LEGACY_REVISIONS[old]
    await migrate.upgrade(empty_database_url, new)
    await _stamp(empty_database_url, old)
    assert await migrate.current(empty_database_url) == new
    await migrate.upgrade(empty_database_url)
    rows = await _scalar(
        empty_database_url, "SELECT array_agg(version_num) FROM statepact_alembic_version"
    )
    assert rows == [migrate.head()]
    assert await migrate.check(empty_database_url) == []
    engine = create_async_engine(
        empty_database_url, connect_args={"server_settings": {"statement_timeout": "30s"}}
    )
    try:
        await PostgresStateStore.open(engine, clock=clock)
    finally:
        await engine.dispose()


async def test_old_ids_are_read_as_new_and_accepted_as_arguments(empty_database_url: str) -> None:
    """At the old 0003, current() and check() report head with nothing to do; the old ids
    work as upgrade and downgrade targets."""
    await migrate.upgrade(empty_database_url)
    await _stamp(empty_database_url, "0003")
    assert await migrate.current(empty_database_url) == migrate.head()
    assert await migrate.check(empty_database_url) == []
    await migrate.downgrade(empty_database_url, "0002")
    assert await migrate.current(empty_database_url) == "statepact_0002"
    await migrate.upgrade(empty_database_url, "0003")
    assert await migrate.current(empty_database_url) == "statepact_0003"


def test_the_alembic_command_rewrites_an_old_record(empty_database_url_sync: str) -> None:
    """`alembic -x url=... upgrade head` from the checkout on a database at the old 0002."""
    url = empty_database_url_sync
    run_in_thread(lambda: migrate.upgrade(url, "statepact_0002"))
    run_in_thread(lambda: _stamp(url, "0002"))
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "-x", f"url={url}", "upgrade", "head"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    version = run_in_thread(
        lambda: _scalar(url, "SELECT version_num FROM statepact_alembic_version")
    )
    assert version == migrate.head()


async def test_tables_made_by_another_environment_are_named_as_such(
    empty_database_url: str,
) -> None:
    """statepact's tables without a record in statepact_alembic_version (what an app's
    version_locations leaves): check() says so, and upgrade's 42P07 explains itself."""
    await migrate.upgrade(empty_database_url)
    await _execute(empty_database_url, "DROP TABLE statepact_alembic_version")
    problems = await migrate.check(empty_database_url)
    assert problems[0].startswith(f"revision is none, head is {migrate.head()}")
    assert "version_locations" in problems[0]
    with pytest.raises(SchemaVersionError, match="42P07") as caught:
        await migrate.upgrade(empty_database_url)
    assert "version_locations" in str(caught.value)


# -- offline SQL (--sql) --------------------------------------------------------------------


def test_db_upgrade_sql_touches_no_database_and_builds_what_verify_accepts(
    empty_database_url_sync: str, clock: ManualClock
) -> None:
    """`statepact db upgrade --sql` prints the script without a database (the URL in the
    environment points nowhere); applied, it builds a schema verify() and check() accept.
    `db downgrade base --sql` applied after removes every statepact table."""
    environment = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "STATEPACT_DATABASE_URL": "postgresql://nobody:pw@127.0.0.1:9/nowhere",
    }
    upgrade = run_statepact("db", "upgrade", "--sql", env=environment)
    assert upgrade.returncode == 0, upgrade.stderr
    assert upgrade.stderr == ""
    script = upgrade.stdout
    assert script.startswith("BEGIN;")
    assert script.rstrip().endswith("COMMIT;")
    assert "pg_advisory_xact_lock" in script
    url = empty_database_url_sync
    run_in_thread(lambda: apply_sql_script(url, script))
    assert run_in_thread(lambda: migrate.current(url)) == migrate.head()
    assert run_in_thread(lambda: migrate.check(url)) == []

    async def open_store() -> None:
        engine = create_async_engine(url)  # the database's own statement_timeout
        try:
            await PostgresStateStore.open(engine, clock=clock)
        finally:
            await engine.dispose()

    run_in_thread(open_store)

    downgrade = run_statepact("db", "downgrade", "base", "--sql", env=environment)
    assert downgrade.returncode == 0, downgrade.stderr
    run_in_thread(lambda: apply_sql_script(url, downgrade.stdout))
    assert not OWN_TABLES & run_in_thread(lambda: _tables(url))
    assert run_in_thread(lambda: migrate.current(url)) is None


async def test_upgrade_sql_from_a_revision_applies_the_rest(empty_database_url: str) -> None:
    """upgrade_sql("statepact_0002:head") on a database at the old 0002: the script rewrites
    the record and applies statepact_0003."""
    await migrate.upgrade(empty_database_url, "statepact_0002")
    await _stamp(empty_database_url, "0002")
    script = migrate.upgrade_sql("0002:head")
    assert "CREATE TABLE adk_runs" not in script
    await apply_sql_script(empty_database_url, script)
    assert await migrate.current(empty_database_url) == migrate.head()
    assert await migrate.check(empty_database_url) == []
