--[[ first_run_since: the seq of a tenant's first run (by seq) created at or after a time.

KEYS[1]  P runs (every run of the tenant, scored by seq)
ARGV[1]  P, the tenant prefix
ARGV[2]  since, µs

Returns  that run's seq, or -1 when every run was created before since.
Writes   nothing. Runs are created in seq order, so a binary search: O(log² n),
         one ZRANGE and one HGET per step.
]]
local low, high = 0, redis.call('ZCARD', KEYS[1])
local since = tonumber(ARGV[2])
while low < high do
  local middle = math.floor((low + high) / 2)
  local id = redis.call('ZRANGE', KEYS[1], middle, middle)[1]
  local created = tonumber(redis.call('HGET', ARGV[1] .. 'runh:' .. seg(id), 'created'))
  if created < since then
    low = middle + 1
  else
    high = middle
  end
end
if low >= redis.call('ZCARD', KEYS[1]) then
  return -1
end
return redis.call('ZRANGE', KEYS[1], low, low, 'WITHSCORES')[2]
