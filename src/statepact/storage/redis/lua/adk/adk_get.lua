--[[ adk_get: a session, its three state scopes and the events asked for, in one reply.

KEYS[1]  P s:R     KEYS[3]  P ev:R    KEYS[5]  P app
KEYS[2]  P st:R    KEYS[4]  P et:R    KEYS[6]  P u:<seg(user)>
ARGV[1]  the most recent events wanted, -1 for all (ADK's num_recent_events)
ARGV[2]  ADK's after_timestamp, '' for none: only the events after the newest one
         whose timestamp is below it (what InMemorySessionService returns)

Returns  nil when the session does not exist, else
         {SESSION_FIELDS..., session pairs, app pairs, user pairs, events oldest first}.
The timestamps are read backwards from the newest, in chunks, and stop at the first
one below after_timestamp: a session's older events are never read.
]]
local meta = redis.call('HMGET', KEYS[1], unpack(SESSION_FIELDS))
if not meta[1] then
  return nil
end
local length = redis.call('LLEN', KEYS[3])
local start = 0
if ARGV[2] ~= '' then
  local after = tonumber(ARGV[2])
  local limit = tonumber(ARGV[1])
  local floor = 0
  if limit >= 0 then
    floor = math.max(0, length - limit) -- what num_recent_events keeps anyway
  end
  local stop = length - 1
  start = floor
  while stop >= floor do
    local from = math.max(floor, stop - 63)
    local stamps = redis.call('LRANGE', KEYS[4], from, stop)
    local found = nil
    for i = #stamps, 1, -1 do
      if tonumber(stamps[i]) < after then
        found = from + i -- the index just after it
        break
      end
    end
    if found then
      start = found
      break
    end
    stop = from - 1
  end
elseif tonumber(ARGV[1]) >= 0 then
  start = math.max(0, length - tonumber(ARGV[1]))
end
local events = {}
if start < length then
  events = redis.call('LRANGE', KEYS[3], start, -1)
end
local reply = {}
for i = 1, #SESSION_FIELDS do
  reply[i] = meta[i] or false
end
reply[#reply + 1] = redis.call('HGETALL', KEYS[2])
reply[#reply + 1] = redis.call('HGETALL', KEYS[5])
reply[#reply + 1] = redis.call('HGETALL', KEYS[6])
reply[#reply + 1] = events
return reply
