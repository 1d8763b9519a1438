--[[ set_paused: pause or resume the queue (queue.pause(), queue.resume()).

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs (unused)
ARGV[3]  '1' pause, '0' resume

Returns  1. Pausing sets Q paused, which claim.lua reads first; resuming deletes
         it and, when items are queued, pushes wake-up tokens (one per queued
         item, at most WAKE_MAX) as an enqueue does, so blocked watchers claim
         again at once. Idempotent: a retry writes the same.
]]
if ARGV[3] == '1' then
  redis.call('SET', PAUSED, '1')
  return 1
end
if redis.call('DEL', PAUSED) == 1 then
  local queued = 0
  for _, n in ipairs(redis.call('HVALS', N_QUEUED)) do
    queued = queued + tonumber(n)
  end
  for _ = 1, math.min(queued, WAKE_MAX) do
    wake()
  end
end
return 1
