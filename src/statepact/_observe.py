"""The one instrumentation point: the loggers, and an optional observer around every front call.

Logging is always on, through the standard :mod:`logging` loggers named in
:data:`LOGGERS` (a ``NullHandler`` on ``statepact``; the application configures
the rest). The observer is off until :func:`install` (``statepact.otel.instrument``
calls it): then the public calls listed in :data:`CALLS` (the fronts' methods that
dispatch to a backing) are replaced on their classes by wrappers that tell the
observer when each call begins and ends; :func:`uninstall` puts the originals back.
Off, a front call runs exactly the code it always ran: nothing is checked at all.
The retry paths (``_retry.call_with_failover``, ``TransactionManager.run``) call
:func:`retried`, one attribute check when nothing is installed.

What a call is told (:class:`Call`) comes from the front's own arguments and the
backing's client: a host, a port and a database name, never a URL, so never a
password. See docs/observability.md.

This module must never import OpenTelemetry or a driver, and never send anything.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CALLS",
    "LOGGERS",
    "Call",
    "CallSpec",
    "Observer",
    "Target",
    "backing_of",
    "current_call",
    "install",
    "installed",
    "retried",
    "target_of",
    "uninstall",
]

#: One logger per area; docs/observability.md lists what each logs at which level.
LOGGERS = (
    "statepact.dashboard",
    "statepact.limits",
    "statepact.observe",
    "statepact.postgres",
    "statepact.queue",
    "statepact.redis",
    "statepact.retry",
    "statepact.tx",
    "statepact.worker",
)

logging.getLogger("statepact").addHandler(logging.NullHandler())


# -- where a call goes --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """The backing a front object talks to: ``memory``, ``redis``, ``postgres`` (or a class name
    for a backing of another package), and the server's address, port and database, when known."""

    backing: str
    address: str | None = None
    port: int | None = None
    namespace: str | None = None


_BACKINGS: dict[type, str] = {}


def backing_of(obj: object) -> str:
    """``memory``, ``redis`` or ``postgres`` for statepact's backings, else the class name.

    A transaction front (``TransactionManager``, ``Transaction``) answers for its backend.
    """
    backend = _backend_of(obj)
    cls = type(backend)
    name = _BACKINGS.get(cls)
    if name is None:
        parts = cls.__module__.split(".")
        if len(parts) > 2 and parts[:2] == ["statepact", "storage"]:
            name = parts[2]
        else:
            name = cls.__name__
        _BACKINGS[cls] = name
    return name


def _backend_of(obj: object) -> object:
    manager = getattr(obj, "manager", None)  # a Transaction
    if manager is not None and not isinstance(obj, type):
        obj = manager
    backend = getattr(obj, "backend", None)  # a TransactionManager
    if backend is not None and not isinstance(obj, type):
        return backend
    return obj


_TARGETS: weakref.WeakKeyDictionary[object, Target] = weakref.WeakKeyDictionary()


def target_of(obj: object) -> Target:
    """Where ``obj`` (a store, a queue, a transaction manager or transaction) sends its calls.

    Read once per object from its client: a Redis client's connection settings, an
    SQLAlchemy engine's URL fields (host, port, database, never the password).
    """
    backend = _backend_of(obj)
    try:
        return _TARGETS[backend]
    except (KeyError, TypeError):
        pass
    found = _find_target(backend, backing_of(backend))
    try:
        _TARGETS[backend] = found
    except TypeError:  # not weak-referenceable: computed again next time
        pass
    return found


def _find_target(backend: object, backing: str) -> Target:
    if backing == "redis":
        return _redis_target(_client_of(backend))
    if backing == "postgres":
        return _postgres_target(_client_of(backend))
    return Target(backing)


def _client_of(backend: object) -> object:
    """What ``backend`` sends its calls through: its public ``client`` (a Redis client; an
    SQLAlchemy engine, connection or session)."""
    return getattr(backend, "client", None)


def _redis_target(client: object) -> Target:
    pool = getattr(client, "connection_pool", None)
    options = getattr(pool, "connection_kwargs", None)
    if isinstance(options, dict):
        path = options.get("path")
        if path:
            return Target("redis", address=str(path), namespace=str(options.get("db", 0)))
        port = options.get("port")
        return Target(
            "redis",
            address=str(options.get("host", "localhost")),
            port=int(port) if port is not None else None,
            namespace=str(options.get("db", 0)),
        )
    node_of = getattr(client, "get_default_node", None)  # a RedisCluster: database 0 only
    node = node_of() if callable(node_of) else None
    if node is not None:
        return Target("redis", address=str(node.host), port=int(node.port), namespace="0")
    return Target("redis")


