"""The statements of ``PostgresBackend``: the ``statepact_*`` tables under ``TransactionManager``.

A commit is one call of the PL/pgSQL function ``statepact_commit`` (Alembic
revision 0004) and a lock attempt one of ``statepact_try_lock``; a snapshot is
taken with the first read, in its statement; reads, leases and the registry are
one statement each. Why the commit locks what it locks, and how a snapshot sees
exactly the commits before it: docs/backings.md#the-commit-function.

Lock rows are stamped with the server's ``now()`` (a real-time TTL, as Redis's
``PX``); every other time is a bound parameter from the injected clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    Boolean,
    Interval,
    Text,
    any_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    func,
    literal,
    select,
    table,
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert
from sqlalchemy.sql import ClauseElement
from sqlalchemy.types import JSON, UserDefinedType

from statepact.storage.postgres._sql import prune_step, shared_lock_timeout
from statepact.storage.postgres.schema import metadata

__all__ = [
    "BACKEND_TABLES",
    "PING",
    "REQUIRED_FUNCTIONS",
    "VERSION_SEQUENCE",
    "TxStatements",
    "statements",
]

# The functions PostgresBackend calls (revision 0002; statepact_commit rewritten in 0004).
REQUIRED_FUNCTIONS = (
    "statepact_commit(jsonb)",
    "statepact_try_lock(text, text, text, text, timestamptz, timestamptz)",
)
#: The version sequence of revision 0004: without it the commit function is 0002's.
VERSION_SEQUENCE = "statepact_version_seq"

_values = metadata.tables["statepact_values"]
_history = metadata.tables["statepact_history"]
_resources = metadata.tables["statepact_resources"]
_leases = metadata.tables["statepact_leases"]
_locks = metadata.tables["statepact_locks"]

S = TypeVar("S")
T = TypeVar("T")
#: Every table ``clear`` empties (and nothing else).
BACKEND_TABLES = (
    "statepact_history",
    "statepact_idempotency",
    "statepact_leases",
    "statepact_locks",
    "statepact_resources",
    "statepact_values",
)


# JSON columns are read back as text (CAST(... AS TEXT) of a json column is the
# stored text byte for byte) and written from text, never through a Python dict.


class _PgSnapshot(UserDefinedType[str]):
    """PostgreSQL's ``pg_snapshot``, for casts only (no column has this type)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "pg_snapshot"


class _Xid8(UserDefinedType[str]):
    """PostgreSQL's ``xid8``, for casts only (``writer_xid`` is stored as a bigint)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "xid8"


def _sequence_now() -> Any:
    """The last version the sequence handed out (0 before the first): a snapshot's number."""
    sequence = table(VERSION_SEQUENCE, column("last_value"), column("is_called"))
    return select(case((sequence.c.is_called, sequence.c.last_value), else_=0)).scalar_subquery()


def _visible(writer_xid: Any) -> Any:
    """Whether the snapshot bound as ``snapshot`` sees the transaction that wrote a row
    (a row written before revision 0004, with no writer recorded, is seen by all)."""
    snapshot = cast(bindparam("snapshot", type_=Text), _PgSnapshot())
    return writer_xid.is_(None) | func.pg_visible_in_snapshot(
        cast(cast(writer_xid, Text), _Xid8()), snapshot
    )


def _stmt_begin() -> Any:
    # In autocommit, the statement's own snapshot is pg_current_snapshot().
    return select(cast(func.pg_current_snapshot(), Text), _sequence_now())


def _stmt_begin_read() -> Any:
    # One statement: the snapshot and the key's row as that same snapshot sees it.
    one = select(literal(1).label("one")).subquery()
    return (
        select(
            cast(func.pg_current_snapshot(), Text),
            _sequence_now(),
            cast(_values.c.data, Text),
            _values.c.version,
        )
        .select_from(one)
        .outerjoin(
            _values,
            (_values.c.resource == bindparam("resource")) & (_values.c.key == bindparam("key")),
        )
    )


