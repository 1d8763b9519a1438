"""The transaction backend's tables (``statepact_*``)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    Double,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    text,
)

from statepact.storage.postgres._schema.columns import ident, tz

__all__ = ["define_backend_tables"]


def define_backend_tables(meta: MetaData) -> None:
    Table(
        "statepact_meta",
        meta,
        Column("id", SmallInteger, nullable=False, autoincrement=False),
        Column("seq", BigInteger, nullable=False, server_default=text("0")),
        PrimaryKeyConstraint("id"),
        CheckConstraint("id = 1", name="single_row"),
        CheckConstraint("seq >= 0", name="seq"),
    )
    Table(
        "statepact_resources",
        meta,
        Column("name", ident(), nullable=False),
        Column("metadata", JSON, nullable=False, server_default=text("'{}'::json")),
        Column("registered_at", tz(), nullable=True),
        PrimaryKeyConstraint("name"),
    )
    Table(
        "statepact_values",
        meta,
        Column("resource", ident(), nullable=False),
        Column("key", ident(), nullable=False),
        Column("version", BigInteger, nullable=False, server_default=text("0")),
        Column("data", JSON, nullable=True),
        Column("committed_at", tz(), nullable=True),
        # The transaction (pg_current_xact_id) that wrote the version (revision 0004): a
        # commit conflicts when its snapshot does not see it. NULL: written before 0004.
        Column("writer_xid", BigInteger, nullable=True),
        PrimaryKeyConstraint("resource", "key"),
        CheckConstraint("version >= 0", name="version"),
        Index("ix_statepact_values_resource_version", "resource", "version"),
        postgresql_with={"fillfactor": 90},
    )
    Table(
        "statepact_history",
        meta,
        Column("resource", ident(), nullable=False),
        Column("key", ident(), nullable=False),
        Column("version", BigInteger, nullable=False),
        Column("data", JSON, nullable=True),
        Column("committed_at", tz(), nullable=False),
        # The transaction that wrote the version (revision 0002): a commit sent
        # again after a lost reply recognises its own first attempt.
        Column("txn_id", ident(), nullable=True),
        # The PostgreSQL transaction that wrote the version (revision 0004): a snapshot
        # read takes the newest version whose writer the snapshot sees.
        Column("writer_xid", BigInteger, nullable=True),
        # Newest first and "newest visible in a snapshot" are backward scans of the key.
        PrimaryKeyConstraint("resource", "key", "version"),
        CheckConstraint("version > 0", name="version"),
    )
    Table(
        "statepact_idempotency",
        meta,
        Column("key", ident(), nullable=False),
        Column("fingerprint", String(64), nullable=False),
        Column("version", BigInteger, nullable=False),
        Column("committed_at", tz(), nullable=False),
        Column("txn_id", ident(), nullable=True),
        PrimaryKeyConstraint("key"),
    )
    Table(
        "statepact_locks",
        meta,
        Column("resource", ident(), nullable=False),
        Column("key", ident(), nullable=False),
        Column("txn_id", ident(), nullable=False),
        Column("mode", String(9), nullable=False),
        Column("acquired_at", tz(), nullable=False),
        Column("expires_at", tz(), nullable=True),
        PrimaryKeyConstraint("resource", "key", "txn_id"),
        CheckConstraint("mode IN ('shared', 'exclusive')", name="mode"),
        # end(txn_id) drops every lock of the transaction.
        Index("ix_statepact_locks_txn_id", "txn_id"),
    )
    Table(
        "statepact_leases",
        meta,
        Column("resource", ident(), nullable=False),
        Column("owner", ident(), nullable=True),
        # The highest token ever issued; release and expiry keep it.
        Column("token", BigInteger, nullable=False, server_default=text("0")),
        Column("expires_at", tz(), nullable=True),
        Column("ttl", Double, nullable=True),
        Column("updated_at", tz(), nullable=True),
        PrimaryKeyConstraint("resource"),
        CheckConstraint("token >= 0", name="token"),
    )
