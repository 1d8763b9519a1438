--[[ lg_delete_runs: delete the checkpoints of runs, their writes, the blobs freed.

KEYS[1]  P ixa
ARGV[1]  P
ARGV[2...] run ids

Returns  the number of checkpoints deleted. A blob goes when no checkpoint left in its
         namespace reads it.
]]
local p = ARGV[1]
local freed, count = {}, 0
for i = 2, #ARGV do
  local key = run_key(p, ARGV[i])
  for _, member in ipairs(redis.call('SMEMBERS', key)) do
    local got = parts(member)
    local space = got[1] .. '\0' .. got[2]
    freed[space] = freed[space] or {}
    for _, field in ipairs(drop(p, got[1], got[2], got[3])) do
      freed[space][field] = true
    end
    count = count + 1
  end
  redis.call('DEL', key)
end
for space, fields in pairs(freed) do
  local got = parts(space)
  free_blobs(p, got[1], got[2], fields)
end
return count
