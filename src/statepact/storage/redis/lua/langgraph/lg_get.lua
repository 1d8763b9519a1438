--[[ lg_get: one checkpoint with its blobs and writes: of an id, or a namespace's newest.

KEYS[1]  P ix:<seg(TH)>:<seg(NS)>   the namespace's checkpoints
ARGV[1]  P     ARGV[2]  TH     ARGV[3]  NS
ARGV[4]  CID, or '' for the newest

Returns  the record (see record() in _prelude.lua), or nil.
]]
local cid = ARGV[4]
if cid == '' then
  local newest = redis.call('ZREVRANGE', KEYS[1], 0, 0)
  if #newest == 0 then
    return nil
  end
  cid = newest[1]
end
return record(ARGV[1], ARGV[2], ARGV[3], cid)
