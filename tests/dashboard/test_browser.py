"""The dashboard in a real headless Chromium against real servers: what an operator sees and
does. Each scenario runs on PostgreSQL and on Redis, with ``statepact dashboard`` served in
its own process and the test writing through its own backing. The PostgreSQL runs take the
screenshots of docs/dashboard.md: into the test's own directory, or into the directory
``STATEPACT_DASHBOARD_SCREENSHOTS`` names (``STATEPACT_DASHBOARD_SCREENSHOTS=docs/img``
regenerates the committed ones)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeVar

import pytest

from statepact.dashboard import registry_for
from statepact.models import ItemStatus, RunRecord, RunStatus, WorkItem
from statepact.worker import Worker

from .conftest import Setup

T = TypeVar("T")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Page:
    """Selenium calls, each in a thread so the test's loop (and its worker) keeps running."""

    def __init__(self, driver: Any, setup: Setup) -> None:
        self.driver = driver
        self.url = setup.url
        self.shots = setup.screenshots

    async def open(self, path: str) -> None:
        await asyncio.to_thread(self.driver.get, f"{self.url}{path}")

    async def click(self, css: str) -> None:
        from selenium.webdriver.common.by import By

        def click() -> None:
            self.driver.find_element(By.CSS_SELECTOR, css).click()

        await self._fresh(click)

    async def type(self, css: str, text: str) -> None:
        from selenium.webdriver.common.by import By

        def type_in() -> None:
            found = self.driver.find_element(By.CSS_SELECTOR, css)
            found.clear()
            found.send_keys(text)

        await self._fresh(type_in)

    async def text(self, css: str) -> str:
        from selenium.webdriver.common.by import By

        def read() -> str:
            found = self.driver.find_elements(By.CSS_SELECTOR, css)
            return str(found[0].text) if found else ""

        return await self._fresh(read)

    async def _fresh(self, call: Callable[[], T]) -> T:
        """``call`` again when the live refresh swapped the element it found for a new one."""
        from selenium.common.exceptions import StaleElementReferenceException

        for _ in range(9):
            try:
                return await asyncio.to_thread(call)
            except StaleElementReferenceException:
                await asyncio.sleep(0.05)
        return await asyncio.to_thread(call)

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
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"dashboard-{name}.png"
        assert await asyncio.to_thread(self.driver.save_screenshot, str(path)), path


async def _enqueued_item_appears(setup: Setup, chrome: Any) -> None:
    page = Page(chrome, setup)
    await page.open("/queues")
    await setup.backing.queue.enqueue(
        WorkItem(
            tenant="acme",
            item_id="order-1",
            payload={"task": "summarise", "doc": 7},
            unique_key="summary:<doc-7>",
        )
    )
    # The queues page updates itself (no reload): acme's queued count becomes 1, and its
    # oldest wait is shown, in seconds.
    await page.wait_for('tr[data-tenant="acme"] td[data-count="queued"]', lambda t: t == "1")
    await page.wait_for('td[data-oldest="acme"]', lambda t: t.endswith(" s"))
    assert await page.text('td[data-rate="done"]') == "0.0"
    if setup.kind == "postgres":
        await page.screenshot("queues")
    await page.open("/items?queue=default&tenant=acme&item_id=order-1")
    assert await page.text('td[data-field="status"]') == "queued"
    assert "summarise" in await page.text('td[data-field="payload"]')
    # Found by its unique key through the search form (the key's "<" and ">" stay text).
    await page.open("/items?queue=default")
    await page.type('input[name="tenant"]', "acme")
    await page.type('input[name="unique_key"]', "summary:<doc-7>")
    await page.click('form.search button[type="submit"]')
    await page.wait_for('td[data-field="item_id"]', lambda t: t == "order-1")
    assert await page.text('td[data-field="unique_key"]') == "summary:<doc-7>"


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

    page = Page(chrome, setup)
    # The queues page counts the death in its last minutes: all that finished died.
    await page.open("/queues")
    assert await page.text('td[data-rate="dead"]') == "0.2"  # one item over five minutes
    assert await page.text("strong[data-failure-rate]") == "100.0 %"
    await page.open("/items?queue=default&tenant=acme&item_id=flaky-1")
    assert await page.text('td[data-field="last_error"]') == "upstream 503"
    assert await page.text('td[data-error="1"]') == "upstream 503"  # the error history
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
    await worker.start()  # it announces itself in the registry the workers page reads
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
        await worker.stop()
    assert await registry.live() == []  # a stopped worker leaves the registry
    await page.open("/items?queue=default&tenant=acme&item_id=flaky-1")
    await page.wait_for('td[data-field="status"]', lambda t: t == "done")
    # Requeued and run: it counts as done now, no longer as dead.
    await page.open("/queues")
    assert await page.text('td[data-rate="done"]') == "0.2"
    assert await page.text("strong[data-failure-rate]") == "0.0 %"


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


