--[[ tx_unlock: release every lock a transaction holds (RedisBackend.end).

KEYS     P:lock:R:K for each key the transaction asked to lock (possibly not granted)
ARGV[1]  txn_id

Returns  how many holder entries were removed. Removing an entry that is not
         there is a no-op, so a lock request that was never granted (or whose
         set already expired) is released harmlessly.
]]
local removed = 0
for _, key in ipairs(KEYS) do
  removed = removed + redis.call('SREM', key, ARGV[1] .. '|shared', ARGV[1] .. '|exclusive')
end
return removed
