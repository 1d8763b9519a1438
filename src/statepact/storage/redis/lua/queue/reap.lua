--[[ reap: finish half-written claims, then move expired leases on.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  dead_at, the front's decision (QueuePolicy.after_lapse): an expired
         item with attempts >= this goes dead, any other back to ready, due now
ARGV[4]  most entries to handle per step in one call
ARGV[5]  the error recorded on every item moved (the decision's error), appended to
         its error history (kind lease_expired)
ARGV[6]  the most error history entries kept (MAX_ERROR_HISTORY)

Returns  {more, item, item, ...}: the moved items (item_reply) and more = 1 when
         a cap was reached and another call may find more.
First every pending claim (an earlier version's two-script claim whose second
script never came) gets its record written (status leased, attempts + 1,
updated = claim time), so such a claimer leaves an ordinary leased item. Then
each lease with expires_at <= now ends: error and available_at set, updated = now.
]]
local cap = tonumber(ARGV[4])
local dead_at = tonumber(ARGV[3])
local more = 0

local half = redis.call('ZRANGE', PENDING, 0, cap - 1, 'WITHSCORES')
for i = 1, #half, 2 do
  local r = half[i]
  local token = redis.call('HGET', LEASE_TOKENS, r)
  if token then
    write_claim(r, token, str(tonumber(half[i + 1])))
  else
    redis.call('ZREM', PENDING, r)
  end
end
if #half >= 2 * cap then
  more = 1
end

local out = { 0 }
local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', NOW, 'LIMIT', 0, cap)
for _, r in ipairs(expired) do
  local ikey = item_key(r)
  local f = redis.call('HMGET', ikey, 'tenant', 'id', 'attempts')
  local tenant, id = f[1], f[2]
  end_lease(r, tenant)
  redis.call('HSET', ikey, 'error', ARGV[5], 'available', NOW, 'updated', NOW)
  add_error(ikey, ARGV[5], 'lease_expired', ARGV[6])
  if tonumber(f[3]) >= dead_at then
    redis.call('HSET', ikey, 'status', 'dead')
    redis.call('ZADD', dead_key(tenant), NOW, id)
    count(N_DEAD, tenant, 1)
    finish(r, tenant, id, ikey, 'dead')
  else
    redis.call('HSET', ikey, 'status', 'queued')
    count(N_QUEUED, tenant, 1)
    make_ready(tenant, id, ikey)
  end
  out[#out + 1] = item_reply(ikey)
end
if #expired >= cap then
  more = 1
end
out[1] = more
return out
