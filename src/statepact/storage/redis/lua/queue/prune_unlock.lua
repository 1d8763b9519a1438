--[[ prune_unlock: give the prune lock back, if it is still this pruner's.

KEYS     QueueKeys.fixed(), then KEYS[20] Q prune-lock
ARGV[1]  Q                 ARGV[2]  now, µs (unused)
ARGV[3]  this pruner's lock token

Returns  1 released, 0 it was not held by this token (expired, or another's):
         left alone.
]]
if redis.call('GET', KEYS[20]) == ARGV[3] then
  redis.call('DEL', KEYS[20])
  return 1
end
return 0
