--[[ oldest_ready: per tenant with ready work, the earliest available_at of its ready items.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  the most entries of delayed that came due (no claim promoted them yet) to read

Returns  {T, available µs, T, available µs, ...}. Writes nothing.

ready:T orders by priority, then enqueue order, not by time: its head within each
priority band is the band's earliest enqueued item. The answer is the earliest
available_at among those heads (one ZRANGEBYSCORE per band present, at most 64
bands) and among the first ARGV[3] due entries of delayed (oldest first). An item
retried or delayed behind a later-enqueued one of its band is not seen before it:
the answer is then a lower bound of the wait. Cost: O(tenants with ready work *
bands * log n + ARGV[3]).
]]
local MAX_BANDS = 64
local oldest = {}

local function seen(tenant, available)
  local at = tonumber(available)
  if at and (oldest[tenant] == nil or at < oldest[tenant]) then
    oldest[tenant] = at
  end
end

for _, tenant in ipairs(redis.call('ZRANGE', ROTATION, 0, -1)) do
  local key = ready_key(tenant)
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local bands = 0
  while head[1] and bands < MAX_BANDS do
    seen(tenant, redis.call('HGET', item_key(ref(tenant, head[1])), 'available'))
    -- The next band starts at the next multiple of PRIORITY_SPAN (exact: below 2^53).
    local after = (math.floor(tonumber(head[2]) / PRIORITY_SPAN) + 1) * PRIORITY_SPAN
    head = redis.call(
      'ZRANGEBYSCORE', key, string.format('%.0f', after), '+inf', 'WITHSCORES', 'LIMIT', 0, 1
    )
    bands = bands + 1
  end
end

local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', NOW, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
for i = 1, #due, 2 do
  local tenant = redis.call('HGET', item_key(due[i]), 'tenant')
  if tenant then
    seen(tenant, due[i + 1])
  end
end

local out = {}
for tenant, at in pairs(oldest) do
  out[#out + 1] = tenant
  out[#out + 1] = string.format('%.0f', at)
end
return out
