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

-- A record remembers the ids of the last few calls that changed it (each id
-- is 12 characters from [A-Za-z0-9_-], stored as ".<id>", newest first), so
-- a call retried after its reply was lost (a dropped connection, redis-py's
-- own retry, our failover) recognises itself instead of applying twice.
local OP_RING = 4

local function op_position(ring, op)
  if not ring then
    return nil
  end
  local at = string.find(ring, '.' .. op, 1, true)
  if not at then
    return nil
  end
  return (at - 1) / 13 + 1
end

local function op_remember(ring, op)
  return string.sub('.' .. op .. (ring or ''), 1, 13 * OP_RING)
end
