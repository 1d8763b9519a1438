--[[ heartbeat: extend a live lease with a new token, fenced on the old one.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R                 ARGV[4]  the lease's token
ARGV[5]  call id (12 chars)
ARGV[6]  new expires_at, µs

Returns  {1, new token, item} extended (or already extended by this same
         call: the token it gave is returned again), {0} the lease is not the
         item's any more (nothing written).
The item's record is left as it was, apart from remembering the call id.
]]
local r, token, op = ARGV[3], ARGV[4], ARGV[5]
local ikey = item_key(r)
local live = redis.call('HGET', LEASE_TOKENS, r)
if live ~= token then
  if live and redis.call('HGET', ikey, 'op') == op then
    return { 1, live, redis.call('HGETALL', ikey) }
  end
  return { 0 }
end
local fresh = str(redis.call('INCR', TOKEN))
redis.call('HSET', LEASE_TOKENS, r, fresh)
redis.call('ZADD', LEASES, ARGV[6], r)
redis.call('HSET', ikey, 'op', op)
return { 1, fresh, redis.call('HGETALL', ikey) }
