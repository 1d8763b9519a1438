--[[ put_session: write a session's blob if the caller holds the stored version.

KEYS[1]  P session:<seg(session_id)>
KEYS[2]  P sessionh:<seg(session_id)>
KEYS[3]  P seq
KEYS[4]  P sessions          every session of the tenant, scored by seq
KEYS[5]  P op:<seg(call id)> this call's replay key (see _common.lua)
ARGV[1]  P, the tenant prefix
ARGV[2]  session_id
ARGV[3]  expected version (0 creates)
ARGV[4]  the blob
ARGV[5]  now, µs

Returns  {1, session...} (SESSION_FIELDS, then the blob) when written (or,
         for a retry of a call that wrote, as it is now); {0, stored version}
         on a mismatch.
]]
if op_done(KEYS[5]) then
  return { 1, unpack(session_reply(ARGV[1], ARGV[2])) }
end
local expected = tonumber(ARGV[3])
local stored = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if stored ~= expected then
  return { 0, stored }
end
if stored == 0 then
  local seq = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2], 'version', 1, 'seq', str(seq), 'created', ARGV[5], 'updated', ARGV[5])
  redis.call('ZADD', KEYS[4], seq, ARGV[2])
else
  redis.call('HSET', KEYS[2], 'version', str(stored + 1), 'updated', ARGV[5])
end
redis.call('SET', KEYS[1], ARGV[4])
op_record(KEYS[5], '1')
return { 1, unpack(session_reply(ARGV[1], ARGV[2])) }
