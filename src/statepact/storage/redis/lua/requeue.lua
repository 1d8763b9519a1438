--[[ requeue: bring a dead item back, due now, attempts reset, last error kept.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R                 ARGV[4]  call id (12 chars)

Returns  {1, item} requeued (or already requeued by this same call),
         {0} no such item, {0, status} the item is not dead (nothing written).
]]
local ikey = item_key(ARGV[3])
local f = redis.call('HMGET', ikey, 'status', 'tenant', 'id', 'op')
if not f[1] then
  return { 0 }
end
if f[1] ~= 'dead' then
  if f[4] == ARGV[4] then
    return { 1, redis.call('HGETALL', ikey) }
  end
  return { 0, f[1] }
end
local tenant, id = f[2], f[3]
redis.call('ZREM', dead_key(tenant), id)
count(N_DEAD, tenant, -1)
count(N_QUEUED, tenant, 1)
redis.call('HSET', ikey, 'status', 'queued', 'attempts', 0, 'available', NOW, 'updated', NOW,
  'op', ARGV[4])
make_ready(tenant, id, ikey)
return { 1, redis.call('HGETALL', ikey) }
