--[[ adk_prune_events: remove, oldest first, the events of an app's sessions whose
timestamps are below a cutoff, at most ARGV[3] events.

KEYS[1]  P heads
ARGV[1]  P, the app's prefix
ARGV[2]  the cutoff (epoch seconds, as text)
ARGV[3]  how many events at most

Each session loses a prefix of its events: they go from its oldest while their
timestamp is below the cutoff (an older timestamp after a newer one stays). Returns
how many events were removed.
]]
local prefix, cutoff, budget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local removed = 0
while removed < budget do
  local refs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0, 1)
  if #refs == 0 then
    break
  end
  local r = refs[1]
  local session, _, events, stamps = session_keys(prefix, r)
  local stamps_read = redis.call('LRANGE', stamps, 0, budget - removed - 1)
  local count = 0
  for _, stamp in ipairs(stamps_read) do
    if tonumber(stamp) >= cutoff then
      break
    end
    count = count + 1
  end
  redis.call('LTRIM', events, count, -1)
  redis.call('LTRIM', stamps, count, -1)
  redis.call('HINCRBY', session, 'head', count)
  removed = removed + count
  local next_stamp = redis.call('LINDEX', stamps, 0)
  if next_stamp then
    redis.call('ZADD', KEYS[1], next_stamp, r)
  else
    redis.call('ZREM', KEYS[1], r)
  end
end
return removed