def _stmt_begin_read_many() -> Any:
    # Several transactions' first reads in one statement, sharing its snapshot: the snapshot
    # and the sequence read once (a CTE), then each key's row as that snapshot sees it, a
    # probe of the primary key each (a LATERAL with LIMIT 1 never becomes a hash join).
    snapshot = (
        select(
            cast(func.pg_current_snapshot(), Text).label("token"),
            _sequence_now().label("sequence"),
        )
        .cte("snapshot")
        .prefix_with("MATERIALIZED")
    )
    batch = (
        func.unnest(cast(bindparam("resources"), ARRAY(Text)), cast(bindparam("keys"), ARRAY(Text)))
        .table_valued("resource", "key", with_ordinality="ord")
        .render_derived(name="batch")
    )
    found = (
        select(cast(_values.c.data, Text).label("data"), _values.c.version)
        .where(_values.c.resource == batch.c.resource, _values.c.key == batch.c.key)
        .limit(1)
        .lateral("found")
    )
    return select(
        batch.c.ord, snapshot.c.token, snapshot.c.sequence, found.c.data, found.c.version
    ).select_from(snapshot.join(batch, true()).outerjoin(found, true()))


def _stmt_read_latest() -> Any:
    return select(cast(_values.c.data, Text), _values.c.version).where(
        _values.c.resource == bindparam("resource"), _values.c.key == bindparam("key")
    )


def _stmt_read_at() -> Any:
    # The newest version whose writer the snapshot sees: a backward scan of the key.
    # When it sees none, whether the key's oldest retained version carries the prune's
    # mark (no txn_id): then older versions were dropped and the snapshot may have
    # needed one ("snapshot too old"), rather than the key not existing yet.
    found = (
        select(cast(_history.c.data, Text).label("data"), _history.c.version)
        .where(
            _history.c.resource == bindparam("resource"),
            _history.c.key == bindparam("key"),
            _visible(_history.c.writer_xid),
        )
        .order_by(_history.c.version.desc())
        .limit(1)
        .lateral("found")
    )
    oldest = (
        select(_history.c.txn_id.is_(None).label("pruned"))
        .where(_history.c.resource == bindparam("resource"), _history.c.key == bindparam("key"))
        .order_by(_history.c.version)
        .limit(1)
        .lateral("oldest")
    )
    one = select(literal(1).label("one")).subquery()
    return (
        select(found.c.data, found.c.version, oldest.c.pruned)
        .select_from(one)
        .outerjoin(found, true())
        .outerjoin(oldest, true())
    )


def _stmt_prune_history() -> Any:
    """One bounded step of ``prune_history``: the next ``keys`` keys of ``statepact_values``
    after the cursor (``after_resource``, ``after_key``), and of each, up to ``batch``
    history rows in all below its newest version committed before ``cutoff``.

    That version stays, marked by a NULL ``txn_id`` (a resend looks for its own txn id
    only among versions seconds old), so a read at a snapshot that does not see it knows
    older versions are gone. Each key's scan stops at its first version before the
    cutoff (a backward scan of the primary key) and the delete is a range of it.
    Returns one row (``deleted``, ``looked`` and the cursor of the last key), none when
    no key is left past the cursor.
    """
    page = (
        select(_values.c.resource, _values.c.key)
        .where(
            tuple_(_values.c.resource, _values.c.key)
            > tuple_(bindparam("after_resource", type_=Text), bindparam("after_key", type_=Text))
        )
        .order_by(_values.c.resource, _values.c.key)
        .limit(bindparam("keys"))
        .cte("page")
    )
    kept = (
        select(_history.c.version)
        .where(
            _history.c.resource == page.c.resource,
            _history.c.key == page.c.key,
            _history.c.committed_at < bindparam("cutoff"),
        )
        .order_by(_history.c.version.desc())
        .limit(1)
        .lateral("kept")
    )
    floors = (
        select(page.c.resource, page.c.key, kept.c.version)
        .select_from(page.join(kept, true()))
        .cte("floors")
    )
    victims = (
        select(_history.c.resource, _history.c.key, _history.c.version)
        .select_from(
            floors.join(
                _history,
                (_history.c.resource == floors.c.resource)
                & (_history.c.key == floors.c.key)
                & (_history.c.version < floors.c.version),
            )
        )
        .limit(bindparam("batch"))
        .cte("victims")
    )
    gone = (
        delete(_history)
        .where(
            _history.c.resource == victims.c.resource,
            _history.c.key == victims.c.key,
            _history.c.version == victims.c.version,
        )
        .returning(_history.c.resource, _history.c.key)
        .cte("gone")
    )
    marked = (
        update(_history)
        .where(
            _history.c.resource == floors.c.resource,
            _history.c.key == floors.c.key,
            _history.c.version == floors.c.version,
            _history.c.txn_id.is_not(None),
            exists().where(gone.c.resource == floors.c.resource, gone.c.key == floors.c.key),
        )
        .values(txn_id=None)
        .cte("marked")
    )
    return prune_step(page, [page.c.resource, page.c.key], gone, marked)


