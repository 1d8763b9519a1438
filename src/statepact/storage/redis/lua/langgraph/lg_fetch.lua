--[[ lg_fetch: the records of checkpoints named one by one (a filtered page's matches).

KEYS[1]  P ixa (names the tenant's slot; not read)
ARGV[1]  P
ARGV[2...] triples TH, NS, CID

Returns  {record or false, ...}, one per triple. Writes nothing.
]]
local out = {}
for i = 2, #ARGV, 3 do
  out[#out + 1] = record(ARGV[1], ARGV[i], ARGV[i + 1], ARGV[i + 2]) or false
end
return out