def _postgres_target(client: object) -> Target:
    engine: Any = client
    engine = getattr(engine, "bind", None) or engine  # an AsyncSession's engine
    engine = getattr(engine, "engine", None) or engine  # an AsyncConnection's engine
    url = getattr(engine, "url", None)
    if url is None:
        return Target("postgres")
    host = getattr(url, "host", None) or None
    port = getattr(url, "port", None)
    return Target(
        "postgres",
        address=host,
        port=None if host is None else int(port or 5432),
        namespace=getattr(url, "database", None) or None,
    )


# -- calls --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One public call as the observer sees it.

    ``area`` is ``state``, ``queue`` or ``tx``; ``operation`` the method's name as
    called (``begin`` for ``Transaction.start``); ``tenant``, ``subject`` (a run,
    session or item id, or a transaction key) and ``collection`` (``runs``,
    ``sessions``, a transaction resource) are taken from the arguments when the
    call names them; ``queue`` is the queue's name. The ``front`` is the object
    called, for an observer that needs more.
    """

    area: str
    operation: str
    target: Target
    front: object
    tenant: str | None = None
    subject: str | None = None
    collection: str | None = None
    queue: str | None = None


Picker = Callable[[tuple[Any, ...], dict[str, Any]], tuple[str | None, str | None, str | None]]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> object:
    return args[index] if len(args) > index else kwargs.get(name)


def _ids(tenant_name: str, id_name: str | None, collection: str | None) -> Picker:
    """(tenant, id) from the first two arguments, as ``get_run(tenant, run_id)``."""

    def pick(
        args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, str | None, str | None]:
        tenant = _text(_arg(args, kwargs, 0, tenant_name))
        subject = None if id_name is None else _text(_arg(args, kwargs, 1, id_name))
        return tenant, subject, collection

    return pick


def _record(name: str, id_field: str, collection: str | None) -> Picker:
    """(tenant, id) from the record argument, as ``put_run(record)`` or ``enqueue(item)``."""

    def pick(
        args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, str | None, str | None]:
        record = _arg(args, kwargs, 0, name)
        return (
            _text(getattr(record, "tenant", None)),
            _text(getattr(record, id_field, None)),
            (collection),
        )

    return pick


def _lease(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str | None, str | None, str | None]:
    item = getattr(_arg(args, kwargs, 0, "lease"), "item", None)
    return _text(getattr(item, "tenant", None)), _text(getattr(item, "item_id", None)), None


def _keyed(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str | None, str | None, str | None]:
    """(no tenant, key, resource) from ``read(resource, key)``-shaped calls."""
    return None, _text(_arg(args, kwargs, 1, "key")), _text(_arg(args, kwargs, 0, "resource"))


def _named_resource(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str | None, str | None, str | None]:
    return None, None, _text(_arg(args, kwargs, 0, "name"))


def _nothing(
    _args: tuple[Any, ...], _kwargs: dict[str, Any]
) -> tuple[str | None, str | None, str | None]:
    return None, None, None


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One instrumented method: ``owner`` is ``"module:Class"``, ``method`` its name,
    ``operation`` the name the observer is given."""

    owner: str
    method: str
    area: str
    operation: str
    pick: Picker = _nothing


_STATE = "statepact.state:BaseStateStore"
_QUEUE = "statepact.queue:BaseWorkQueue"
_OPERATOR = "statepact._queue.operator:OperatorReads"  # BaseWorkQueue's operator reads
_TX = "statepact.tx:Transaction"
_MANAGER = "statepact.tx:TransactionManager"

