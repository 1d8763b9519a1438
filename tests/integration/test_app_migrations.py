"""An application's own Alembic pipeline with statepact in it, on a real PostgreSQL.

Each test builds, in a temporary directory, what a user has: ``alembic init -t
async migrations`` (Alembic's own template), an ``orders`` table in the
application's own ``MetaData``, and the ``env.py`` of docs/adopting.md written
out verbatim (the block marked ``file migrations/env.py``). The ``alembic`` and
``statepact`` commands then run as a user runs them, in subprocesses:

- the application's autogenerate and ``alembic check`` find nothing to do with
  the filter, and without it (the same file with the filter lines taken out)
  write a drop_table for every statepact table: the filter matters;
- ``alembic upgrade head`` builds both schemas in one transaction;
  ``statepact db current|check`` and ``statepact doctor`` see statepact at head;
- the application's downgrade, stamp, revision and check leave statepact's tables
  alone; ``statepact db downgrade base`` removes them;
- ``alembic upgrade head --sql`` writes one script with both schemas, which
  applied to an empty database builds a schema ``verify()`` accepts;
- a database stamped by an earlier release (bare ids) is brought along.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from statepact.clock import ManualClock
from statepact.storage.postgres import PostgresStateStore, migrate
from statepact.storage.postgres.schema import metadata
from tests.fixtures.postgres import (
    apply_sql_script,
    create_database,
    drop_database,
    run_in_thread,
    unique_database_name,
)
from tests.unit.test_docs_examples import recipe_file

pytestmark = pytest.mark.integration

STATEPACT_TABLES = frozenset(metadata.tables) | {migrate.VERSION_TABLE}
MODELS = """\
import sqlalchemy as sa

metadata = sa.MetaData()

orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("item", sa.Text, nullable=False),
)
"""
FILTER_LINE = (
    "        include_name=statepact_migrate.include_name,  # statepact: not the app's tables\n"
)
BIN = Path(sys.executable).parent


@dataclass
class App:
    """An application directory with its own Alembic environment, on its own database."""

    root: Path
    url: str  # postgresql+asyncpg://..., password included

    @property
    def plain_url(self) -> str:
        return make_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False)

    def run(self, tool: str, *argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        environment = {k: v for k, v in os.environ.items() if k != "STATEPACT_DATABASE_URL"}
        done = subprocess.run(
            [str(BIN / tool), *argv],
            cwd=self.root,
            env=environment,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if ok:
            assert done.returncode == 0, f"{tool} {argv}: {done.stdout}\n{done.stderr}"
        return done

    def alembic(self, *argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("alembic", *argv, ok=ok)

    def statepact(self, *argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("statepact", *argv, ok=ok)

    def env_py(self, code: str) -> None:
        (self.root / "migrations" / "env.py").write_text(code, encoding="utf-8")

    def autogenerate(self, message: str) -> str:
        """Run ``alembic revision --autogenerate``; the body of the new file's upgrade()."""
        before = set((self.root / "migrations" / "versions").glob("*.py"))
        self.alembic("revision", "--autogenerate", "-m", message)
        (new,) = set((self.root / "migrations" / "versions").glob("*.py")) - before
        source = new.read_text(encoding="utf-8")
        return source.split("def upgrade() -> None:", 1)[1].split("def downgrade() -> None:", 1)[0]

    def discard_revision(self, message: str) -> None:
        for path in (self.root / "migrations" / "versions").glob(f"*_{message}.py"):
            path.unlink()


def _statements(body: str) -> list[str]:
    """The code lines of an upgrade() body: no comments, docstring or blank lines."""
    return [
        line.strip()
        for line in body.splitlines()
        if line.strip() and not line.strip().startswith(("#", '"""'))
    ]


def _app(tmp_path: Path, url: str) -> App:
    root = tmp_path / "app"
    root.mkdir()
    app = App(root, url)
    app.alembic("init", "-t", "async", "migrations")
    ini = (root / "alembic.ini").read_text(encoding="utf-8")
    ini, count = re.subn(
        r"^sqlalchemy\.url = .*$", f"sqlalchemy.url = {url.replace('%', '%%')}", ini, flags=re.M
    )
    assert count == 1
    assert "prepend_sys_path = ." in ini  # the template puts the app's directory on sys.path
    (root / "alembic.ini").write_text(ini, encoding="utf-8")
    (root / "myapp").mkdir()
    (root / "myapp" / "__init__.py").write_text("", encoding="utf-8")
    (root / "myapp" / "models.py").write_text(MODELS, encoding="utf-8")
    app.env_py(recipe_file("migrations/env.py"))
    return app


@pytest.fixture
def app(tmp_path: Path, empty_database_url_sync: str) -> App:
    return _app(tmp_path, empty_database_url_sync)


