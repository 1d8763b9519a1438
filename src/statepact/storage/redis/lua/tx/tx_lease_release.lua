--[[ tx_lease_release: give a lease up if it is still the current one.

KEYS[1]  P:lease:R     hash: owner, token, expires (µs), ttl (seconds)
ARGV[1]  token

Returns  1 when the current lease had this token and is now gone, else 0.
         P:fence:R is not touched: the next acquisition gets a higher token.
]]
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