#: Every call the observer sees: the fronts' public methods that reach a backing.
CALLS: tuple[CallSpec, ...] = (
    CallSpec(_STATE, "get_run", "state", "get_run", _ids("tenant", "run_id", "runs")),
    CallSpec(_STATE, "put_run", "state", "put_run", _record("record", "run_id", "runs")),
    CallSpec(_STATE, "patch_run", "state", "patch_run", _ids("tenant", "run_id", "runs")),
    CallSpec(_STATE, "list_runs", "state", "list_runs", _ids("tenant", None, "runs")),
    CallSpec(_STATE, "delete_run", "state", "delete_run", _ids("tenant", "run_id", "runs")),
    CallSpec(_STATE, "prune_runs", "state", "prune_runs", _ids("tenant", None, "runs")),
    CallSpec(_STATE, "run_totals", "state", "run_totals", _ids("tenant", None, "runs")),
    CallSpec(
        _STATE, "put_session", "state", "put_session", _record("record", "session_id", "sessions")
    ),
    CallSpec(
        _STATE, "get_session", "state", "get_session", _ids("tenant", "session_id", "sessions")
    ),
    CallSpec(_STATE, "list_sessions", "state", "list_sessions", _ids("tenant", None, "sessions")),
    CallSpec(
        _STATE,
        "delete_session",
        "state",
        "delete_session",
        _ids("tenant", "session_id", "sessions"),
    ),
    CallSpec(_QUEUE, "enqueue", "queue", "enqueue", _record("item", "item_id", None)),
    CallSpec(_QUEUE, "enqueue_many", "queue", "enqueue_many"),
    CallSpec(_QUEUE, "claim", "queue", "claim"),
    CallSpec(_QUEUE, "claim_batch", "queue", "claim_batch"),
    CallSpec(_QUEUE, "heartbeat", "queue", "heartbeat", _lease),
    CallSpec(_QUEUE, "ack", "queue", "ack", _lease),
    CallSpec(_QUEUE, "ack_many", "queue", "ack_many"),
    CallSpec(_QUEUE, "fail", "queue", "fail", _lease),
    CallSpec(_QUEUE, "release", "queue", "release", _lease),
    CallSpec(_QUEUE, "cancel", "queue", "cancel", _ids("tenant", "item_id", None)),
    CallSpec(_QUEUE, "cancel_many", "queue", "cancel_many", _ids("tenant", None, None)),
    CallSpec(_QUEUE, "pause", "queue", "pause"),
    CallSpec(_QUEUE, "resume", "queue", "resume"),
    CallSpec(_QUEUE, "paused", "queue", "paused"),
    CallSpec(_QUEUE, "prune", "queue", "prune"),
    CallSpec(_OPERATOR, "prunable", "queue", "prunable"),
    CallSpec(_OPERATOR, "dead_letters_all", "queue", "dead_letters_all"),
    CallSpec(_OPERATOR, "queues", "queue", "queues"),
    CallSpec(_OPERATOR, "find_unique", "queue", "find_unique", _ids("tenant", None, None)),
    CallSpec(_OPERATOR, "error_history", "queue", "error_history", _ids("tenant", "item_id", None)),
    CallSpec(_OPERATOR, "oldest_waiting", "queue", "oldest_waiting"),
    CallSpec(_OPERATOR, "finished_per_minute", "queue", "finished_per_minute"),
    CallSpec(_QUEUE, "set_limits", "queue", "set_limits"),
    CallSpec(_QUEUE, "limits", "queue", "limits"),
    CallSpec(_QUEUE, "reap", "queue", "reap"),
    CallSpec(_QUEUE, "dead_letters", "queue", "dead_letters", _ids("tenant", None, None)),
    CallSpec(_QUEUE, "requeue", "queue", "requeue", _record("item", "item_id", None)),
    CallSpec(_QUEUE, "purge_dead", "queue", "purge_dead", _ids("tenant", None, None)),
    CallSpec(_QUEUE, "get_item", "queue", "get_item", _ids("tenant", "item_id", None)),
    CallSpec(_QUEUE, "stats", "queue", "stats"),
    CallSpec(_QUEUE, "next_due", "queue", "next_due"),
    CallSpec(_TX, "start", "tx", "begin"),
    CallSpec(_TX, "read", "tx", "read", _keyed),
    CallSpec(_TX, "lock", "tx", "lock", _keyed),
    CallSpec(_TX, "commit", "tx", "commit"),
    CallSpec(_TX, "rollback", "tx", "rollback"),
    CallSpec(_MANAGER, "acquire_lease", "tx", "acquire_lease"),
    CallSpec(_MANAGER, "renew_lease", "tx", "renew_lease"),
    CallSpec(_MANAGER, "release_lease", "tx", "release_lease"),
    CallSpec(_MANAGER, "history", "tx", "history", _keyed),
    CallSpec(_MANAGER, "prune_history", "tx", "prune_history"),
    CallSpec(_MANAGER, "register_resource", "tx", "register_resource", _named_resource),
    CallSpec(_MANAGER, "resource_info", "tx", "resource_info", _named_resource),
    CallSpec(_MANAGER, "health_check", "tx", "health_check"),
)


