"""Fixtures of the dashboard's browser tests: the distribution's headless Chromium driven by
Selenium, and ``statepact dashboard`` served in a process of its own on a real server.

The browser is ``/usr/bin/chromium`` with ``/usr/bin/chromedriver`` (``.ci/run`` installs
them from the distribution's packages); nothing is ever downloaded. Without them the
browser tests skip, saying why, and with ``STATEPACT_REQUIRE_SERVERS=1`` they fail.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[2]
#: Where the PostgreSQL browser runs save the docs' screenshots (``docs/img`` regenerates
#: the committed ones); unset, each test writes them into its own temporary directory.
SCREENSHOTS_ENV = "STATEPACT_DASHBOARD_SCREENSHOTS"


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    where = os.environ.get(SCREENSHOTS_ENV)
    return (ROOT / where) if where else tmp_path / "screenshots"


def _unavailable(why: str) -> None:
    if os.environ.get("STATEPACT_REQUIRE_SERVERS") == "1":
        pytest.fail(f"the browser tests need {why} (STATEPACT_REQUIRE_SERVERS=1)")
    pytest.skip(f"the browser tests need {why}")


@pytest.fixture(scope="session")
def chrome() -> Iterator[Any]:
    """A headless Chromium under Selenium, one for the session."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not binary.exists():
            _unavailable(f"{binary} (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium (pip install -e '.[dev]')")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    """A ``statepact dashboard`` process and its address."""

    url: str
    process: subprocess.Popen[bytes]


def serve(args: list[str], env: dict[str, str] | None = None) -> Served:
    """Start ``statepact dashboard ARGS`` on a free loopback port; wait until it answers."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "statepact.cli", "dashboard", *args, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        return _wait(process, port)
    except BaseException:
        process.kill()
        process.wait()
        process.stderr.close()  # type: ignore[union-attr]
        raise


def _wait(process: subprocess.Popen[bytes], port: int) -> Served:
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            why = process.stderr.read().decode()  # type: ignore[union-attr]
            raise AssertionError(f"the dashboard exited: {why}")
        try:
            with urllib.request.urlopen(f"{url}/queues", timeout=2) as response:
                if response.status == 200:
                    return Served(url, process)
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the dashboard did not answer within 30 s")


def stop(served: Served) -> None:
    served.process.terminate()
    try:
        served.process.wait(10)
    except subprocess.TimeoutExpired:
        served.process.kill()
        served.process.wait()
    served.process.stderr.close()  # type: ignore[union-attr]


@dataclass
class Setup:
    """What a browser test works with: the backing it writes through, the served page."""

    kind: str
    backing: Any
    url: str
    screenshots: Path


@pytest.fixture
async def postgres_setup(
    statepact_postgres_database: str, screenshots: Path
) -> AsyncIterator[Setup]:
    from statepact.queue import QueuePolicy
    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import open_backing

    settings = PostgresStoreSettings(dsn=statepact_postgres_database, pool_size=5)
    policy = QueuePolicy(max_attempts=1)
    async with await open_backing(settings, policy=policy) as backing:
        served = await asyncio.to_thread(serve, ["--postgres", statepact_postgres_database])
        try:
            yield Setup("postgres", backing, served.url, screenshots)
        finally:
            await asyncio.to_thread(stop, served)


@pytest.fixture
async def redis_setup(
    statepact_redis_url: str, statepact_redis_namespace: str, screenshots: Path
) -> AsyncIterator[Setup]:
    from pydantic import SecretStr

    from statepact.queue import QueuePolicy
    from statepact.settings import RedisStoreSettings
    from statepact.storage.redis import open_backing

    settings = RedisStoreSettings(
        dsn=SecretStr(statepact_redis_url),
        namespace=statepact_redis_namespace,
        tx_prefix=statepact_redis_namespace,
        durable=False,
    )
    policy = QueuePolicy(max_attempts=1)
    async with await open_backing(settings, policy=policy) as backing:
        args = ["--redis", statepact_redis_url, "--namespace", statepact_redis_namespace]
        served = await asyncio.to_thread(serve, [*args, "--no-durable"])
        try:
            yield Setup("redis", backing, served.url, screenshots)
        finally:
            await asyncio.to_thread(stop, served)