async def _query(url: str, sql: str) -> list[Any]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return [tuple(row) for row in await conn.execute(text(sql))]
    finally:
        await engine.dispose()


def query(url: str, sql: str) -> list[Any]:
    return run_in_thread(lambda: _query(url, sql))


def tables(url: str) -> set[str]:
    rows = query(url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    return {row[0] for row in rows}


def test_the_recipe_is_alembic_s_async_template_plus_statepact_lines(app: App) -> None:
    """The docs' env.py is the template's, with only the statepact lines (and the app's
    MetaData) added: a user can follow it line by line."""
    recipe = recipe_file("migrations/env.py")
    assert recipe.count("statepact_migrate.upgrade_from_env()") == 2
    assert recipe.count(FILTER_LINE) == 2
    for must in ("async_engine_from_config", "connection.run_sync(do_run_migrations)"):
        assert must in recipe


def test_upgrade_head_builds_both_schemas_and_statepact_reports_head(app: App) -> None:
    """The app's autogenerate sees only its own table; `alembic upgrade head` builds both
    schemas; `statepact db current|check` and `statepact doctor` find statepact at head."""
    body = app.autogenerate("orders")
    assert "op.create_table('orders'" in body or 'op.create_table("orders"' in body
    assert "adk_" not in body and "statepact" not in body
    # `alembic revision` is not an upgrade: statepact's tables were not created by it.
    assert not tables(app.url) & STATEPACT_TABLES

    app.alembic("upgrade", "head")
    assert tables(app.url) >= STATEPACT_TABLES | {"orders", "alembic_version"}
    (app_head,) = query(app.url, "SELECT version_num FROM alembic_version")
    assert app_head[0] != migrate.head()
    assert query(app.url, f"SELECT version_num FROM {migrate.VERSION_TABLE}") == [(migrate.head(),)]

    current = app.statepact("db", "current", "--url", app.plain_url)
    assert current.stdout.strip() == migrate.head()
    check = app.statepact("db", "check", "--url", app.plain_url)
    assert f"matches this release (revision {migrate.head()})" in check.stdout
    doctor = app.statepact("doctor", "--postgres", app.plain_url)
    assert f"at the head revision ({migrate.head()})" in doctor.stdout, doctor.stdout
    # statepact's own command agrees there is nothing left to do.
    again = app.statepact("db", "upgrade", "--url", app.plain_url)
    assert f"at revision {migrate.head()}" in again.stdout

    # The app's next autogenerate, and `alembic check`, find nothing to do.
    assert _statements(app.autogenerate("nothing")) == ["pass"]
    app.discard_revision("nothing")
    checked = app.alembic("check")
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr

    # Running it again applies nothing twice.
    app.alembic("upgrade", "head")
    assert query(app.url, f"SELECT count(*) FROM {migrate.VERSION_TABLE}") == [(1,)]


def test_without_the_filter_autogenerate_drops_statepact_s_tables(app: App) -> None:
    """The same env.py with the filter lines taken out: autogenerate writes a drop_table for
    every statepact table and its version table, and `alembic check` fails. With
    include_object instead of include_name it is clean again."""
    app.autogenerate("orders")
    app.alembic("upgrade", "head")

    recipe = recipe_file("migrations/env.py")
    app.env_py(recipe.replace(FILTER_LINE, ""))
    body = app.autogenerate("unfiltered")
    dropped = set(re.findall(r"op\.drop_table\(['\"](\w+)['\"]", body))
    assert dropped == STATEPACT_TABLES, sorted(dropped ^ STATEPACT_TABLES)
    # 15 of statepact's own, 4 of ADK's, 4 of LangGraph's, the dashboard's worker registry
    assert len(dropped) == 24
    app.discard_revision("unfiltered")
    assert app.alembic("check", ok=False).returncode != 0

    with_objects = recipe.replace(
        "include_name=statepact_migrate.include_name,",
        "include_object=statepact_migrate.include_object,",
    )
    assert with_objects != recipe
    app.env_py(with_objects)
    assert _statements(app.autogenerate("objects")) == ["pass"]


def test_the_app_s_other_commands_leave_statepact_alone(app: App) -> None:
    """downgrade, stamp and current run the app's env.py without touching statepact's
    tables; `statepact db downgrade base` removes them and leaves the app's."""
    app.autogenerate("orders")
    app.alembic("upgrade", "head")
    app.alembic("downgrade", "base")
    assert "orders" not in tables(app.url)
    assert query(app.url, f"SELECT version_num FROM {migrate.VERSION_TABLE}") == [(migrate.head(),)]
    app.alembic("stamp", "head")
    app.alembic("current")
    assert "orders" not in tables(app.url)  # stamped, not upgraded
    assert tables(app.url) >= STATEPACT_TABLES
    app.alembic("stamp", "base")
    app.alembic("upgrade", "head")
    app.statepact("db", "downgrade", "base", "--url", app.plain_url)
    left = tables(app.url)
    assert "orders" in left
    assert not left & frozenset(metadata.tables)
    current = app.statepact("db", "current", "--url", app.plain_url)
    assert current.stdout.strip() == "none"
    # The app's next upgrade brings statepact's tables back.
    app.alembic("upgrade", "head")
    assert tables(app.url) >= STATEPACT_TABLES


def test_a_failing_app_revision_rolls_statepact_s_back_too(app: App) -> None:
    """One transaction for both lineages: an app revision that fails leaves no statepact
    table behind either."""
    app.autogenerate("orders")
    versions = app.root / "migrations" / "versions"
    (revision,) = versions.glob("*_orders.py")
    source = revision.read_text(encoding="utf-8")
    revision.write_text(
        source.replace("    # ### end Alembic commands ###", '    op.execute("SELECT 1/0")', 1),
        encoding="utf-8",
    )
    failed = app.alembic("upgrade", "head", ok=False)
    assert failed.returncode != 0
    assert "division by zero" in failed.stderr
    assert not tables(app.url) & (STATEPACT_TABLES | {"orders"})


def test_the_app_s_offline_script_builds_both_schemas(
    app: App, statepact_postgres_url: str, clock: ManualClock
) -> None:
    """`alembic upgrade head --sql` writes statepact's revisions into the app's script,
    inside its one transaction; applied to an empty database it builds both schemas, and
    verify() and `statepact db check` accept statepact's."""
    app.autogenerate("orders")
    script = app.alembic("upgrade", "head", "--sql").stdout
    assert script.count("BEGIN;") == 1
    assert script.count("COMMIT;") == 1
    assert script.index(f"CREATE TABLE {migrate.VERSION_TABLE}") < script.index(
        "CREATE TABLE orders"
    )
    assert not tables(app.url) & STATEPACT_TABLES  # offline: the app's database untouched

    name = unique_database_name("sql")
    target = run_in_thread(lambda: create_database(statepact_postgres_url, name))
    try:
        run_in_thread(lambda: apply_sql_script(target, script))
        assert tables(target) >= STATEPACT_TABLES | {"orders", "alembic_version"}
        assert run_in_thread(lambda: migrate.check(target)) == []
        run_in_thread(lambda: _open_state_store(target, clock))
    finally:
        run_in_thread(lambda: drop_database(statepact_postgres_url, name))


def test_a_range_script_needs_statepact_s_own_start(app: App) -> None:
    """`alembic upgrade A:B --sql` is refused without -x statepact_from, and with
    statepact_from=head holds none of statepact's statements."""
    app.autogenerate("orders")
    (revision,) = (app.root / "migrations" / "versions").glob("*_orders.py")
    rev_id = revision.name.split("_", 1)[0]
    refused = app.alembic("upgrade", f"base:{rev_id}", "--sql", ok=True)
    assert "CREATE TABLE adk_runs" in refused.stdout  # from base: statepact's too
    ranged = app.alembic("upgrade", f"{rev_id}:head", "--sql", ok=False)
    assert ranged.returncode != 0
    assert "statepact_from" in ranged.stderr
    none = app.alembic("-x", "statepact_from=head", "upgrade", f"{rev_id}:head", "--sql")
    assert "adk_" not in none.stdout and "statepact_" not in none.stdout
    some = app.alembic("-x", "statepact_from=statepact_0002", "upgrade", f"{rev_id}:head", "--sql")
    assert "CREATE TABLE adk_run_writes" in some.stdout
    assert "CREATE TABLE adk_runs" not in some.stdout


def test_a_database_stamped_by_an_earlier_release_is_brought_along(app: App) -> None:
    """statepact's tables recorded under the bare id 0002 (as releases before the prefix
    did): the app's `alembic upgrade head` rewrites the record and applies statepact_0003."""
    run_in_thread(lambda: migrate.upgrade(app.url, "statepact_0002"))
    query_exec(app.url, f"UPDATE {migrate.VERSION_TABLE} SET version_num = '0002'")
    assert app.statepact("db", "current", "--url", app.plain_url).stdout.strip() == (
        "statepact_0002"
    )
    app.autogenerate("orders")
    app.alembic("upgrade", "head")
    assert query(app.url, f"SELECT version_num FROM {migrate.VERSION_TABLE}") == [(migrate.head(),)]
    assert "adk_run_writes" in tables(app.url)


def query_exec(url: str, sql: str) -> None:
    async def run() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.execute(text(sql))
        finally:
            await engine.dispose()

    run_in_thread(run)


async def _open_state_store(url: str, clock: ManualClock) -> None:
    engine = create_async_engine(url)
    try:
        await PostgresStateStore.open(engine, clock=clock)  # verify(): version and timeout
    finally:
        await engine.dispose()