def _stmt_history() -> Any:
    return (
        select(_history.c.version, cast(_history.c.data, Text), _history.c.committed_at)
        .where(_history.c.resource == bindparam("resource"), _history.c.key == bindparam("key"))
        .order_by(_history.c.version.desc())
        .limit(bindparam("limit"))
    )


def _stmt_commit() -> Any:
    return select(func.statepact_commit(bindparam("request", type_=JSONB), type_=JSONB))


def _stmt_commit_many() -> Any:
    # Several transactions' commits in one statement (one server transaction): the function
    # once per request, in order, under shared_lock_timeout. Any refusal or lock wait past
    # it aborts all of them (the caller then sends each alone); no two touch one key.
    requests = (
        func.unnest(cast(bindparam("requests"), ARRAY(Text)))
        .table_valued("request", with_ordinality="ord")
        .render_derived(name="batch")
    )
    return (
        select(requests.c.ord, func.statepact_commit(cast(requests.c.request, JSONB), type_=JSONB))
        .select_from(shared_lock_timeout(), requests)
        .order_by(requests.c.ord)
    )


def _stmt_try_lock() -> Any:
    # The server's time, as Redis's PX TTL: a lock row's expiry must not depend on which
    # host's clock asked (one running ahead would take a live holder's lock). now() is
    # the statement's start in autocommit, one value for both arguments.
    return select(
        func.statepact_try_lock(
            bindparam("resource", type_=Text),
            bindparam("key", type_=Text),
            bindparam("txn_id", type_=Text),
            bindparam("mode", type_=Text),
            func.now(),
            func.now() + bindparam("ttl", type_=Interval),
            type_=Boolean,
        )
    )


def _stmt_unlock() -> Any:
    return delete(_locks).where(_locks.c.txn_id == any_(bindparam("txn_ids", type_=ARRAY(Text))))


def _stmt_acquire_lease() -> Any:
    stmt = insert(_leases).values(
        resource=bindparam("p_resource"),
        owner=bindparam("p_owner"),
        token=1,
        expires_at=bindparam("p_expires_at"),
        ttl=bindparam("p_ttl"),
        updated_at=bindparam("p_now"),
    )
    # ON CONFLICT DO UPDATE locks the row: two acquisitions of one resource
    # are serialised, and the WHERE sees the winner's lease.
    return stmt.on_conflict_do_update(
        index_elements=[_leases.c.resource],
        set_={
            "owner": stmt.excluded.owner,
            "token": _leases.c.token + 1,
            "expires_at": stmt.excluded.expires_at,
            "ttl": stmt.excluded.ttl,
            "updated_at": stmt.excluded.updated_at,
        },
        where=(
            _leases.c.owner.is_(None)
            | (_leases.c.expires_at <= bindparam("p_now"))
            | (_leases.c.owner == stmt.excluded.owner)
        ),
    ).returning(_leases.c.token)


def _stmt_renew_lease() -> Any:
    return (
        update(_leases)
        .where(
            _leases.c.resource == bindparam("p_resource"),
            _leases.c.token == bindparam("p_token"),
            _leases.c.owner == bindparam("p_owner"),
            _leases.c.expires_at > bindparam("p_now"),
        )
        .values(
            expires_at=bindparam("p_expires_at"),
            ttl=bindparam("p_ttl"),
            updated_at=bindparam("p_now"),
        )
        .returning(_leases.c.token)
    )


