--[[ heartbeat: extend a live lease with a new token, fenced on the old one.

KEYS     QueueKeys.fixed(), then KEYS[20] this call's replay key
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R                 ARGV[4]  the lease's token
ARGV[5]  new expires_at, µs

Returns  {1, new token, item} extended (a retry of a call that extended gets
         the token it gave again), {0} the lease is not the item's any more
         (nothing written).
The item's record is left as it was.
]]
local r, token = ARGV[3], ARGV[4]
local ikey = item_key(r)
local given = op_done(OP)
if given then
  return { 1, given, item_reply(ikey) }
end
if redis.call('HGET', LEASE_TOKENS, r) ~= token then
  return { 0 }
end
local fresh = str(next_token(TOKEN))
redis.call('HSET', LEASE_TOKENS, r, fresh)
redis.call('ZADD', LEASES, ARGV[5], r)
op_record(OP, fresh)
return { 1, fresh, item_reply(ikey) }
