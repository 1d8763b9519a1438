"""The dashboard in a real headless Chromium against real servers: what an operator sees and
does. Each scenario runs on PostgreSQL and on Redis, with ``statepact dashboard`` served in
its own process and the test writing through its own backing; the PostgreSQL runs save the
screenshots of docs/dashboard.md to docs/img/."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from statepact.dashboard import registry_for, start_presence
from statepact.models import ItemStatus, RunRecord, RunStatus, WorkItem
from statepact.worker import Worker

from .conftest import SCREENSHOTS, Setup

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Page:
    """Selenium calls, each in a thread so the test's loop (and its worker) keeps running."""

    def __init__(self, driver: Any, url: str) -> None:
        self.driver = driver
        self.url = url

    async def open(self, path: str) -> None:
        await asyncio.to_thread(self.driver.get, f"{self.url}{path}")

    async def click(self, css: str) -> None:
        from selenium.webdriver.common.by import By

        def click() -> None:
            self.driver.find_element(By.CSS_SELECTOR, css).click()

        await asyncio.to_thread(click)

    async def text(self, css: str) -> str:
        from selenium.webdriver.common.by import By

        def read() -> str:
            found = self.driver.find_elements(By.CSS_SELECTOR, css)
            return str(found[0].text) if found else ""

        return await asyncio.to_thread(read)

    async def wait_for(self, css: str, check: Callable[[str], bool], seconds: float = 10) -> str:
        """The element's text once ``check`` holds, without reloading the page."""
        deadline = time.monotonic() + seconds
        seen = ""
        while time.monotonic() < deadline:
            seen = await self.text(css)
            if check(seen):
                return seen
            await asyncio.sleep(0.2)
        raise AssertionError(f"{css}: still {seen!r} after {seconds} s")

    async def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(
            self.driver.save_screenshot, str(SCREENSHOTS / f"dashboard-{name}.png")
        )


async def _enqueued_item_appears(setup: Setup, chrome: Any) -> None:
    page = Page(chrome, setup.url)
    await page.open("/queues")
    await setup.backing.queue.enqueue(
        WorkItem(tenant="acme", item_id="order-1", payload={"task": "summarise", "doc": 7})
    )
    # The queues page updates itself (no reload): acme's queued count becomes 1.
    await page.wait_for('tr[data-tenant="acme"] td[data-count="queued"]', lambda t: t == "1")
    if setup.kind == "postgres":
        await page.screenshot("queues")
    await page.open("/items?queue=default&tenant=acme&item_id=order-1")
    assert await page.text('td[data-field="status"]') == "queued"
    assert "summarise" in await page.text('td[data-field="payload"]')


async def test_an_enqueued_item_appears_postgres(postgres_setup: Setup, chrome: Any) -> None:
    """An item enqueued while the queues page is open shows up in it, then on its own page."""
    await _enqueued_item_appears(postgres_setup, chrome)


async def test_an_enqueued_item_appears_redis(redis_setup: Setup, chrome: Any) -> None:
    """An item enqueued while the queues page is open shows up in it, then on its own page."""
    await _enqueued_item_appears(redis_setup, chrome)


