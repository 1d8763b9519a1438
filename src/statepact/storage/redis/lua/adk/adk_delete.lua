--[[ adk_delete: remove a session, its state and its events together.

KEYS[1]  P s:R     KEYS[3]  P ev:R    KEYS[5]  P all              KEYS[7]  P heads
KEYS[2]  P st:R    KEYS[4]  P et:R    KEYS[6]  P by:<seg(user)>   KEYS[8]  P idle
ARGV[1]  R

Returns  1 if the session existed, 0 if not. The app and user state, and the
session's run (its token counters, the cost record), stay.
]]
local existed = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
for i = 5, 8 do
  redis.call('ZREM', KEYS[i], ARGV[1])
end
return existed
