--[[ tx_lease_acquire: grant a resource lease with a new, strictly higher token.

KEYS[1]  P:lease:R     hash: owner, token, expires (µs), ttl (seconds)
KEYS[2]  P:fence:R     the highest token ever issued for R (only next_token touches it)
ARGV[1]  owner
ARGV[2]  now, µs (the front's injected clock)
ARGV[3]  expires_at, µs
ARGV[4]  ttl, seconds (as Python wrote the float)

Returns  the new token (integer) when granted: the resource had no lease, its
         lease expired (expires <= now) or the live lease is ARGV[1]'s own (a
         re-acquire); nil, changing nothing, while another owner holds a live
         lease. The token mark survives release and expiry, and next_token
         (_common.lua) never issues one below the server's clock in µs, so
         tokens never go backwards, even on a server that forgot writes.
]]
local current = redis.call('HMGET', KEYS[1], 'owner', 'expires')
if current[1] and tonumber(current[2]) > tonumber(ARGV[2]) and current[1] ~= ARGV[1] then
  return nil
end
local token = next_token(KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', str(token), 'expires', ARGV[3],
  'ttl', ARGV[4])
return token