def _stmt_release_lease() -> Any:
    # The row stays: its token is the high-water mark the next lease counts from.
    return (
        update(_leases)
        .where(
            _leases.c.resource == bindparam("p_resource"),
            _leases.c.token == bindparam("p_token"),
            _leases.c.owner.is_not(None),
        )
        .values(owner=None, expires_at=None, ttl=None, updated_at=bindparam("p_now"))
        .returning(_leases.c.token)
    )


def _stmt_register() -> Any:
    stmt = insert(_resources).values(
        name=bindparam("p_name"),
        metadata=cast(bindparam("p_metadata", type_=Text), JSON),
        registered_at=bindparam("p_now"),
    )
    return stmt.on_conflict_do_update(
        index_elements=[_resources.c.name],
        set_={"metadata": stmt.excluded.metadata, "registered_at": stmt.excluded.registered_at},
    )


def _stmt_resource_info() -> Any:
    # A resource's version is its newest written key (schema.py: no hot per-resource row).
    newest = (
        select(_values.c.version, _values.c.committed_at)
        .where(_values.c.resource == bindparam("name"), _values.c.version > 0)
        .order_by(_values.c.version.desc())
        .limit(1)
        .subquery()
    )
    registered = (
        select(cast(_resources.c.metadata, Text).label("metadata"))
        .where(_resources.c.name == bindparam("name"))
        .subquery()
    )
    one = select(text("1 AS one")).subquery()
    return (
        select(registered.c.metadata, newest.c.version, newest.c.committed_at)
        .select_from(one)
        .outerjoin(registered, text("true"))
        .outerjoin(newest, text("true"))
    )


def _stmt_schema_present() -> Any:
    return select(
        func.to_regclass("statepact_meta").is_not(None),
        func.to_regclass(VERSION_SEQUENCE).is_not(None),
        *(func.to_regprocedure(signature).is_not(None) for signature in REQUIRED_FUNCTIONS),
    )


#: Sent as it is, never prepared: the liveness probe of ``ping``.
PING = text("SELECT 1")


@dataclass(frozen=True, slots=True)
class TxStatements(Generic[S]):
    """Every statement of the transaction backend, by name, each of type ``S``."""

    begin: S
    begin_read: S
    begin_read_many: S
    read_latest: S
    read_at: S
    history: S
    prune_history: S
    commit: S
    commit_many: S
    try_lock: S
    unlock: S
    acquire_lease: S
    renew_lease: S
    release_lease: S
    register: S
    resource_info: S
    schema_present: S
    truncate: S
    reset_seq: S

    @property
    def by_name(self) -> dict[str, S]:
        """Every statement under its name, in declaration order."""
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}

    def map(self, convert: Callable[[S], T]) -> TxStatements[T]:
        """The same set with each statement converted (compiled for the driver, say)."""
        converted = {name: convert(statement) for name, statement in self.by_name.items()}
        return TxStatements(**converted)

    @staticmethod
    def build() -> TxStatements[ClauseElement]:
        return TxStatements(
            begin=_stmt_begin(),
            begin_read=_stmt_begin_read(),
            begin_read_many=_stmt_begin_read_many(),
            read_latest=_stmt_read_latest(),
            read_at=_stmt_read_at(),
            history=_stmt_history(),
            prune_history=_stmt_prune_history(),
            commit=_stmt_commit(),
            commit_many=_stmt_commit_many(),
            try_lock=_stmt_try_lock(),
            unlock=_stmt_unlock(),
            acquire_lease=_stmt_acquire_lease(),
            renew_lease=_stmt_renew_lease(),
            release_lease=_stmt_release_lease(),
            register=_stmt_register(),
            resource_info=_stmt_resource_info(),
            schema_present=_stmt_schema_present(),
            truncate=text(f"TRUNCATE {', '.join(BACKEND_TABLES)}"),
            reset_seq=text(f"SELECT setval('{VERSION_SEQUENCE}', 1, false)"),
        )


@cache
def statements() -> TxStatements[ClauseElement]:
    """The statements over the ``statepact_*`` tables, built on first use."""
    return TxStatements.build()