async def _dead_item_requeued_and_runs(setup: Setup, chrome: Any) -> None:
    queue = setup.backing.queue
    await queue.enqueue(WorkItem(tenant="acme", item_id="flaky-1", payload={"n": 1}))
    lease = await queue.claim("probe", lease_for=30)
    assert lease is not None
    await queue.fail(lease, "upstream 503")  # max_attempts=1: dead at once
    assert (await queue.get_item("acme", "flaky-1")).status is ItemStatus.DEAD

    page = Page(chrome, setup.url)
    await page.open("/items?queue=default&tenant=acme&item_id=flaky-1")
    assert await page.text('td[data-field="last_error"]') == "upstream 503"
    if setup.kind == "postgres":
        await page.screenshot("items")
    await page.click("#requeue")
    assert "Requeue" in await page.text(".question")  # the confirmation step
    await page.click("#confirm")
    await page.wait_for('td[data-field="status"]', lambda t: t in ("queued", "leased", "done"))

    ran = asyncio.Event()

    async def handler(job: Any) -> None:
        ran.set()

    worker = Worker(queue, default=handler, poll_interval=0.2, concurrency=2)
    await worker.start()
    presence = start_presence(
        queue, worker.worker_id, concurrency=2, in_flight=lambda: worker.in_flight
    )
    try:
        await asyncio.wait_for(ran.wait(), 10)
        registry = registry_for(queue)
        for _ in range(50):  # the first beat is the presence task's first step
            if [w.worker_id for w in await registry.live()] == [worker.worker_id]:
                break
            await asyncio.sleep(0.1)
        assert [w.worker_id for w in await registry.live()] == [worker.worker_id]
        await page.open("/workers")
        await page.wait_for(f'tr[data-worker="{worker.worker_id}"]', lambda t: "default" in t)
        if setup.kind == "postgres":
            await page.screenshot("workers")
    finally:
        presence.cancel()
        await asyncio.gather(presence, return_exceptions=True)
        await worker.stop()
    await page.open("/items?queue=default&tenant=acme&item_id=flaky-1")
    await page.wait_for('td[data-field="status"]', lambda t: t == "done")


async def test_a_dead_item_requeued_from_the_page_runs_postgres(
    postgres_setup: Setup, chrome: Any
) -> None:
    """Requeue (with its confirmation) from the item's page; a worker then runs it."""
    await _dead_item_requeued_and_runs(postgres_setup, chrome)


async def test_a_dead_item_requeued_from_the_page_runs_redis(
    redis_setup: Setup, chrome: Any
) -> None:
    """Requeue (with its confirmation) from the item's page; a worker then runs it."""
    await _dead_item_requeued_and_runs(redis_setup, chrome)


async def _run_counters_update_live(setup: Setup, chrome: Any) -> None:
    state = setup.backing.state
    await state.put_run(
        RunRecord(
            tenant="acme",
            run_id="run-1",
            session_id="s-1",
            status=RunStatus.RUNNING,
            data={"goal": "triage inbox", "steps": ["read", "label"]},
        )
    )
    await state.patch_run("acme", "run-1", input_tokens=120, output_tokens=30, cost="0.0042")
    page = Page(chrome, setup.url)
    await page.open("/run?tenant=acme&run_id=run-1")
    assert await page.text('td[data-counter="input_tokens"]') == "120"
    assert "triage inbox" in await page.text("#blob")
    await state.patch_run("acme", "run-1", input_tokens=80, output_tokens=20, cost="0.001")
    # No reload: the fragment refreshes itself.
    await page.wait_for('td[data-counter="input_tokens"]', lambda t: t == "200")
    cost = await page.wait_for('td[data-counter="cost"]', lambda t: t != "")
    assert Decimal(cost) == Decimal("0.0052")
    if setup.kind == "postgres":
        await page.screenshot("run")
    await page.open("/runs?tenant=acme&window=1h")
    await page.wait_for('strong[data-total="input_tokens"]', lambda t: t == "200")
    await state.patch_run("acme", "run-1", input_tokens=1)
    await page.wait_for('strong[data-total="input_tokens"]', lambda t: t == "201")
    if setup.kind == "postgres":
        await page.screenshot("runs")


async def test_a_runs_counters_update_live_postgres(postgres_setup: Setup, chrome: Any) -> None:
    """A run's tokens and cost move on its open page and in the tenant's totals."""
    await _run_counters_update_live(postgres_setup, chrome)


async def test_a_runs_counters_update_live_redis(redis_setup: Setup, chrome: Any) -> None:
    """A run's tokens and cost move on its open page and in the tenant's totals."""
    await _run_counters_update_live(redis_setup, chrome)
