--[[ lg_prune: keep each namespace's newest checkpoint of the threads, delete the rest.

KEYS[1]  P ixa
ARGV[1]  P
ARGV[2...] TH

Returns  the number of checkpoints deleted. Their writes go with them, and the blobs no
         kept checkpoint reads; a kept checkpoint whose parent went loses its parent.
]]
local p = ARGV[1]
local count = 0
for i = 2, #ARGV do
  local th = ARGV[i]
  local newest, by_ns = {}, {}
  for _, member in ipairs(redis.call('ZRANGE', ixt_key(p, th), 0, -1)) do
    local got = parts(member)
    local ns, cid = got[2], got[1]
    if not newest[ns] or cid > newest[ns] then
      newest[ns] = cid
    end
    by_ns[ns] = by_ns[ns] or {}
    by_ns[ns][#by_ns[ns] + 1] = cid
  end
  for ns, cids in pairs(by_ns) do
    local freed, gone = {}, {}
    for _, cid in ipairs(cids) do
      if cid ~= newest[ns] then
        for _, field in ipairs(drop(p, th, ns, cid)) do
          freed[field] = true
        end
        gone[cid] = true
        count = count + 1
      end
    end
    local kept = cp_key(p, th, ns, newest[ns])
    local parent = redis.call('HGET', kept, 'parent')
    if parent and gone[parent] then
      redis.call('HDEL', kept, 'parent')
    end
    free_blobs(p, th, ns, freed)
  end
end
return count
