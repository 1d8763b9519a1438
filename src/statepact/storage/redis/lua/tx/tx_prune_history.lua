--[[ tx_prune_history: drop, from some keys' histories of one resource, the entries
superseded by an entry committed before a cutoff (RedisBackend.prune_history).

KEYS[1]     P:trim:R     key -> the newest version trimmed from P:hist:R:K
KEYS[2..]   P:hist:R:K   one per key of ARGV[2..], in the same order
ARGV[1]     cutoff, µs since the epoch (the caller's clock)
ARGV[2..]   the keys

Returns  how many entries were dropped. Each key's newest entry committed before
         the cutoff stays, and P:trim:R records the newest one dropped, so
         tx_read refuses a snapshot that needed it ("snapshot too old") as it
         does for one trimmed by history_limit. A list holds at most
         history_limit entries, so the script stays short.
]]
local cutoff = tonumber(ARGV[1])
local dropped = 0
for i = 2, #KEYS do
  local key = ARGV[i]
  local entries = redis.call('LRANGE', KEYS[i], 0, -1)
  for index, entry in ipairs(entries) do
    if tonumber(string.match(entry, '^%d+:(%d+):')) < cutoff then
      if index < #entries then
        -- Newest first: keep 1..index, drop what follows.
        redis.call('LTRIM', KEYS[i], 0, index - 1)
        local newest = entry_version(entries[index + 1])
        local known = tonumber(redis.call('HGET', KEYS[1], key) or '0')
        if newest > known then
          redis.call('HSET', KEYS[1], key, str(newest))
        end
        dropped = dropped + #entries - index
      end
      break
    end
  end
end
return dropped
