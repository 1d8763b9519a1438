--[[ dead_letters: a tenant's dead items, oldest death first (ties by id, byte order).

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs (unused)
ARGV[3]  tenant            ARGV[4]  limit

Returns  {item, item, ...} (item_reply each). Writes nothing.
]]
local tenant = ARGV[3]
local out = {}
for _, id in ipairs(redis.call('ZRANGE', dead_key(tenant), 0, tonumber(ARGV[4]) - 1)) do
  out[#out + 1] = item_reply(item_key(ref(tenant, id)))
end
return out
