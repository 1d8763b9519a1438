--[[ tx_lock: try once to take a shared or exclusive lock for a transaction (RedisBackend.lock).

KEYS[1]  P:lock:R:K    set of holders "<txn_id>|shared" / "<txn_id>|exclusive"
ARGV[1]  txn_id
ARGV[2]  mode: 'shared' | 'exclusive'
ARGV[3]  lock TTL, milliseconds

Returns  1 granted (or already held in that mode or stronger; asking for
         exclusive while holding shared upgrades once no one else holds it),
         0 not granted (nothing changed). Python polls with backoff until its
         timeout.

The set carries a TTL, so a crashed holder cannot block the key forever: every
grant sets it to at least ARGV[3] from now, and the set (all holders) expires
once no grant refreshed it for that long. Redis's clock measures this TTL; it
is a real-time safety net, not a lease (leases use the injected clock).
]]
local txn, mode, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local mine_shared, mine_exclusive = txn .. '|shared', txn .. '|exclusive'

local function refresh()
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end

if redis.call('SISMEMBER', KEYS[1], mine_exclusive) == 1
  or (mode == 'shared' and redis.call('SISMEMBER', KEYS[1], mine_shared) == 1) then
  refresh()
  return 1
end

for _, holder in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if holder ~= mine_shared and holder ~= mine_exclusive then
    if mode == 'exclusive' or string.sub(holder, -10) == '|exclusive' then
      return 0
    end
  end
end

if mode == 'exclusive' then
  redis.call('SREM', KEYS[1], mine_shared)
end
redis.call('SADD', KEYS[1], txn .. '|' .. mode)
refresh()
return 1
