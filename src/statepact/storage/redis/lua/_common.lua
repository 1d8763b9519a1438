-- _common.lua: prepended by _scripts.py to every script of lua/ (each folder: state, queue, tx, adk, langgraph),
-- before that folder's _prelude.lua.
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
-- from a fresh call id, never reused, or for a RedisBackend commit its transaction id:
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

-- A run's counters (lua/state/patch_run.lua, an ADK append's usage): add each nonzero
-- delta (a decimal string, so HINCRBY keeps it exact) to the field of ``names`` at the
-- same index of hash ``key``, then bump its version and set its updated time to ``now``.
-- All or nothing: HINCRBY refuses an overflow past 2^63-1 itself, and the deltas added
-- before the refused one are taken back; returns that counter's name (nothing changed),
-- else nil.
local function add_to_run(key, names, deltas, now)
  local applied = {}
  for i, name in ipairs(names) do
    if deltas[i] ~= '0' then
      local result = redis.pcall('HINCRBY', key, name, deltas[i])
      if type(result) == 'table' and result.err then
        for _, j in ipairs(applied) do
          redis.call('HINCRBY', key, names[j], '-' .. deltas[j])
        end
        return name
      end
      applied[#applied + 1] = i
    end
  end
  redis.call('HINCRBY', key, 'version', 1)
  redis.call('HSET', key, 'updated', now)
  return nil
end

-- Fencing tokens (RedisBackend's lease tokens, a queue's lease tokens): each is
-- above the last one its counter issued AND at least the server's clock in
-- microseconds. The counter alone goes back on a server that forgot writes (RDB
-- snapshots only, an OS crash before the AOF fsync, a failover to a replica that
-- lagged) and would hand a token out twice; the clock does not go back with it,
-- so a token issued after such a restart is above every token issued before
-- (as long as the server's clock has not been set back by more than the writes
-- it lost). Tokens stay integers below 2^53, exact in Lua, until the year 2255,
-- and below the 2^63 the fronts accept. A token is not a time: nothing expires
-- by it (leases expire by the caller's injected clock, ARGV).
local function next_token(counter)
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = math.max(tonumber(redis.call('GET', counter) or '0') + 1, floor)
  redis.call('SET', counter, str(token))
  return token
end
