--[[ adk_prune_sessions: remove the sessions of an app last written before a cutoff,
oldest first, at most ARGV[3] of them (with their state and events).

KEYS[1]  P idle     KEYS[2]  P all     KEYS[3]  P heads
ARGV[1]  P, the app's prefix
ARGV[2]  the cutoff, µs (the caller's clock)
ARGV[3]  how many sessions at most

Returns  how many sessions were removed. Their runs stay (the cost record).
]]
local prefix = ARGV[1]
local refs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0, ARGV[3])
for _, r in ipairs(refs) do
  local session, state, events, stamps = session_keys(prefix, r)
  redis.call('DEL', session, state, events, stamps)
  redis.call('ZREM', KEYS[1], r)
  redis.call('ZREM', KEYS[2], r)
  redis.call('ZREM', KEYS[3], r)
  redis.call('ZREM', prefix .. 'by:' .. seg(user_of(r)), r)
end
return #refs
