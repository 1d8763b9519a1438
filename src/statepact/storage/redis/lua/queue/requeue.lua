--[[ requeue: bring a dead item back, due now, attempts reset, last error kept.

KEYS     QueueKeys.fixed(), then KEYS[20] this call's replay key
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R

Returns  {1, item} requeued (a retry of a call that requeued gets the item as
         it is now), {0} no such item, {0, status} the item is not dead
         (nothing written). A requeued item holds no unique slot.
]]
local ikey = item_key(ARGV[3])
if op_done(OP) then
  return { 1, item_reply(ikey) }
end
local f = redis.call('HMGET', ikey, 'status', 'tenant', 'id')
if not f[1] then
  return { 0 }
end
if f[1] ~= 'dead' then
  return { 0, f[1] }
end
local tenant, id = f[2], f[3]
redis.call('ZREM', dead_key(tenant), id)
redis.call('ZREM', FINISHED.dead, ARGV[3])
redis.call('ZREM', DEAD_IDS, tenant .. '\0' .. id)
-- Going dead freed its unique slot for good: a requeued item holds none.
redis.call('HDEL', ikey, 'slot')
count(N_DEAD, tenant, -1)
count(N_QUEUED, tenant, 1)
redis.call('HSET', ikey, 'status', 'queued', 'attempts', 0, 'available', NOW, 'updated', NOW)
make_ready(tenant, id, ikey)
op_record(OP, '1')
return { 1, item_reply(ikey) }
