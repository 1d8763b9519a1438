--[[ adk_page: one page of an app's (or a user's) sessions in seq order, without events.

KEYS[1]  P all, or P by:<seg(user)>
KEYS[2]  P app
ARGV[1]  P, the app's prefix (the keys of each session listed are built from it)
ARGV[2]  the seq to start after (0: from the first)
ARGV[3]  how many at most

Returns  {app pairs, R, {SESSION_FIELDS...}, session pairs, user pairs, R, ...}: each
         user's state is read once per page.
]]
local prefix = ARGV[1]
local reply = { redis.call('HGETALL', KEYS[2]) }
local refs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf', 'LIMIT', 0, ARGV[3])
local users = {}
for _, r in ipairs(refs) do
  local session, state = session_keys(prefix, r)
  local meta = redis.call('HMGET', session, unpack(SESSION_FIELDS))
  if meta[1] then
    local user = user_of(r)
    if not users[user] then
      users[user] = redis.call('HGETALL', prefix .. 'u:' .. seg(user))
    end
    for i = 1, #SESSION_FIELDS do
      meta[i] = meta[i] or false
    end
    reply[#reply + 1] = r
    reply[#reply + 1] = meta
    reply[#reply + 1] = redis.call('HGETALL', state)
    reply[#reply + 1] = users[user]
  end
end
return reply
