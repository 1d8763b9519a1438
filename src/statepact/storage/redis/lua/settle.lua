--[[ settle: end a lease as ack, fail or release decided, fenced on its token.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R                 ARGV[4]  the lease's token
ARGV[5]  call id (12 chars)
ARGV[6]  new status: done | dead | queued
ARGV[7]  new available_at, µs, or '' to keep it
ARGV[8]  '1' to set the error to ARGV[9], '0' to keep it
ARGV[9]  error text
ARGV[10] change to attempts ('0', or '-1' for release)

Returns  {1, item} settled (or already settled by this same call),
         {0} the lease is not the item's any more (nothing written).
A queued item goes to ready when due, else delayed; a dead one to dead:T
scored by now, so dead letters list oldest death first, ties by id.
]]
local r, token, op, status = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ikey = item_key(r)
if redis.call('HGET', LEASE_TOKENS, r) ~= token then
  if redis.call('HGET', ikey, 'op') == op then
    return { 1, redis.call('HGETALL', ikey) }
  end
  return { 0 }
end
local f = redis.call('HMGET', ikey, 'tenant', 'id', 'available')
local tenant, id = f[1], f[2]
local available = f[3]
end_lease(r, tenant)
redis.call('HSET', ikey, 'status', status, 'updated', NOW, 'op', op)
if ARGV[7] ~= '' then
  available = ARGV[7]
  redis.call('HSET', ikey, 'available', available)
end
if ARGV[8] == '1' then
  redis.call('HSET', ikey, 'error', ARGV[9])
end
if ARGV[10] ~= '0' then
  redis.call('HINCRBY', ikey, 'attempts', ARGV[10])
end
if status == 'dead' then
  redis.call('ZADD', dead_key(tenant), NOW, id)
  count(N_DEAD, tenant, 1)
elseif status == 'queued' then
  count(N_QUEUED, tenant, 1)
  schedule(tenant, id, ikey, available)
end
return { 1, redis.call('HGETALL', ikey) }
