--[[ tx_lease_renew: extend a live lease, keeping its token.

KEYS[1]  P:lease:R     hash: owner, token, expires (µs), ttl (seconds)
ARGV[1]  owner
ARGV[2]  token
ARGV[3]  now, µs (the front's injected clock)
ARGV[4]  new expires_at, µs
ARGV[5]  new ttl, seconds

Returns  1 renewed; 0 (nothing changed) unless the current lease has this
         token and owner and has not expired at now.
]]
local current = redis.call('HMGET', KEYS[1], 'owner', 'token', 'expires')
if not current[1] or current[1] ~= ARGV[1] or current[2] ~= ARGV[2]
  or tonumber(current[3]) <= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], 'expires', ARGV[4], 'ttl', ARGV[5])
return 1
