--[[ put_session: write a session's blob if the caller holds the stored version.

KEYS[1]  P session:<seg(session_id)>
KEYS[2]  P sessionh:<seg(session_id)>
KEYS[3]  P seq
KEYS[4]  P sessions          every session of the tenant, scored by seq
ARGV[1]  P, the tenant prefix
ARGV[2]  session_id
ARGV[3]  expected version (0 creates)
ARGV[4]  the blob
ARGV[5]  now, µs
ARGV[6]  call id (12 chars)

Returns  {1, session...} (SESSION_FIELDS, then the blob) when written or
         already written by this call; {0, stored version} on a mismatch.
]]
local expected = tonumber(ARGV[3])
local meta = redis.call('HMGET', KEYS[2], 'version', 'ops')
local stored = tonumber(meta[1] or '0')
if stored ~= expected then
  if stored > 0 and op_position(meta[2], ARGV[6]) == 1 then
    return { 1, unpack(session_reply(ARGV[1], ARGV[2])) }
  end
  return { 0, stored }
end
if stored == 0 then
  local seq = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2], 'version', 1, 'seq', str(seq), 'created', ARGV[5], 'updated', ARGV[5],
    'ops', op_remember(nil, ARGV[6]))
  redis.call('ZADD', KEYS[4], seq, ARGV[2])
else
  redis.call('HSET', KEYS[2], 'version', str(stored + 1), 'updated', ARGV[5],
    'ops', op_remember(meta[2], ARGV[6]))
end
redis.call('SET', KEYS[1], ARGV[4])
return { 1, unpack(session_reply(ARGV[1], ARGV[2])) }
