"""The dashboard's ASGI application: pages, live fragments, the few actions, ``/metrics``.

Starlette routes over :mod:`statepact.dashboard._data`; Jinja2 templates with
autoescaping on for every template (payloads are arbitrary JSON from the
queue's users); one small script (``static/dashboard.js``) that re-fetches the
``data-live`` fragments, so every page also works without JavaScript. Every
action is a POST carrying the CSRF token, and is refused in read-only mode.
See docs/dashboard.md.

This module must never render a DSN (only ``where``, which the caller redacted)
nor an exception's text unredacted, and never act on a GET.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import (
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from statepact._limits import MAX_ERROR_HISTORY
from statepact.clock import Clock, SystemClock
from statepact.dashboard import _data
from statepact.dashboard._security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SECURITY_HEADERS,
    CsrfSigner,
    credential_ok,
)
from statepact.dashboard.metrics import metrics_endpoint
from statepact.dashboard.workers import WorkerRegistry, registry_for
from statepact.models import AttemptError, ItemStatus, RunStatus, WorkItem
from statepact.queue import BaseWorkQueue, WorkQueue
from statepact.settings import redact_dsn
from statepact.state import StateStore

__all__ = ["ACTIONS", "WINDOWS", "build_app"]

logger = logging.getLogger("statepact.dashboard")

#: The item actions and the words their confirmation uses.
ACTIONS: dict[str, str] = {
    "cancel": "Cancel this item",
    "requeue": "Requeue this dead item (due now, attempts reset)",
    "purge": "Delete every dead item of this tenant",
}
#: The totals windows the runs page offers, by their query value: runs created within it.
WINDOWS: dict[str, timedelta] = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
_PAGES = ("queues", "items", "runs", "workers")
# A fragment's refresh interval, in milliseconds, for the script.
_LIVE_MS = 2000


class _Refused(Exception):
    """A request the dashboard refuses: its status and a message for the person."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("statepact.dashboard", "templates"),
        autoescape=True,  # every template, whatever its name: nothing is rendered raw
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["age"] = _data.age_text
    return Jinja2Templates(env=env)


class _Guard(BaseHTTPMiddleware):
    """The credential (when set), the security headers, and the CSRF cookie."""

    def __init__(self, app: Any, *, token: str | None, signer: CsrfSigner) -> None:
        super().__init__(app)
        self._token = token
        self._signer = signer

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if self._token is not None and not credential_ok(
            request.headers.get("authorization"), self._token
        ):
            response: Response = PlainTextResponse("a credential is required", status_code=401)
            response.headers["www-authenticate"] = 'Basic realm="statepact dashboard"'
        else:
            cookie = request.cookies.get(CSRF_COOKIE)
            fresh = None if self._signer.valid(cookie) else self._signer.issue()
            request.state.csrf = fresh or cookie
            response = await call_next(request)
            if fresh is not None:
                response.set_cookie(
                    CSRF_COOKIE,
                    fresh,
                    path=request.scope.get("root_path") or "/",
                    httponly=True,
                    samesite="strict",
                    secure=request.url.scheme == "https",
                )
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response


