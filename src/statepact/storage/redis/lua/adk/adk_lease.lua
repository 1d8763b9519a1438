--[[ adk_lease: acquire, renew or release a session's lease (one writer at a time).

KEYS[1]  P s:R
ARGV[1]  'acquire', 'renew' or 'release'
ARGV[2]  owner
ARGV[3]  token (renew, release)
ARGV[4]  now, µs (the caller's clock)
ARGV[5]  expires, µs (acquire, renew)

Returns  acquire: {1, token} granted (the token is above every token the session
         issued), {2, owner, expires} another owner holds a live lease, {0} no session;
         renew: {1, token} extended, {2} the lease is not the session's live one;
         release: {1} released, {2} it was not the session's lease any more.
The token is kept when the lease ends: the next holder's is higher.
]]
local meta = redis.call('HMGET', KEYS[1], 'version', 'owner', 'token', 'expires')
if not meta[1] then
  return ARGV[1] == 'acquire' and { 0 } or { 2 }
end
local now = tonumber(ARGV[4])
local holder = live_lease(meta[2], meta[4], now)
if ARGV[1] == 'acquire' then
  if holder and holder ~= ARGV[2] then
    return { 2, holder, meta[4] }
  end
  local token = str(tonumber(meta[3] or '0') + 1)
  redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'token', token, 'expires', ARGV[5])
  return { 1, token }
end
if meta[2] ~= ARGV[2] or meta[3] ~= ARGV[3] then
  return { 2 }
end
if ARGV[1] == 'renew' then
  if not holder then
    return { 2 }
  end
  redis.call('HSET', KEYS[1], 'expires', ARGV[5])
  return { 1, meta[3] }
end
redis.call('HDEL', KEYS[1], 'owner', 'expires')
return { 1 }
