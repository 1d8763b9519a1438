"""The example application (examples/orders) runs end to end, from the wheel, on a real PostgreSQL.

What a user does, in the order a user does it, with statepact installed from the
wheel this checkout builds (``python -m build --wheel``) into a fresh virtualenv
together with the example's own dependencies (its ``pyproject.toml``), and
every command run from that virtualenv in a subprocess, in a copy of
``examples/orders``, on a database created for the module with PostgreSQL's
defaults (no ``statement_timeout``):

- ``alembic upgrade head`` (the app's own environment) builds both schemas, and
  ``statepact db check`` finds statepact's clean;
- the app's ``alembic revision --autogenerate`` and ``alembic check`` find
  nothing to do; the same ``env.py`` with the filter lines taken out writes a
  ``drop_table`` for every statepact table (the filter is what keeps it empty);
- ``POST /orders`` on the app served by uvicorn: a declined payment (raised
  after the three writes, before the commit) leaves no order, no run and no
  work item; a paid one leaves all three;
- the worker (``python -m orders_app.worker``) claims the item, extends its
  lease while it works, marks the order processed, finishes and counts the run
  and acks the item, all in one transaction.

About 30 s on an idle two-core machine (85 s with three other test runs beside
it), most of it the wheel's build and the install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import text

from statepact import ItemStatus, PostgresStoreSettings, RunRecord, RunStatus, WorkItem
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue, create_engine
from statepact.storage.postgres.migrate import VERSION_TABLE
from tests.fixtures.postgres import (
    create_database,
    drop_database,
    run_in_thread,
    unique_database_name,
)
from tests.integration.test_app_migrations import (
    FILTER_LINE,  # the example's env.py has the docs' filter lines
    STATEPACT_TABLES,
    _statements,
    query,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "orders"
QUEUE = "orders"  # orders_app.settings: queue_name


def _check(done: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"{what}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with statepact from the wheel and the example's dependencies."""
    dist = tmp_path_factory.mktemp("dist")
    _check(
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        ),
        "python -m build --wheel",
    )
    (wheel,) = dist.glob("statepact-*.whl")

    root = tmp_path_factory.mktemp("venv") / "venv"
    _check(
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(root)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ),
        "python -m venv",
    )
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))
    wanted: list[str] = project["project"]["dependencies"]
    (ours,) = [r for r in wanted if re.match(r"statepact\b", r)]
    assert ours == "statepact[postgres]", ours
    requirements = [f"statepact[postgres] @ {wheel.as_uri()}"] + [r for r in wanted if r != ours]
    _check(
        subprocess.run(
            # This interpreter's pip installs into the new one: no pip bootstrapped there.
            [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install",
             "--quiet", "--no-compile", "--disable-pip-version-check", *requirements],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        ),
        "pip install",
    )  # fmt: skip
    where = _check(
        subprocess.run(
            [str(root / "bin" / "python"), "-c", "import statepact; print(statepact.__file__)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path_factory.getbasetemp(),
        ),
        "import statepact",
    )
    assert Path(where.stdout.strip()).is_relative_to(root), where.stdout  # the wheel, not src/
    return root


@dataclass
class App:
    """The copy of examples/orders, its database and the virtualenv it runs from."""

    root: Path
    url: str  # postgresql+asyncpg://..., password included
    venv: Path

    @property
    def environment(self) -> dict[str, str]:
        # PYTHONDONTWRITEBYTECODE (set on some machines) would make every command compile
        # SQLAlchemy again: the first import writes the bytecode, as on a user's machine.
        drop = {
            "PYTHONPATH",
            "PYTHONHOME",
            "PYTHONDONTWRITEBYTECODE",
            "VIRTUAL_ENV",
            "STATEPACT_DATABASE_URL",
        }
        environment = {k: v for k, v in os.environ.items() if k not in drop}
        environment["ORDERS_DATABASE_URL"] = self.url
        environment["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{environment.get('PATH', '')}"
        return environment

    def run(self, tool: str, *argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.venv / "bin" / tool), *argv],
            cwd=self.root,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return _check(done, f"{tool} {' '.join(argv)}") if ok else done

    def autogenerate(self, message: str) -> str:
        """``alembic revision --autogenerate``: the new revision's upgrade() body; the file
        is removed again."""
        versions = self.root / "migrations" / "versions"
        before = set(versions.glob("*.py"))
        self.run("alembic", "revision", "--autogenerate", "-m", message)
        (new,) = set(versions.glob("*.py")) - before
        try:
            source = new.read_text(encoding="utf-8")
        finally:
            new.unlink()
        return source.split("def upgrade() -> None:", 1)[1].split("def downgrade() -> None:")[0]


@pytest.fixture(scope="module")
def app(
    venv: Path, statepact_postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[App]:
    """The example, copied, on a new database (PostgreSQL's defaults) after its
    ``alembic upgrade head``."""
    root = tmp_path_factory.mktemp("example") / "orders"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    name = unique_database_name("example")
    url = run_in_thread(
        lambda: create_database(statepact_postgres_url, name, statement_timeout=None)
    )
    try:
        application = App(root, url, venv)
        application.run("alembic", "upgrade", "head")
        yield application
    finally:
        run_in_thread(lambda: drop_database(statepact_postgres_url, name))


def test_one_alembic_upgrade_builds_both_schemas_and_autogenerate_needs_the_filter(
    app: App,
) -> None:
    """`alembic upgrade head` built the app's table and statepact's; `statepact db check`
    is clean; the app's autogenerate and `alembic check` find nothing, and without the
    filter autogenerate drops every statepact table."""
    tables = {
        row[0]
        for row in query(
            app.url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        )
    }
    assert tables == STATEPACT_TABLES | {"orders", "alembic_version"}
    ((statepact_at,),) = query(app.url, f"SELECT version_num FROM {VERSION_TABLE}")
    assert statepact_at.startswith("statepact_")
    assert query(app.url, "SELECT version_num FROM alembic_version") == [("6b1e0c2a9f41",)]
    checked = app.run("statepact", "db", "check", "--url", app.url)
    assert f"matches this release (revision {statepact_at})" in checked.stdout, checked.stdout

    assert _statements(app.autogenerate("nothing")) == ["pass"]
    clean = app.run("alembic", "check")
    assert "No new upgrade operations detected" in clean.stdout + clean.stderr

    env_py = app.root / "migrations" / "env.py"
    original = env_py.read_text(encoding="utf-8")
    assert original.count(FILTER_LINE) == 2
    env_py.write_text(original.replace(FILTER_LINE, ""), encoding="utf-8")
    try:
        body = app.autogenerate("unfiltered")
        dropped = set(re.findall(r"op\.drop_table\(['\"](\w+)['\"]", body))
        assert dropped == STATEPACT_TABLES, sorted(dropped ^ STATEPACT_TABLES)
        assert "orders" not in body
    finally:
        env_py.write_text(original, encoding="utf-8")


@dataclass
class Server:
    process: subprocess.Popen[str]
    base_url: str


@pytest.fixture
def server(app: App, tmp_path: Path) -> Iterator[Server]:
    """The example's FastAPI app under uvicorn on a free loopback port; stopped after."""
    log = tmp_path / "uvicorn.log"
    with log.open("w", encoding="utf-8") as sink:
        process = subprocess.Popen(
            [str(app.venv / "bin" / "uvicorn"), "orders_app.api:app", "--host", "127.0.0.1",
             "--port", "0"],
            cwd=app.root,
            env=app.environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            found = re.search(r"running on (http://127\.0\.0\.1:\d+)", log.read_text("utf-8"))
            if found:
                break
            assert process.poll() is None, log.read_text("utf-8")
            assert time.monotonic() < deadline, log.read_text("utf-8")
            time.sleep(0.05)
        yield Server(process, found.group(1))
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert "Application shutdown complete" in log.read_text("utf-8"), log.read_text("utf-8")


def counts(url: str) -> tuple[int, int, int]:
    """How many orders, runs and work items the database holds."""
    ((orders, runs, work),) = query(
        url,
        "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM adk_runs), "
        "(SELECT count(*) FROM adk_work)",
    )
    return orders, runs, work


@dataclass
class Seen:
    run: RunRecord | None
    item: WorkItem | None
    order: tuple[Any, ...]


def seen(url: str, tenant: str, order_id: int) -> Seen:
    """The run and work item through statepact's API, the order row through SQL."""

    async def run() -> Seen:
        settings = PostgresStoreSettings(dsn=SecretStr(url), queue_name=QUEUE)
        engine = create_engine(settings)
        try:
            state = await PostgresStateStore.open(engine, settings=settings)
            queue = await PostgresWorkQueue.open(engine, settings=settings)
            async with engine.connect() as conn:
                (order,) = await conn.execute(
                    text("SELECT status, label, processed_at FROM orders WHERE id = :id"),
                    {"id": order_id},
                )
            return Seen(
                await state.get_run(tenant, f"order-{order_id}"),
                await queue.get_item(tenant, f"order-{order_id}"),
                tuple(order),
            )
        finally:
            await engine.dispose()

    return run_in_thread(run)


def delete_run(url: str, tenant: str, run_id: str) -> bool:
    async def run() -> bool:
        settings = PostgresStoreSettings(dsn=SecretStr(url))
        engine = create_engine(settings)
        try:
            state = await PostgresStateStore.open(engine, settings=settings)
            return await state.delete_run(tenant, run_id)
        finally:
            await engine.dispose()

    return run_in_thread(run)


def test_an_order_writes_all_three_or_none_and_the_worker_processes_it(
    app: App, server: Server
) -> None:
    """A declined payment after the writes leaves no order, run or work item; a paid order
    leaves all three; the worker marks the order processed, finishes the run and acks, and
    an item whose settling transaction fails is failed and its order left alone."""
    assert counts(app.url) == (0, 0, 0)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        order = {"customer": "acme", "item": "widget", "quantity": 2}
        declined = client.post("/orders", json={**order, "payment_token": "tok_declined"})
        assert declined.status_code == 402, declined.text
        assert "declined" in declined.json()["detail"]
        assert counts(app.url) == (0, 0, 0)

        placed = client.post("/orders", json={**order, "payment_token": "tok_visa"})
        assert placed.status_code == 201, placed.text
        body = placed.json()
        order_id = body["id"]
        assert body["status"] == "placed"
        assert (body["run_status"], body["work_status"]) == ("pending", "queued")
        other = client.post(
            "/orders", json={"customer": "globex", "item": "gear", "quantity": 1,
                             "payment_token": "tok_visa"},
        )  # fmt: skip
        assert other.status_code == 201, other.text
        # A third order whose run an operator deletes before the worker gets to it: the
        # worker's transaction fails after the work, rolls back, and the item is failed.
        orphan = client.post("/orders", json={**order, "payment_token": "tok_visa"})
        assert orphan.status_code == 201, orphan.text
        orphan_id = orphan.json()["id"]
        assert counts(app.url) == (3, 3, 3)
        assert delete_run(app.url, "acme", f"order-{orphan_id}")
        before = seen(app.url, "acme", order_id)
        assert before.run is not None and before.run.status is RunStatus.PENDING
        assert before.run.data == {"order_id": order_id, "item": "widget", "quantity": 2}
        assert before.item is not None and before.item.status is ItemStatus.QUEUED
        assert before.item.payload == {"order_id": order_id}
        assert before.order[:2] == ("placed", None)

        # A one-second lease and 1.2 s of work: the ack lands only because the lease was
        # extended meanwhile, and it is fenced on the newest token.
        worked = app.run(
            "python", "-m", "orders_app.worker", "--until-idle", "--worker-id", "w1",
            "--lease-seconds", "1", "--work-seconds", "1.2",
        )  # fmt: skip
        lines = worked.stdout.splitlines()
        assert len(lines) == 3, worked.stdout
        mine = next(line for line in lines if line.startswith(f"processed order {order_id} "))
        beats = re.search(r"lease extended (\d+) times", mine)
        assert beats is not None and int(beats.group(1)) >= 1, mine
        assert f"processed order {other.json()['id']} " in worked.stdout
        assert f"failed order {orphan_id} (acme/order-{orphan_id}): LookupError" in (worked.stdout)

        after = seen(app.url, "acme", order_id)
        label = f"PKG-{order_id:06d}-2xWIDGET"
        assert after.order[0] == "processed" and after.order[1] == label
        assert after.order[2] is not None  # processed_at
        assert after.run is not None and after.run.status is RunStatus.SUCCEEDED
        assert after.run.data == {**before.run.data, "label": label, "worker": "w1"}
        assert after.run.iterations == 1
        assert after.item is not None and after.item.status is ItemStatus.DONE
        assert after.item.attempts == 1

        shown = client.get(f"/orders/{order_id}").json()
        assert (shown["status"], shown["run_status"], shown["work_status"]) == (
            "processed",
            "succeeded",
            "done",
        )
        # The failed item waits for its retry (30 s, the example's policy), failed on the
        # newest lease (the heartbeat had replaced the claim's token), and its order was
        # left as it was: the transaction that would have marked it rolled back.
        failed = seen(app.url, "acme", orphan_id)
        assert failed.item is not None and failed.item.status is ItemStatus.QUEUED
        assert failed.item.attempts == 1
        assert (failed.item.last_error or "").startswith("LookupError: order")
        assert failed.order[:2] == ("placed", None)
        assert failed.run is None
    left = query(app.url, "SELECT item_id, status FROM adk_work WHERE status <> 'done'")
    assert left == [(f"order-{orphan_id}", "queued")]