class Observer(Protocol):
    """What :func:`install` takes: told when each call in :data:`CALLS` begins and ends.

    ``begin`` returns whatever ``end`` needs (a span, a start time). ``end`` gets
    the call's result, or the exception it raised (``None`` then for the result).
    ``retried`` is told of each retry: ``reason`` is ``"failover"`` (a connection
    error waited out) or ``"conflict"`` (``TransactionManager.run`` ran its
    function again); ``call`` is the call it happened under, when one is observed.
    None of them may raise: a broken observer must not break a call.
    """

    def begin(self, call: Call) -> object: ...

    def end(
        self, call: Call, scope: object, result: object, error: BaseException | None
    ) -> None: ...

    def retried(
        self,
        call: Call | None,
        *,
        reason: str,
        backing: str,
        attempt: int,
        error: BaseException,
    ) -> None: ...


class _Installed:
    """The observer in place; one object, so installing it needs no ``global``."""

    __slots__ = ("observer",)

    def __init__(self) -> None:
        self.observer: Observer | None = None


_installed = _Installed()
_originals: dict[tuple[type, str], Any] = {}
_current: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "statepact_call", default=None
)
_log = logging.getLogger("statepact.observe")


def installed() -> Observer | None:
    """The observer :func:`install` put in place, or ``None``."""
    return _installed.observer


def current_call() -> Call | None:
    """The observed call this task is inside, if an observer is installed and one is."""
    return _current.get()


def _resolve(owner: str) -> type:
    import importlib

    module, _, name = owner.partition(":")
    found = getattr(importlib.import_module(module), name)
    assert isinstance(found, type)
    return found


def _specs() -> Iterator[tuple[type, CallSpec]]:
    for spec in CALLS:
        yield _resolve(spec.owner), spec


def _wrap(function: Callable[..., Any], spec: CallSpec) -> Callable[..., Any]:
    @functools.wraps(function)
    async def observed(self: Any, *args: Any, **kwargs: Any) -> Any:
        observer = _installed.observer
        # A call made by another observed call (claim -> claim_batch) is part of it.
        if observer is None or _current.get() is not None:
            return await function(self, *args, **kwargs)
        tenant, subject, collection = spec.pick(args, kwargs)
        call = Call(
            area=spec.area,
            operation=spec.operation,
            target=target_of(self),
            front=self,
            tenant=tenant,
            subject=subject,
            collection=collection,
            queue=getattr(self, "name", None) if spec.area == "queue" else None,
        )
        token = _current.set(call)
        try:
            scope = _guard(observer.begin, call)
            try:
                result = await function(self, *args, **kwargs)
            except BaseException as exc:
                _guard(observer.end, call, scope, None, exc)
                raise
            _guard(observer.end, call, scope, result, None)
            return result
        finally:
            _current.reset(token)

    observed.__statepact_observed__ = function  # type: ignore[attr-defined]
    return observed


def _guard(hook: Callable[..., Any], *args: Any) -> Any:
    """Run an observer's hook; one that raises is logged, never passed to the caller."""
    try:
        return hook(*args)
    except Exception:
        _log.exception("statepact observer %r failed", _installed.observer)
        return None


def install(observer: Observer) -> None:
    """Put ``observer`` in place (replacing any other) and wrap the calls in :data:`CALLS`."""
    _installed.observer = observer
    for cls, spec in _specs():
        key = (cls, spec.method)
        if key in _originals:
            continue
        original = cls.__dict__[spec.method]
        _originals[key] = original
        setattr(cls, spec.method, _wrap(original, spec))


def uninstall() -> None:
    """Remove the observer and put every wrapped method back as it was; idempotent."""
    _installed.observer = None
    for (cls, method), original in list(_originals.items()):
        setattr(cls, method, original)
    _originals.clear()


def retried(*, reason: str, backing: str, attempt: int, error: BaseException) -> None:
    """Tell the observer (if any) that a call is being retried; see :class:`Observer`."""
    observer = _installed.observer
    if observer is not None:
        _guard(
            functools.partial(
                observer.retried,
                _current.get(),
                reason=reason,
                backing=backing,
                attempt=attempt,
                error=error,
            )
        )
