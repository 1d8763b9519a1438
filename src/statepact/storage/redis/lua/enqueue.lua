--[[ enqueue: store a new item, or return the one already stored under the same id.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R = ref(tenant, item_id)
ARGV[4]  tenant            ARGV[5]  item_id
ARGV[6]  payload (encoded JSON, already size-checked)
ARGV[7]  priority          ARGV[8]  available_at, µs
ARGV[9]  created_at, µs

Returns  {1, item} stored now, {0, item} already there (untouched); item is HGETALL.
A due item goes straight to its tenant's ready set, a later one to delayed.
]]
local ikey = item_key(ARGV[3])
if redis.call('EXISTS', ikey) == 1 then
  return { 0, redis.call('HGETALL', ikey) }
end
local tenant, id = ARGV[4], ARGV[5]
redis.call('HSET', ikey,
  'tenant', tenant, 'id', id, 'payload', ARGV[6], 'priority', ARGV[7],
  'available', ARGV[8], 'attempts', 0, 'status', 'queued',
  'created', ARGV[9], 'updated', ARGV[9], 'order', str(redis.call('INCR', ORDER)))
count(N_QUEUED, tenant, 1)
schedule(tenant, id, ikey, ARGV[8])
return { 1, redis.call('HGETALL', ikey) }
