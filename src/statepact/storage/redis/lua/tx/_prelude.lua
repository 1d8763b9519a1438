-- lua/tx/_prelude.lua: prepended (after lua/_common.lua) to every script of lua/tx/ (RedisBackend).
--
-- Layout (keys from _keys.TxKeys; P = "{<prefix>}", the cluster hash tag, so
-- every key of one backend is in one slot; R = seg(resource), K = seg(key)):
--
--   P:seq                string  the global commit sequence (INCR per writing commit)
--   P:res                set     resource names ever registered or written
--   P:meta:R             hash    version, at (µs), metadata (JSON text)
--   P:data:R             hash    key -> its latest entry
--   P:hist:R:K           list    the key's entries, newest first, at most history_limit
--   P:trim:R             hash    key -> the newest version trimmed from P:hist:R:K
--   P:idem:<seg(idem)>   string  "<fingerprint>:<version>:<µs>:<txn_id>", with a TTL
--   P:fence:R            string  the highest fencing token ever issued (next_token)
--   P:lease:R            hash    owner, token, expires (µs), ttl (seconds)
--   P:lock:R:K           set     "<txn_id>|shared" / "<txn_id>|exclusive", with a TTL
--   P:op:<seg(txn_id)>   string  a commit's outcome record, "<version>", expiring
--                                after REPLAY_MS (tx_commit.lua)
--
-- An entry (a value in P:data:R, an element of P:hist:R:K) is
--
--   <version> ":" <committed_at µs> ":" <txn_id> "\0" ( "=" <JSON text> | "-" )
--
-- "-" is a delete (a tombstone). The JSON text is stored and returned byte for
-- byte, never decoded here (cjson would rewrite numbers and key order). Ids
-- never contain NUL (the front refuses it) and compact JSON never holds a raw
-- NUL, so the first NUL ends the txn id, which says which transaction wrote
-- the version. (A resend of a commit finds its outcome record, never these.)
-- Versions are integers below 2^53, so tonumber is exact; they are written
-- with str() (from _common.lua), never by letting Lua print a number.

local function entry_version(entry)
  return tonumber(string.match(entry, '^(%d+):'))
end

