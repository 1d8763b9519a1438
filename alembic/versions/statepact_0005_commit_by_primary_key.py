"""PostgresBackend commits find every row through its primary key, and a commit of one
key that no other commit holds is applied without the full lock-and-validate path.

Revision 0004's ``statepact_commit`` joined the request's keys to
``statepact_values`` with plain joins. On a small table (a few hundred keys,
the common shape: a handful of agents' keys rewritten again and again) the
planner chose a hash join over a sequential scan for those, and every commit
then read every dead row the rewrites had left until autovacuum came by: the
commit slowed as the table bloated. From here:

- every lookup of a written or read key is a ``LATERAL`` subquery with
  ``LIMIT 1`` on the primary key (it cannot be flattened into a hash join), and
  the apply step updates one key at a time by its primary key;
- a commit writing one key, not serializable and not a resend, first locks the
  key's row with ``FOR NO KEY UPDATE SKIP LOCKED``; if it got the lock and the
  snapshot sees the row's writer, it draws its version and applies at once (three
  statements instead of seven). Otherwise (no row yet, another commit holds it,
  the key moved, a resend) it takes the full path, which checks everything
  again under the same locks; the one it already holds is its own.

The function keeps its name, signature, lock order and refusals; no table
changes. The downgrade restores revision 0004's function.

A revision is a frozen snapshot: it never imports statepact.

Revision ID: statepact_0005
Revises: statepact_0004
Create Date: 2026-12-06 00:45:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "statepact_0005"
down_revision: str | None = "statepact_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


COMMIT_FUNCTION = """
CREATE OR REPLACE FUNCTION statepact_commit(request jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $body$
-- One PostgresBackend commit, run as one autocommit statement (READ COMMITTED):
-- every statement below takes a fresh snapshot, and any RAISE rolls back all
-- of it. Lock order, always: the fencing lease row (shared), the idempotency
-- key (unique index), then each read or written statepact_values row in
-- (resource, key) byte order. No row is shared by unrelated commits.
-- Every statepact_values row is found through its primary key, one written or
-- read key at a time (a LATERAL subquery with LIMIT 1 cannot become a hash join
-- over a sequential scan, whatever the table's statistics say).
DECLARE
    v_txn text := request->>'txn_id';
    v_isolation text := request->>'isolation';
    v_snapshot pg_snapshot := (request->>'snapshot')::pg_snapshot;
    v_taken bigint := (request->>'taken_at')::bigint;
    v_resend boolean := coalesce((request->>'resend')::boolean, false);
    v_now timestamptz := (request->>'now')::timestamptz;
    v_idem text := request->>'idempotency_key';
    v_fingerprint text := request->>'fingerprint';
    v_writes jsonb := coalesce(request->'writes', '[]'::jsonb);
    v_reads jsonb := coalesce(request->'reads', '[]'::jsonb);
    v_fence jsonb := request->'fencing';
    v_validate boolean;
    v_highest bigint;
    v_seen record;
    v_item record;
    v_bad record;
    v_row record;
    v_applied bigint;
    v_seq bigint;
    v_xid bigint;
BEGIN
    IF NOT request ? 'snapshot' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'feature_not_supported',
            MESSAGE = 'statepact_commit: this request comes from a statepact release older '
                      'than schema revision statepact_0004; upgrade the statepact package';
    END IF;
    -- Without a snapshot (the transaction read nothing) the commit point is the
    -- snapshot: nothing to validate for a write, and the sequence now for the rest.
    IF v_taken IS NULL THEN
        SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO v_taken
          FROM statepact_version_seq AS s;
    END IF;
    v_validate := v_isolation <> 'read_committed' AND v_snapshot IS NOT NULL;

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
    -- Its version is set below once the commit has one.
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

    -- 3. One written key, not serializable, not a resend: lock its row if no other
    -- commit holds it, and if the snapshot sees its writer, apply at once. Anything
    -- else (no row yet, the row locked, the key moved, a resend) takes the full path
    -- below, which checks everything again (a lock held here is this commit's own).
    IF jsonb_array_length(v_writes) = 1 AND v_isolation <> 'serializable' AND NOT v_resend THEN
        SELECT v.version, v.writer_xid INTO v_row
          FROM statepact_values AS v
         WHERE v.resource = v_writes->0->>0 AND v.key = v_writes->0->>1
           FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND AND (NOT v_validate OR v_row.version = 0 OR v_row.writer_xid IS NULL
                      OR pg_visible_in_snapshot(v_row.writer_xid::text::xid8, v_snapshot)) THEN
            v_seq := nextval('statepact_version_seq');
            v_xid := pg_current_xact_id()::text::bigint;
            UPDATE statepact_values AS v
               SET version = v_seq, data = (v_writes->0->>2)::json, committed_at = v_now,
                   writer_xid = v_xid
             WHERE v.resource = v_writes->0->>0 AND v.key = v_writes->0->>1;
            INSERT INTO statepact_history
                   (resource, key, version, data, committed_at, txn_id, writer_xid)
            VALUES (v_writes->0->>0, v_writes->0->>1, v_seq, (v_writes->0->>2)::json,
                    v_now, v_txn, v_xid);
            IF v_idem IS NOT NULL THEN
                UPDATE statepact_idempotency AS i SET version = v_seq WHERE i.key = v_idem;
            END IF;
            RETURN jsonb_build_object('version', v_seq, 'replayed', false);
        END IF;
    END IF;

    IF jsonb_array_length(v_writes) > 0 THEN
        -- 4a. A first look, without locks: a commit that has already lost, because
        -- a key it writes was rewritten by a transaction its snapshot does not see,
        -- fails here instead of queueing on the row lock behind the winner. Unless
        -- the rewrite is this very transaction's earlier attempt (see below).
        IF v_validate THEN
            SELECT w.e->>0 AS resource, w.e->>1 AS key, v.version INTO v_bad
              FROM jsonb_array_elements(v_writes) WITH ORDINALITY AS w(e, n)
              CROSS JOIN LATERAL (
                    SELECT v.version, v.writer_xid FROM statepact_values AS v
                     WHERE v.resource = w.e->>0 AND v.key = w.e->>1
                     LIMIT 1
                   ) AS v
             WHERE v.version > 0
               AND NOT pg_visible_in_snapshot(v.writer_xid::text::xid8, v_snapshot)
             ORDER BY w.n
             LIMIT 1;
            IF FOUND THEN
                -- (An attempt of this transaction drew its number after the snapshot
                -- was taken, so only versions above taken_at need looking at.)
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

        -- 4b. Lock every written key (and, for serializable, every read key) in
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

        -- A commit sent again after its reply was lost: if its first attempt was
        -- applied, the first written key has a version this very transaction wrote.
        -- Answer with it and apply nothing. Looked up only when it can be so: on
        -- the executor's resend, or when the key was rewritten since the snapshot.
        IF v_resend OR (
            v_snapshot IS NOT NULL AND EXISTS (
                SELECT 1 FROM statepact_values AS v
                 WHERE v.resource = v_writes->0->>0 AND v.key = v_writes->0->>1
                   AND v.version > 0
                   AND NOT pg_visible_in_snapshot(v.writer_xid::text::xid8, v_snapshot)
            )
        ) THEN
            SELECT h.version INTO v_applied
              FROM statepact_history AS h
             WHERE h.resource = v_writes->0->>0 AND h.key = v_writes->0->>1
               AND (v_snapshot IS NULL OR h.version > v_taken) AND h.txn_id = v_txn
             LIMIT 1;
            IF FOUND THEN
                RETURN jsonb_build_object('version', v_applied, 'replayed', false);
            END IF;
        END IF;

        -- 5. First committer wins (snapshot, serializable), under the locks.
        IF v_validate THEN
            SELECT w.e->>0 AS resource, w.e->>1 AS key, v.version INTO v_bad
              FROM jsonb_array_elements(v_writes) WITH ORDINALITY AS w(e, n)
              CROSS JOIN LATERAL (
                    SELECT v.version, v.writer_xid FROM statepact_values AS v
                     WHERE v.resource = w.e->>0 AND v.key = w.e->>1
                     LIMIT 1
                   ) AS v
             WHERE v.version > 0
               AND NOT pg_visible_in_snapshot(v.writer_xid::text::xid8, v_snapshot)
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

    -- 6. Backward read validation (serializable): every read key still at the
    -- version observed. With writes, the rows are locked (shared) above; a
    -- read-only commit needs no lock: this one statement is its serial point.
    IF v_isolation = 'serializable' THEN
        SELECT r.e->>0 AS resource, r.e->>1 AS key, (r.e->>2)::bigint AS seen,
               coalesce(v.version, 0) AS latest
          INTO v_bad
          FROM jsonb_array_elements(v_reads) WITH ORDINALITY AS r(e, n)
          LEFT JOIN LATERAL (
                SELECT v.version FROM statepact_values AS v
                 WHERE v.resource = r.e->>0 AND v.key = r.e->>1
                 LIMIT 1
               ) AS v ON true
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

    -- A read-only commit takes no version (its idempotency record, if any,
    -- already holds taken_at).
    IF jsonb_array_length(v_writes) = 0 THEN
        RETURN jsonb_build_object('version', v_taken, 'replayed', false);
    END IF;

    -- 7. Apply. The number is drawn last, after every check, so a refused
    -- commit leaves no gap; the writer's transaction id makes the rows
    -- visible to exactly the snapshots taken after this transaction committed.
    v_seq := nextval('statepact_version_seq');
    v_xid := pg_current_xact_id()::text::bigint;
    FOR v_item IN
        SELECT w.e->>0 AS resource, w.e->>1 AS key, w.e->>2 AS data
          FROM jsonb_array_elements(v_writes) AS w(e)
    LOOP
        UPDATE statepact_values AS v
           SET version = v_seq, data = v_item.data::json, committed_at = v_now,
               writer_xid = v_xid
         WHERE v.resource = v_item.resource AND v.key = v_item.key;
    END LOOP;
    INSERT INTO statepact_history (resource, key, version, data, committed_at, txn_id, writer_xid)
    SELECT w.e->>0, w.e->>1, v_seq, (w.e->>2)::json, v_now, v_txn, v_xid
      FROM jsonb_array_elements(v_writes) AS w(e);
    IF v_idem IS NOT NULL THEN
        UPDATE statepact_idempotency AS i SET version = v_seq WHERE i.key = v_idem;
    END IF;
    RETURN jsonb_build_object('version', v_seq, 'replayed', false);
END;
$body$
"""


def upgrade() -> None:
    op.execute(sa.text(COMMIT_FUNCTION))


def downgrade() -> None:
    previous = op.get_context().script.get_revision("statepact_0004")
    assert previous is not None
    op.execute(sa.text(previous.module.COMMIT_FUNCTION))
