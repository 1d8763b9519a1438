--[[ put_run: write a run's blob, status and session if the caller holds the stored version.

KEYS[1]  P run:<seg(run_id)>    the blob
KEYS[2]  P runh:<seg(run_id)>   the hash
KEYS[3]  P seq                  the tenant's sequence (INCR once, at creation)
KEYS[4]  P runs                 every run of the tenant, scored by seq
KEYS[5]  P op:<seg(call id)>    this call's replay key (see _common.lua)
ARGV[1]  P, the tenant prefix; the status/session indexes are built from it
ARGV[2]  run_id
ARGV[3]  expected version (0 creates)
ARGV[4]  the blob (encoded JSON, already size-checked)
ARGV[5]  status
ARGV[6]  session id, '' for none
ARGV[7]  now, µs since the epoch (the caller's clock)

Returns  {1, run...} when written, the blob left out (nil: the caller sent it),
         {0, stored version} on a version mismatch (nothing written). A retry of
         a call that wrote returns {1, run...} with the run as it is now, blob
         included: any later put held the version this call wrote, so it built
         on it.
Counters are never touched. Old index entries are removed and new ones added
in the same script, so a listing never sees the run in two statuses.
]]
local prefix, run_id = ARGV[1], ARGV[2]
local expected = tonumber(ARGV[3])
local status, session, now = ARGV[5], ARGV[6], ARGV[7]

if op_done(KEYS[5]) then
  local current = run_reply(prefix, run_id)
  if current then
    return { 1, unpack(current) }
  end
  return { 0, 0 } -- written, then deleted by someone else
end
local meta = redis.call('HMGET', KEYS[2], 'version', 'seq', 'status', 'session')
local stored = tonumber(meta[1] or '0')
if stored ~= expected then
  return { 0, stored }
end

if stored == 0 then
  local seq = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2],
    'version', 1, 'seq', str(seq), 'created', now, 'updated', now, 'status', status,
    'input_tokens', 0, 'output_tokens', 0, 'cost', 0, 'iterations', 0, 'cursor', 0)
  if session ~= '' then
    redis.call('HSET', KEYS[2], 'session', session)
  end
  redis.call('ZADD', KEYS[4], seq, run_id)
  for _, index in ipairs(run_indexes(prefix, status, session)) do
    redis.call('ZADD', index, seq, run_id)
  end
else
  local seq = meta[2]
  local old_status, old_session = meta[3], meta[4] or ''
  if old_status ~= status or old_session ~= session then
    for _, index in ipairs(run_indexes(prefix, old_status, old_session)) do
      redis.call('ZREM', index, run_id)
    end
    for _, index in ipairs(run_indexes(prefix, status, session)) do
      redis.call('ZADD', index, seq, run_id)
    end
  end
  redis.call('HSET', KEYS[2], 'version', str(stored + 1), 'updated', now, 'status', status)
  if session ~= '' then
    redis.call('HSET', KEYS[2], 'session', session)
  else
    redis.call('HDEL', KEYS[2], 'session')
  end
end
redis.call('SET', KEYS[1], ARGV[4])
op_record(KEYS[5], '1')
local written = redis.call('HMGET', KEYS[2], unpack(RUN_FIELDS))
written[#RUN_FIELDS + 1] = false
return { 1, unpack(written) }
