--[[ adk_events: one page of a session's events in seq order (keyset: after a seq).

KEYS[1]  P s:R
KEYS[2]  P ev:R
ARGV[1]  the seq to start after (0: from the oldest kept)
ARGV[2]  how many at most

Returns  nil when the session does not exist, else {first seq returned, events...}.
]]
local meta = redis.call('HMGET', KEYS[1], 'head', 'version')
if not meta[1] then
  return nil
end
local head, version = tonumber(meta[1]), tonumber(meta[2])
local first = math.max(tonumber(ARGV[1]) + 1, head)
if first > version then
  return { str(first) }
end
local reply = { str(first) }
local events = redis.call('LRANGE', KEYS[2], first - head, first - head + tonumber(ARGV[2]) - 1)
for _, event in ipairs(events) do
  reply[#reply + 1] = event
end
return reply
