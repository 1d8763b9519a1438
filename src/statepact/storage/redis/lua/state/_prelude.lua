-- lua/state/_prelude.lua: prepended (after lua/_common.lua) to every script of lua/state/.
--
-- A run is two keys in its tenant's slot (see _keys.StateKeys):
--   P run:<seg(id)>   string  the JSON blob
--   P runh:<seg(id)>  hash    version, seq, created, updated (µs), status,
--                             session (absent when none), input_tokens,
--                             output_tokens, cost (nano-units), iterations,
--                             cursor
-- A session likewise: P session:<seg(id)> and P sessionh:<seg(id)> (version,
-- seq, created, updated). P is ARGV[1] in every state script; P op:<seg(call id)>
-- is a write's replay key (_common.lua).

local RUN_FIELDS = {
  'version', 'seq', 'created', 'updated', 'status', 'session',
  'input_tokens', 'output_tokens', 'cost', 'iterations', 'cursor',
}
local SESSION_FIELDS = { 'version', 'seq', 'created', 'updated' }

-- The record as the reply Python decodes: the hash fields in the order above,
-- then the blob. nil when the record does not exist.
local function record_reply(hash_key, blob_key, fields)
  local reply = redis.call('HMGET', hash_key, unpack(fields))
  if not reply[1] then
    return nil
  end
  reply[#fields + 1] = redis.call('GET', blob_key)
  return reply
end

local function run_reply(prefix, run_id)
  return record_reply(prefix .. 'runh:' .. seg(run_id), prefix .. 'run:' .. seg(run_id), RUN_FIELDS)
end

local function session_reply(prefix, session_id)
  return record_reply(
    prefix .. 'sessionh:' .. seg(session_id), prefix .. 'session:' .. seg(session_id), SESSION_FIELDS
  )
end

-- The indexes a run is in besides P runs: its status, and when it has a
-- session, its session and its session-with-status.
local function run_indexes(prefix, status, session)
  local keys = { prefix .. 'runs-status:' .. seg(status) }
  if session and session ~= '' then
    keys[2] = prefix .. 'runs-session:' .. seg(session)
    keys[3] = prefix .. 'runs-ss:' .. seg(session) .. ':' .. seg(status)
  end
  return keys
end

-- Up to `count` records of an index with a score above `after`, as
-- {id, record, id, record, ...}, read in the same script so a page is one
-- round trip whatever its length.
local function page(index_key, after, count, reply)
  local ids = redis.call('ZRANGEBYSCORE', index_key, '(' .. after, '+inf', 'LIMIT', 0, count)
  local out = {}
  for _, id in ipairs(ids) do
    local record = reply(ARGV[1], id)
    if record then
      out[#out + 1] = id
      out[#out + 1] = record
    end
  end
  return out
end