class Dashboard:
    """The handlers, over one :class:`~statepact.dashboard._data.Sources`."""

    def __init__(self, sources: _data.Sources, *, read_only: bool, signer: CsrfSigner) -> None:
        self.sources = sources
        self.read_only = read_only
        self.signer = signer
        self.templates = _templates()

    # -- rendering ----------------------------------------------------------------

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        full = {
            "base": base,
            "csrf": getattr(request.state, "csrf", ""),
            "csrf_field": CSRF_FIELD,
            "read_only": self.read_only,
            "where": self.sources.where,
            "pages": _PAGES,
            "live_ms": _LIVE_MS,
            "page": "",
            "notice": "",
            **context,
        }
        return self.templates.TemplateResponse(request, name, full, status_code=status)

    async def guarded(
        self, request: Request, handler: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """Run a handler; a refusal or a front's ``ValueError`` is a page saying why, and any
        other error a page with its text redacted (a driver's message may carry a DSN)."""
        try:
            return await handler(request)
        except _Refused as exc:
            return self.render(request, "error.html", {"message": exc.message}, exc.status)
        except (ValueError, TypeError) as exc:
            message = redact_dsn(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return self.render(request, "error.html", {"message": message}, 400)
        except Exception as exc:
            logger.exception("dashboard: %s %s failed", request.method, request.url.path)
            message = (
                f"{type(exc).__name__}: {redact_dsn(str(exc).splitlines()[0] if str(exc) else '')}"
            )
            return self.render(request, "error.html", {"message": message}, 500)

    # -- pages -------------------------------------------------------------------

    async def queues(self, request: Request, fragment: bool = False) -> Response:
        views = await _data.queue_views(self.sources)
        name = "_queues.html" if fragment else "queues.html"
        notice = _notice(request)
        context = {
            "page": "queues",
            "views": views,
            "notice": notice,
            "rate_minutes": _data.RATE_MINUTES,
        }
        return self.render(request, name, context)

    async def items(self, request: Request, fragment: bool = False) -> Response:
        params = request.query_params
        queue_name = params.get("queue") or next(iter(self.sources.queues))
        tenant = params.get("tenant", "").strip()
        item_id = params.get("item_id", "").strip()
        unique_key = params.get("unique_key", "").strip()
        queue = self.sources.queue(queue_name)
        item: WorkItem | None = None
        dead: list[WorkItem] = []
        looked = bool(tenant and (item_id or unique_key))
        if tenant and item_id:
            item = await queue.get_item(tenant, item_id)
        elif tenant and unique_key:
            if not isinstance(queue, BaseWorkQueue):
                raise _Refused(400, "unique_key: this queue cannot be searched by unique key")
            item = await queue.find_unique(tenant, unique_key)
        history: list[AttemptError] | None = None
        if item is not None and isinstance(queue, BaseWorkQueue):
            history = await queue.error_history(item.tenant, item.item_id)
        if tenant:
            dead = await queue.dead_letters(tenant, limit=20)
        context = {
            "page": "items",
            "queue_names": list(self.sources.queues),
            "queue": queue_name,
            "tenant": tenant,
            "item_id": item_id,
            "unique_key": unique_key,
            "item": item,
            "fields": _data.item_fields(item) if item else [],
            "history": history,
            "history_cap": MAX_ERROR_HISTORY,
            "looked": looked,
            "dead": dead,
            "notice": _notice(request),
            "query": urlencode(
                {
                    "queue": queue_name,
                    "tenant": tenant,
                    "item_id": item_id,
                    "unique_key": unique_key,
                }
            ),
        }
        return self.render(request, "_item.html" if fragment else "items.html", context)

    async def confirm(self, request: Request) -> Response:
        params = request.query_params
        action = params.get("action", "")
        if action not in ACTIONS:
            raise _Refused(400, f"action: unknown action {action!r}")
        self._writable()
        queue = params.get("queue", "")
        self.sources.queue(queue)
        context = {
            "page": "items",
            "action": action,
            "question": ACTIONS[action],
            "queue": queue,
            "tenant": params.get("tenant", ""),
            "item_id": params.get("item_id", ""),
        }
        return self.render(request, "confirm.html", context)

    async def runs(self, request: Request, fragment: bool = False) -> Response:
        params = request.query_params
        tenant = params.get("tenant", "").strip()
        status_text = params.get("status", "")
        session = params.get("session", "").strip() or None
        window_key = params.get("window", "24h")
        if window_key not in WINDOWS:
            raise _Refused(400, f"window: one of {', '.join(WINDOWS)}, got {window_key!r}")
        status = RunStatus(status_text) if status_text else None
        state = self._state()
        page = None
        totals = None
        if tenant:
            page = await state.list_runs(
                tenant,
                session_id=session,
                status=status,
                limit=_data.RUNS_PAGE,
                after=params.get("after") or None,
            )
            totals = await _data.run_totals(
                state,
                tenant,
                now=self.sources.clock.now(),
                window=WINDOWS[window_key],
                status=status,
                session_id=session,
            )
        query = {"tenant": tenant, "status": status_text, "session": session or ""}
        context = {
            "page": "runs",
            "tenant": tenant,
            "status": status_text,
            "statuses": [s.value for s in RunStatus],
            "session": session or "",
            "window": window_key,
            "windows": list(WINDOWS),
            "runs": page.items if page else [],
            "next": page.next if page else None,
            "totals": totals,
            "tenants": await self._known_tenants(),
            "query": urlencode({**query, "window": window_key}),
            "after": params.get("after", ""),
        }
        return self.render(request, "_runs.html" if fragment else "runs.html", context)

    async def run(self, request: Request, fragment: bool = False) -> Response:
        params = request.query_params
        tenant, run_id = params.get("tenant", ""), params.get("run_id", "")
        record = await self._state().get_run(tenant, run_id)
        if record is None:
            raise _Refused(404, f"run_id: no run {run_id!r} of tenant {tenant!r}")
        context = {
            "page": "runs",
            "run": record,
            "blob": _data.pretty_json(record.data),
            "query": urlencode({"tenant": tenant, "run_id": run_id}),
        }
        return self.render(request, "_run.html" if fragment else "run.html", context)

    async def workers(self, request: Request, fragment: bool = False) -> Response:
        registry = self.sources.registry
        listed = await registry.live() if registry is not None else []
        rows = _data.worker_rows(listed, self.sources.clock.now())
        context = {"page": "workers", "rows": rows, "has_registry": registry is not None}
        return self.render(request, "_workers.html" if fragment else "workers.html", context)

    # -- actions -----------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        self._writable()
        form = await request.form()
        if not self.signer.accepts(request.cookies.get(CSRF_COOKIE), _text(form.get(CSRF_FIELD))):
            raise _Refused(403, "CSRF token missing or wrong: reload the page and try again")
        action = request.path_params["action"]
        queue_name = _text(form.get("queue"))
        queue = self.sources.queue(queue_name)
        tenant, item_id = _text(form.get("tenant")), _text(form.get("item_id"))
        base = request.scope.get("root_path", "").rstrip("/")
        if action in ("pause", "resume"):
            await (queue.pause() if action == "pause" else queue.resume())
            return _back(f"{base}/queues", {"notice": f"{action}d"})
        if action == "cancel":
            cancelled = await queue.cancel(tenant, item_id, reason="cancelled from the dashboard")
            done = cancelled is not None and cancelled.status is ItemStatus.CANCELLED
            notice = "cancelled" if done else "not cancelled: missing or already finished"
        elif action == "requeue":
            await queue.requeue(WorkItem(tenant=tenant, item_id=item_id))
            notice = "requeued"
        elif action == "purge":
            purged = await queue.purge_dead(tenant)
            notice = f"purged {purged}"
        else:
            raise _Refused(404, f"action: unknown action {action!r}")
        where = {"queue": queue_name, "tenant": tenant, "item_id": item_id, "notice": notice}
        return _back(f"{base}/items", where)

    # -- helpers -----------------------------------------------------------------

    def _writable(self) -> None:
        if self.read_only:
            raise _Refused(403, "this dashboard is read-only: actions are turned off")

    def _state(self) -> StateStore:
        if self.sources.state is None:
            raise _Refused(404, "this dashboard was given no state store")
        return self.sources.state

    async def _known_tenants(self) -> list[str]:
        """Tenants to offer on the runs page: those the queues hold work for."""
        seen: set[str] = set(self.sources.metric_tenants)
        for queue in self.sources.queues.values():
            seen.update((await queue.stats()).tenants)
        return sorted(seen)[:200]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _notice(request: Request) -> str:
    return request.query_params.get("notice", "")[:80]


def _back(path: str, query: Mapping[str, str]) -> RedirectResponse:
    return RedirectResponse(f"{path}?{urlencode(query)}", status_code=303)


def build_app(
    *,
    queues: Mapping[str, WorkQueue],
    state: StateStore | None,
    registry: WorkerRegistry | None,
    clock: Clock | None = None,
    read_only: bool = False,
    token: str | None = None,
    where: str = "",
    csrf_secret: bytes | None = None,
    metric_tenants: Sequence[str] = (),
) -> Starlette:
    """The dashboard over explicit parts (``create_app`` builds them from a backing)."""
    if not queues:
        raise ValueError("queues: the dashboard needs at least one queue")
    if token is not None and not token:
        raise ValueError("token: must not be empty when given")
    first = next(iter(queues.values()))
    sources = _data.Sources(
        queues=dict(queues),
        state=state,
        registry=registry if registry is not None else _try_registry(first),
        clock=clock or getattr(first, "clock", None) or SystemClock(),
        where=redact_dsn(where) if where else "",
        metric_tenants=tuple(metric_tenants),
    )
    signer = CsrfSigner(csrf_secret)
    board = Dashboard(sources, read_only=read_only, signer=signer)

    def page(
        method: Callable[..., Awaitable[Response]], **options: Any
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await board.guarded(request, lambda r: method(r, **options))

        return endpoint

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{request.scope.get('root_path', '').rstrip('/')}/queues", 303)

    routes = [
        Route("/", home),
        Route("/queues", page(board.queues)),
        Route("/fragments/queues", page(board.queues, fragment=True)),
        Route("/items", page(board.items)),
        Route("/fragments/item", page(board.items, fragment=True)),
        Route("/confirm", page(board.confirm)),
        Route("/runs", page(board.runs)),
        Route("/fragments/runs", page(board.runs, fragment=True)),
        Route("/run", page(board.run)),
        Route("/fragments/run", page(board.run, fragment=True)),
        Route("/workers", page(board.workers)),
        Route("/fragments/workers", page(board.workers, fragment=True)),
        Route("/actions/{action}", page(board.act), methods=["POST"]),
        Route("/metrics", metrics_endpoint(sources)),
        Mount("/static", StaticFiles(packages=[("statepact.dashboard", "static")])),
    ]
    middleware = [Middleware(_Guard, token=token, signer=signer)]
    return Starlette(routes=routes, middleware=middleware)


def _try_registry(queue: WorkQueue) -> WorkerRegistry | None:
    try:
        return registry_for(queue)
    except (TypeError, ValueError):
        return None
