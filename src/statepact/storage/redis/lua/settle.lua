--[[ settle: end a lease as ack, fail or release decided, fenced on its token.

KEYS     QueueKeys.fixed(), then KEYS[13] this call's replay key
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R                 ARGV[4]  the lease's token
ARGV[5]  new status: done | dead | queued
ARGV[6]  new available_at, µs, or '' to keep it
ARGV[7]  '1' to set the error to ARGV[8], '0' to keep it
ARGV[8]  error text
ARGV[9]  change to attempts ('0', or '-1' for release)

Returns  {1, item} settled (a retry of a call that settled gets the item as it
         is now), {0} the lease is not the item's any more (nothing written).
A queued item goes to ready when due, else delayed; a dead one to dead:T
scored by now, so dead letters list oldest death first, ties by id.
]]
local r, token, status = ARGV[3], ARGV[4], ARGV[5]
local ikey = item_key(r)
if op_done(OP) then
  return { 1, redis.call('HGETALL', ikey) }
end
if redis.call('HGET', LEASE_TOKENS, r) ~= token then
  return { 0 }
end
local f = redis.call('HMGET', ikey, 'tenant', 'id', 'available')
local tenant, id = f[1], f[2]
local available = f[3]
end_lease(r, tenant)
redis.call('HSET', ikey, 'status', status, 'updated', NOW)
if ARGV[6] ~= '' then
  available = ARGV[6]
  redis.call('HSET', ikey, 'available', available)
end
if ARGV[7] == '1' then
  redis.call('HSET', ikey, 'error', ARGV[8])
end
if ARGV[9] ~= '0' then
  redis.call('HINCRBY', ikey, 'attempts', ARGV[9])
end
if status == 'dead' then
  redis.call('ZADD', dead_key(tenant), NOW, id)
  count(N_DEAD, tenant, 1)
elseif status == 'queued' then
  count(N_QUEUED, tenant, 1)
  schedule(tenant, id, ikey, available)
end
op_record(OP, '1')
return { 1, redis.call('HGETALL', ikey) }
