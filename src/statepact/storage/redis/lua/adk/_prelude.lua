-- lua/adk/_prelude.lua: prepended (after lua/_common.lua) to every script of lua/adk/,
-- the Google ADK session service's (statepact.integrations.adk).
--
-- Per app, P = "<ns>:adk-sessions:{seg(app)}:" and R = ref(user, session) (_keys.AdkKeys):
--   P s:R   hash  version, seq, created, updated (µs), lut (ADK's last_update_time),
--                 head (seq of the oldest event kept; version + 1 when none), owner,
--                 token, expires (the lease, µs)
--   P st:R  hash  session state: key -> the value's JSON text
--   P ev:R  list  the events' JSON, oldest first: the event of seq q is at q - head
--   P et:R  list  their timestamps (Python's repr of ADK's float), in the same order
-- plus P app, P u:<seg(user)> (state hashes), P seq, P all, P by:<seg(user)>, P idle and
-- P heads. The session's run (its token counters) is StateKeys' run of the same tenant,
-- in the same slot: its hash fields are lua/state/_prelude.lua's.
--
-- Timestamps are compared as Lua numbers (doubles): tonumber of Python's repr of a float
-- is that very double.

local SESSION_FIELDS = { 'version', 'seq', 'lut', 'head', 'owner', 'token', 'expires' }

-- The four keys of session r.
local function session_keys(prefix, r)
  return prefix .. 's:' .. r, prefix .. 'st:' .. r, prefix .. 'ev:' .. r, prefix .. 'et:' .. r
end

-- The user of a session reference "<len>:<user>:<len>:<session>".
local function user_of(r)
  local colon = string.find(r, ':', 1, true)
  local length = tonumber(string.sub(r, 1, colon - 1))
  return string.sub(r, colon + 1, colon + length)
end

-- HSET of `count` field/value pairs from ARGV, starting at ARGV[first]; the next index.
local function set_pairs(key, first, count)
  if count > 0 then
    redis.call('HSET', key, unpack(ARGV, first, first + 2 * count - 1))
  end
  return first + 2 * count
end

-- The live lease of a session hash's fields (owner, token, expires), or nil.
local function live_lease(owner, expires, now)
  if owner and expires and tonumber(expires) > now then
    return owner
  end
  return nil
end