async def _cancel_stops_the_handler(setup: Setup, chrome: Any) -> None:
    queue = setup.backing.queue
    started = asyncio.Event()
    cut: list[float] = []

    async def handler(job: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cut.append(time.monotonic())
            raise

    worker = Worker(queue, default=handler, poll_interval=0.2, concurrency=1)
    await worker.start()
    try:
        await queue.enqueue(
            WorkItem(tenant="acme", item_id="long-1", payload={"doc": "long report"})
        )
        await asyncio.wait_for(started.wait(), 10)
        page = Page(chrome, setup)
        await page.open("/items?queue=default&tenant=acme&item_id=long-1")
        assert await page.text('td[data-field="status"]') == "leased"
        await page.click("#cancel")
        assert "Cancel" in await page.text(".question")  # the confirmation step
        confirmed = time.monotonic()
        await page.click("#confirm")
        await page.wait_for('td[data-field="status"]', lambda t: t == "cancelled")
        for _ in range(40):
            if cut:
                break
            await asyncio.sleep(0.05)
        assert cut, "the running handler was not cancelled"
        took = cut[0] - confirmed
        print(f"{setup.kind}: handler cancelled {took:.2f} s after the page's confirm")
        assert took < 2.0
        item = await queue.get_item("acme", "long-1")
        assert item is not None and item.status is ItemStatus.CANCELLED
        assert worker.in_flight == 0
    finally:
        await worker.stop()


async def test_a_running_item_cancelled_from_the_page_stops_its_handler_postgres(
    postgres_setup: Setup, chrome: Any
) -> None:
    """Cancel (with its confirmation) on a leased item's page: the worker running it sees
    CancelledError in its handler within two seconds; the item is cancelled."""
    await _cancel_stops_the_handler(postgres_setup, chrome)


async def test_a_running_item_cancelled_from_the_page_stops_its_handler_redis(
    redis_setup: Setup, chrome: Any
) -> None:
    """Cancel (with its confirmation) on a leased item's page: the worker running it sees
    CancelledError in its handler within two seconds; the item is cancelled."""
    await _cancel_stops_the_handler(redis_setup, chrome)


async def _pause_stops_claims(setup: Setup, chrome: Any) -> None:
    queue = setup.backing.queue
    page = Page(chrome, setup)
    await page.open("/queues")
    assert await page.text("#toggle-default") == "Pause"
    await page.click("#toggle-default")
    await page.wait_for("#paused-default", lambda t: t == "paused")
    assert await queue.paused()
    if setup.kind == "postgres":
        await page.screenshot("queues-paused")

    ran = asyncio.Event()

    async def handler(job: Any) -> None:
        ran.set()

    worker = Worker(queue, default=handler, poll_interval=0.1, concurrency=2)
    await worker.start()
    try:
        await queue.enqueue(WorkItem(tenant="acme", item_id="held-1", payload={"n": 1}))
        await asyncio.sleep(1.5)  # a running worker polls and is woken; it claims nothing
        assert not ran.is_set()
        item = await queue.get_item("acme", "held-1")
        assert item is not None and item.status is ItemStatus.QUEUED
        await page.open("/queues")
        assert await page.text("#toggle-default") == "Resume"
        await page.click("#toggle-default")
        await page.wait_for("#toggle-default", lambda t: t == "Pause")
        await asyncio.wait_for(ran.wait(), 10)
    finally:
        await worker.stop()
    assert not await queue.paused()


async def test_pause_from_the_page_stops_claims_postgres(
    postgres_setup: Setup, chrome: Any
) -> None:
    """Pause on the queues page: a running worker claims nothing; Resume: it runs the item."""
    await _pause_stops_claims(postgres_setup, chrome)


async def test_pause_from_the_page_stops_claims_redis(redis_setup: Setup, chrome: Any) -> None:
    """Pause on the queues page: a running worker claims nothing; Resume: it runs the item."""
    await _pause_stops_claims(redis_setup, chrome)


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
    page = Page(chrome, setup)
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
    assert await page.text('strong[data-total="runs"]') == "1"
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
