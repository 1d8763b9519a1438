-- _common.lua: prepended by _scripts.py to every statepact script (state and queue).
--
-- Key building in Lua is limited to the two helpers below, which follow the
-- grammar of _keys.py exactly: seg(s) is "<byte length>:<s>" (Lua's #s counts
-- bytes, the same UTF-8 byte length Python writes), and ref(t, id) is
-- "seg(t):seg(id)". Scripts only build keys that depend on what they read
-- (an index of the status a run had, the record of an id found in a set); every
-- key known before the call arrives in KEYS.
--
-- Numbers: Lua holds them as doubles, exact below 2^53. Anything Python parses
-- back is written from an ARGV string, by HINCRBY, or through str() below,
-- never by letting Redis print a Lua number (it may choose "1e+15").

local function seg(s)
  return #s .. ':' .. s
end

local function ref(tenant, id)
  return seg(tenant) .. ':' .. seg(id)
end

local function str(n)
  return string.format('%d', n)
end

-- Retries: a call that changes something names a key of its own (KEYS, built
-- from a fresh 96-bit call id, or for a RedisBackend commit its transaction id:
-- "op:<seg(id)>" in the record's slot). The script
-- writes it as its last step, with the result a retry needs, expiring after
-- REPLAY_MS; a retry of the same call (its reply lost to a dropped connection,
-- redis-py's own retry or our failover) finds it and answers as the first run
-- did instead of applying twice, however many other calls wrote in between.
-- The expiry is the server's clock on purpose: this is transport bookkeeping,
-- not a lease, and must not depend on a caller's (possibly frozen) clock.
local REPLAY_MS = 120000

local function op_done(key)
  return redis.call('GET', key)
end

local function op_record(key, value)
  redis.call('SET', key, value, 'PX', REPLAY_MS)
end
