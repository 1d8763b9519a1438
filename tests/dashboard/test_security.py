"""The dashboard's refusals, over HTTP without a browser: CSRF, read-only, escaping,
no DSN password in any response, the credential, and the CLI's loopback rule."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from statepact.cli import main
from statepact.cli.dashboard import check_exposure, is_loopback
from statepact.dashboard import create_app
from statepact.models import ItemStatus, RunRecord, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.memory import open_backing

SECRET = "s3cr3t-pw"
DSN = f"postgresql://ops:{SECRET}@db.example:5432/app"
XSS = "<script>alert('x')</script>"


def _backing() -> Any:
    async def build() -> Any:
        backing = await open_backing(policy=QueuePolicy(max_attempts=1))
        await backing.queue.enqueue(WorkItem(tenant="acme", item_id="d1"))
        lease = await backing.queue.claim("w", lease_for=30)
        assert lease is not None
        await backing.queue.fail(lease, XSS)  # one attempt allowed: dead
        await backing.queue.enqueue(
            WorkItem(tenant="acme", item_id="i1", payload={"x": XSS}, unique_key="k1")
        )
        await backing.state.put_run(RunRecord(tenant="acme", run_id="r1", data={"note": XSS}))
        return backing

    return asyncio.run(build())


@pytest.fixture
def backing() -> Iterator[Any]:
    yield _backing()


def _client(backing: Any, **options: Any) -> TestClient:
    return TestClient(create_app(backing, where=DSN, **options))


PAGES = [
    "/queues",
    "/fragments/queues",
    "/items?tenant=acme&item_id=i1",
    "/items?tenant=acme&item_id=d1",
    "/fragments/item?tenant=acme&item_id=d1",
    "/confirm?action=requeue&queue=default&tenant=acme&item_id=d1",
    "/runs?tenant=acme",
    "/fragments/runs?tenant=acme",
    "/run?tenant=acme&run_id=r1",
    "/workers",
    "/metrics",
    "/items?tenant=&item_id=x",  # a refusal page
    "/run?tenant=acme&run_id=missing",
]


def _csrf(client: TestClient, path: str) -> str:
    page = client.get(path)
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, f"no CSRF field on {path}"
    return found.group(1)


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(backing: Any) -> None:
    """An action without the token, or with a wrong one, is 403 and the item stays dead."""
    client = _client(backing)
    client.get("/queues")  # the cookie
    form = {"queue": "default", "tenant": "acme", "item_id": "d1"}
    assert client.post("/actions/requeue", data=form).status_code == 403
    wrong = client.post("/actions/requeue", data={**form, "csrf": "forged.abc"})
    assert wrong.status_code == 403
    # A token from another dashboard (another secret) is refused too.
    other = _client(backing)
    stolen = _csrf(other, "/confirm?action=requeue&queue=default&tenant=acme&item_id=d1")
    assert client.post("/actions/requeue", data={**form, "csrf": stolen}).status_code == 403
    item = asyncio.run(backing.queue.get_item("acme", "d1"))
    assert item.status is ItemStatus.DEAD


def test_a_post_with_the_token_acts(backing: Any) -> None:
    """The confirmation page's form requeues the dead item."""
    client = _client(backing)
    token = _csrf(client, "/confirm?action=requeue&queue=default&tenant=acme&item_id=d1")
    form = {"queue": "default", "tenant": "acme", "item_id": "d1", "csrf": token}
    response = client.post("/actions/requeue", data=form, follow_redirects=False)
    assert response.status_code == 303
    assert asyncio.run(backing.queue.get_item("acme", "d1")).status is ItemStatus.QUEUED


def test_get_never_acts(backing: Any) -> None:
    """Actions answer POST only."""
    client = _client(backing)
    assert client.get("/actions/purge?queue=default&tenant=acme").status_code == 405
    assert asyncio.run(backing.queue.get_item("acme", "d1")).status is ItemStatus.DEAD


def test_read_only_refuses_every_action_and_shows_none(backing: Any) -> None:
    """Read-only: no action buttons, the confirmation page refused, a valid POST refused."""
    writable = _client(backing)
    token = _csrf(writable, "/confirm?action=purge&queue=default&tenant=acme")
    client = _client(backing, read_only=True, csrf_secret=None)
    page = client.get("/items?tenant=acme&item_id=d1").text
    assert 'id="requeue"' not in page and 'id="purge"' not in page
    assert client.get("/confirm?action=purge&queue=default&tenant=acme").status_code == 403
    client.cookies.set("statepact_csrf", token)
    response = client.post(
        "/actions/purge", data={"queue": "default", "tenant": "acme", "csrf": token}
    )
    assert response.status_code == 403
    assert "read-only" in response.text
    assert asyncio.run(backing.queue.get_item("acme", "d1")) is not None


def test_a_script_payload_is_rendered_inert(backing: Any) -> None:
    """A payload, error and blob holding <script> come out escaped, under a strict CSP."""
    client = _client(backing)
    for path in PAGES:
        response = client.get(path)
        assert "<script>alert" not in response.text, path
    item_page = client.get("/items?tenant=acme&item_id=i1")
    assert "&lt;script&gt;alert" in item_page.text
    history = client.get("/items?tenant=acme&item_id=d1").text
    assert '<td data-error="1">&lt;script&gt;alert' in history  # the error history's row
    assert "script-src 'self'" in item_page.headers["content-security-policy"]
    assert "&lt;script&gt;alert" in client.get("/run?tenant=acme&run_id=r1").text
    # A unique key typed into the search comes back as text, found (the payload escaped)
    # or not (the key escaped in the message).
    for key in (XSS, "k1"):
        found = client.get("/items", params={"tenant": "acme", "unique_key": key})
        assert found.status_code == 200
        assert "<script>alert" not in found.text
        assert "&lt;script&gt;alert" in found.text
    by_key = client.get("/items", params={"tenant": "acme", "unique_key": "k1"})
    assert '<td data-field="item_id">i1</td>' in by_key.text


def test_no_dsn_password_in_any_response(backing: Any) -> None:
    """The header shows where the dashboard reads, password masked, on every page."""
    client = _client(backing)
    for path in PAGES:
        response = client.get(path)
        assert SECRET not in response.text, path
        assert SECRET not in str(response.headers), path
    assert "db.example" in client.get("/queues").text


def test_a_token_is_required_when_set(backing: Any) -> None:
    """With a token: 401 without it, in by Bearer or Basic; a wrong one is 401."""
    client = _client(backing, token="tok-123")
    assert client.get("/queues").status_code == 401
    assert client.get("/metrics").status_code == 401
    assert client.get("/queues", headers={"authorization": "Bearer nope"}).status_code == 401
    assert client.get("/queues", headers={"authorization": "Bearer tok-123"}).status_code == 200
    assert client.get("/queues", auth=("ops", "tok-123")).status_code == 200


def test_the_cli_refuses_a_public_host_without_a_credential(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--host 0.0.0.0 without --token or the variable: exit 1, one line, nothing served."""
    monkeypatch.delenv("STATEPACT_DASHBOARD_TOKEN", raising=False)
    code = main(["dashboard", "--postgres", DSN, "--host", "0.0.0.0", "--port", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert "refusing to serve" in err and "STATEPACT_DASHBOARD_TOKEN" in err
    assert SECRET not in err
    args = argparse.Namespace(host="0.0.0.0", token=None, port=8765)
    assert check_exposure(args, {"STATEPACT_DASHBOARD_TOKEN": "t"}) == "t"
    assert check_exposure(argparse.Namespace(host="127.0.0.1", token=None, port=1), {}) is None
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("10.0.0.1")
