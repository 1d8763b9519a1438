--[[ claimed (step 2 of 2): write the records of items claim.lua just leased.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                          ARGV[2]  now, µs (the claim's own now)
ARGV[3], ARGV[4], ...  R, token pairs as claim.lua returned them

Returns  {R, item, R, item, ...}: each item's record (HGETALL) after the write,
         for the pairs whose lease is still theirs. A pair whose lease moved on
         in between (reaped) is left out.
Writes   status leased, attempts + 1, updated = now, ctok = token; unless
         reap.lua already wrote exactly that, which this then leaves alone.
]]
local out = {}
for i = 3, #ARGV, 2 do
  local r, token = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', LEASE_TOKENS, r) == token then
    write_claim(r, token, NOW)
    out[#out + 1] = r
    out[#out + 1] = redis.call('HGETALL', item_key(r))
  end
end
return out
