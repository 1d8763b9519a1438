"""PostgresBackend: the one-round-trip commit and lock functions, and the ``txn_id`` columns.

``statepact_commit(request jsonb) returns jsonb`` validates and applies one
transaction of ``PostgresBackend`` in one autocommit statement (the order and
the reasoning are in ``statepact/storage/postgres/backend.py``);
``statepact_try_lock(...)`` takes or refuses one pessimistic lock row.
``statepact_history.txn_id`` and ``statepact_idempotency.txn_id`` record which
transaction wrote a version or claimed a key, so a commit sent again after its
connection was lost recognises its own first attempt: it is never applied
twice, and is not reported as a replay of someone else's commit.

Refusals are raised with statepact's own SQLSTATEs (class ``SP``), the details
as a JSON object in DETAIL; the backing turns them into its public errors:
``SPF01`` stale fencing token, ``SPI01`` idempotency key reused with another
request, ``SPC01`` a written key moved past the snapshot, ``SPC02`` a read key
moved (serializable), ``SPC03`` an idempotency record vanished mid-commit.

A revision is a frozen snapshot: it never imports statepact. Autogenerate does
not see functions: they are created and dropped by hand here.

Revision ID: statepact_0002
Revises: statepact_0001
Create Date: 2026-12-02 19:05:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "statepact_0002"
down_revision: str | None = "statepact_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# The transaction-scoped advisory lock class of statepact_try_lock: b"SPLK" as an
# int4, so its keys never meet the bigint advisory keys an application uses.
LOCK_CLASS = 0x53504C4B

COMMIT_FUNCTION = """
CREATE OR REPLACE FUNCTION statepact_commit(request jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $body$
-- One PostgresBackend commit, run as one autocommit statement (READ COMMITTED):
-- every statement below takes a fresh snapshot, and any RAISE rolls back all
-- of it. Lock order, always: the fencing lease row (shared), the idempotency
-- key (unique index), each read or written statepact_values row in
-- (resource, key) byte order, and the statepact_meta row last.
DECLARE
    v_txn text := request->>'txn_id';
    v_isolation text := request->>'isolation';
    v_taken bigint := (request->>'taken_at')::bigint;
    v_now timestamptz := (request->>'now')::timestamptz;
    v_idem text := request->>'idempotency_key';
    v_fingerprint text := request->>'fingerprint';
    v_writes jsonb := coalesce(request->'writes', '[]'::jsonb);
    v_reads jsonb := coalesce(request->'reads', '[]'::jsonb);
    v_fence jsonb := request->'fencing';
    v_highest bigint;
    v_seen record;
    v_item record;
    v_bad record;
    v_first bigint;
    v_applied bigint;
    v_seq bigint;
BEGIN
    -- 1. Fencing. FOR SHARE: a lease acquisition (which updates the row) waits
    -- for this commit to finish, so no token can be issued between the check
    -- and the commit becoming visible.
    IF jsonb_typeof(v_fence) = 'array' THEN
        SELECT l.token INTO v_highest
          FROM statepact_leases AS l
         WHERE l.resource = v_fence->>0
           FOR SHARE;
        IF v_highest IS NOT NULL AND (v_fence->>1)::bigint < v_highest THEN
            RAISE EXCEPTION USING
                ERRCODE = 'SPF01',
                MESSAGE = 'statepact: stale fencing token',
                DETAIL = jsonb_build_object(
                    'resource', v_fence->>0,
                    'token', (v_fence->>1)::bigint,
                    'highest', v_highest
                )::text;
        END IF;
    END IF;

    -- 2. Idempotency. The record is claimed first: a concurrent commit with the
    -- same key waits on the unique index until this one ends, then replays.
    -- Its version is set below once the sequence is known.
    IF v_idem IS NOT NULL THEN
        INSERT INTO statepact_idempotency (key, fingerprint, version, committed_at, txn_id)
        VALUES (v_idem, v_fingerprint, v_taken, v_now, v_txn)
        ON CONFLICT (key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT i.fingerprint, i.version, i.txn_id INTO v_seen
              FROM statepact_idempotency AS i
             WHERE i.key = v_idem;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'SPC03',
                    MESSAGE = 'statepact: idempotency record vanished during the commit',
                    DETAIL = jsonb_build_object('key', v_idem)::text;
            END IF;
            IF v_seen.fingerprint IS DISTINCT FROM v_fingerprint THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'SPI01',
                    MESSAGE = 'statepact: idempotency key used for another request',
                    DETAIL = jsonb_build_object('key', v_idem)::text;
            END IF;
            -- The same transaction sent again (its reply was lost) is not a replay.
            RETURN jsonb_build_object(
                'version', v_seen.version,
                'replayed', v_seen.txn_id IS DISTINCT FROM v_txn
            );
        END IF;
    END IF;

    IF jsonb_array_length(v_writes) > 0 THEN
        -- 3a. A first look, without locks (snapshot, serializable): a commit that
        -- has already lost, because a key it writes moved past its snapshot, fails
        -- here instead of queueing on the row lock behind the winner (versions
        -- only grow, so the check under the lock would refuse it too). Unless
        -- the version is this very transaction's earlier attempt (see below).
        IF v_isolation <> 'read_committed' THEN
            SELECT w.e->>0 AS resource, w.e->>1 AS key, v.version INTO v_bad
              FROM jsonb_array_elements(v_writes) WITH ORDINALITY AS w(e, n)
              JOIN statepact_values AS v ON v.resource = w.e->>0 AND v.key = w.e->>1
             WHERE v.version > v_taken
             ORDER BY w.n
             LIMIT 1;
            IF FOUND THEN
                SELECT h.version INTO v_applied
                  FROM statepact_history AS h
                 WHERE h.resource = v_writes->0->>0 AND h.key = v_writes->0->>1
                   AND h.version > v_taken AND h.txn_id = v_txn
                 LIMIT 1;
                IF FOUND THEN
                    RETURN jsonb_build_object('version', v_applied, 'replayed', false);
                END IF;
                RAISE EXCEPTION USING
                    ERRCODE = 'SPC01',
                    MESSAGE = 'statepact: a written key moved past the snapshot',
                    DETAIL = jsonb_build_object(
                        'resource', v_bad.resource,
                        'key', v_bad.key,
                        'latest', v_bad.version,
                        'taken_at', v_taken
                    )::text;
            END IF;
        END IF;

        -- 3b. Lock every written key (and, for serializable, every read key) in
        -- (resource, key) byte order, so two commits never wait on each other in
        -- a cycle. A key with no row gets a version-0 placeholder, which is
        -- the lock: a concurrent commit of the same key waits on its unique
        -- index entry. The placeholder is rolled back with a refused commit.
        FOR v_item IN
            SELECT s.resource, s.key, bool_or(s.written) AS written
              FROM (
                    SELECT w.e->>0 AS resource, w.e->>1 AS key, true AS written
                      FROM jsonb_array_elements(v_writes) AS w(e)
                    UNION ALL
                    SELECT r.e->>0, r.e->>1, false
                      FROM jsonb_array_elements(v_reads) AS r(e)
                     WHERE v_isolation = 'serializable'
                   ) AS s
             GROUP BY s.resource, s.key
             ORDER BY s.resource COLLATE "C", s.key COLLATE "C"
        LOOP
            IF v_item.written THEN
                PERFORM 1 FROM statepact_values AS v
                  WHERE v.resource = v_item.resource AND v.key = v_item.key
                    FOR NO KEY UPDATE;
            ELSE
                PERFORM 1 FROM statepact_values AS v
                  WHERE v.resource = v_item.resource AND v.key = v_item.key
                    FOR SHARE;
            END IF;
            IF NOT FOUND THEN
                INSERT INTO statepact_values (resource, key, version)
                VALUES (v_item.resource, v_item.key, 0)
                ON CONFLICT (resource, key) DO NOTHING;
                IF NOT FOUND THEN
                    -- A concurrent commit created the row first (and has ended).
                    IF v_item.written THEN
                        PERFORM 1 FROM statepact_values AS v
                          WHERE v.resource = v_item.resource AND v.key = v_item.key
                            FOR NO KEY UPDATE;
                    ELSE
                        PERFORM 1 FROM statepact_values AS v
                          WHERE v.resource = v_item.resource AND v.key = v_item.key
                            FOR SHARE;
                    END IF;
                END IF;
            END IF;
        END LOOP;

        -- A retry of a commit whose first attempt lost its connection: if that
        -- attempt was applied, the first written key has a version past the
        -- snapshot written by this very transaction. Answer with it, apply
        -- nothing. (Only looked up when the key moved: free on the fast path.)
        SELECT v.version INTO v_first
          FROM statepact_values AS v
         WHERE v.resource = v_writes->0->>0 AND v.key = v_writes->0->>1;
        IF v_first > v_taken THEN
            SELECT h.version INTO v_applied
              FROM statepact_history AS h
             WHERE h.resource = v_writes->0->>0 AND h.key = v_writes->0->>1
               AND h.version > v_taken AND h.txn_id = v_txn
             LIMIT 1;
            IF FOUND THEN
                RETURN jsonb_build_object('version', v_applied, 'replayed', false);
            END IF;
        END IF;

        -- 4. First committer wins (snapshot, serializable).
        IF v_isolation <> 'read_committed' THEN
            SELECT w.e->>0 AS resource, w.e->>1 AS key, v.version INTO v_bad
              FROM jsonb_array_elements(v_writes) WITH ORDINALITY AS w(e, n)
              JOIN statepact_values AS v ON v.resource = w.e->>0 AND v.key = w.e->>1
             WHERE v.version > v_taken
             ORDER BY w.n
             LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'SPC01',
                    MESSAGE = 'statepact: a written key moved past the snapshot',
                    DETAIL = jsonb_build_object(
                        'resource', v_bad.resource,
                        'key', v_bad.key,
                        'latest', v_bad.version,
                        'taken_at', v_taken
                    )::text;
            END IF;
        END IF;
    END IF;

    -- 5. Backward read validation (serializable): every read key still at the
    -- version observed. With writes, the rows are locked (shared) above; a
    -- read-only commit needs no lock: this one statement is its serial point.
    IF v_isolation = 'serializable' THEN
        SELECT r.e->>0 AS resource, r.e->>1 AS key, (r.e->>2)::bigint AS seen,
               coalesce(v.version, 0) AS latest
          INTO v_bad
          FROM jsonb_array_elements(v_reads) WITH ORDINALITY AS r(e, n)
          LEFT JOIN statepact_values AS v ON v.resource = r.e->>0 AND v.key = r.e->>1
         WHERE coalesce(v.version, 0) <> (r.e->>2)::bigint
         ORDER BY r.n
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING
                ERRCODE = 'SPC02',
                MESSAGE = 'statepact: a read key moved (serializable validation)',
                DETAIL = jsonb_build_object(
                    'resource', v_bad.resource,
                    'key', v_bad.key,
                    'seen', v_bad.seen,
                    'latest', v_bad.latest
                )::text;
        END IF;
    END IF;

    -- A read-only commit does not advance the sequence (its idempotency record,
    -- if any, already holds taken_at).
    IF jsonb_array_length(v_writes) = 0 THEN
        RETURN jsonb_build_object('version', v_taken, 'replayed', false);
    END IF;

    -- 6. The one global serialisation point, taken last: the meta row stays
    -- locked until COMMIT, so sequence numbers become visible in order.
    UPDATE statepact_meta SET seq = seq + 1 WHERE id = 1 RETURNING seq INTO v_seq;
    UPDATE statepact_values AS v
       SET version = v_seq, data = (w.e->>2)::json, committed_at = v_now
      FROM jsonb_array_elements(v_writes) AS w(e)
     WHERE v.resource = w.e->>0 AND v.key = w.e->>1;
    INSERT INTO statepact_history (resource, key, version, data, committed_at, txn_id)
    SELECT w.e->>0, w.e->>1, v_seq, (w.e->>2)::json, v_now, v_txn
      FROM jsonb_array_elements(v_writes) AS w(e);
    IF v_idem IS NOT NULL THEN
        UPDATE statepact_idempotency AS i SET version = v_seq WHERE i.key = v_idem;
    END IF;
    RETURN jsonb_build_object('version', v_seq, 'replayed', false);
END;
$body$
"""

TRY_LOCK_FUNCTION = f"""
CREATE OR REPLACE FUNCTION statepact_try_lock(
    p_resource text,
    p_key text,
    p_txn_id text,
    p_mode text,
    p_now timestamptz,
    p_expires_at timestamptz
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $body$
-- Take or refuse one pessimistic lock row, never waiting (the caller polls).
-- The advisory lock, held only by this statement, makes check-then-insert
-- atomic per (resource, key); a hash collision only serialises two keys briefly.
BEGIN
    PERFORM pg_advisory_xact_lock(
        {LOCK_CLASS}, hashtext(length(p_resource)::text || '/' || p_resource || p_key)
    );
    DELETE FROM statepact_locks AS l
     WHERE l.resource = p_resource AND l.key = p_key AND l.expires_at <= p_now;
    IF EXISTS (
        SELECT 1 FROM statepact_locks AS l
         WHERE l.resource = p_resource AND l.key = p_key AND l.txn_id <> p_txn_id
           AND (p_mode = 'exclusive' OR l.mode = 'exclusive')
    ) THEN
        RETURN false;
    END IF;
    INSERT INTO statepact_locks AS l (resource, key, txn_id, mode, acquired_at, expires_at)
    VALUES (p_resource, p_key, p_txn_id, p_mode, p_now, p_expires_at)
    ON CONFLICT (resource, key, txn_id) DO UPDATE
       SET mode = CASE WHEN l.mode = 'exclusive' THEN 'exclusive' ELSE excluded.mode END,
           expires_at = excluded.expires_at;
    RETURN true;
END;
$body$
"""


def upgrade() -> None:
    # Which transaction wrote a version / claimed a key: a commit sent again
    # after a lost reply recognises its own first attempt by it.
    op.add_column("statepact_history", sa.Column("txn_id", sa.Text(collation="C"), nullable=True))
    op.add_column(
        "statepact_idempotency", sa.Column("txn_id", sa.Text(collation="C"), nullable=True)
    )
    op.execute(sa.text(COMMIT_FUNCTION))
    op.execute(sa.text(TRY_LOCK_FUNCTION))


def downgrade() -> None:
    op.execute(
        sa.text(
            "DROP FUNCTION IF EXISTS statepact_try_lock(text, text, text, text, "
            "timestamptz, timestamptz)"
        )
    )
    op.execute(sa.text("DROP FUNCTION IF EXISTS statepact_commit(jsonb)"))
    op.drop_column("statepact_idempotency", "txn_id")
    op.drop_column("statepact_history", "txn_id")
