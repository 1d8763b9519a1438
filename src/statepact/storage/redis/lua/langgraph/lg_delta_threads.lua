--[[ lg_delta_threads: which threads have a checkpoint whose metadata holds the key
counters_since_delta_snapshot (their graph uses a DeltaChannel).

KEYS[1]  P ixa
ARGV[1]  P
ARGV[2...] TH

Returns  the threads found. Writes nothing.
]]
local p = ARGV[1]
local found = {}
for i = 2, #ARGV do
  local th = ARGV[i]
  for _, member in ipairs(redis.call('ZRANGE', ixt_key(p, th), 0, -1)) do
    local got = parts(member)
    local meta = redis.call('HGET', cp_key(p, th, got[2], got[1]), 'meta')
    if meta and cjson.decode(meta)['counters_since_delta_snapshot'] ~= nil then
      found[#found + 1] = th
      break
    end
  end
end
return found
