--[[ dead_letters_all: dead items of every tenant, by (tenant, item_id), a page at a time.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs (unused)
ARGV[3]  start after this "T\0id" ('' from the first)
ARGV[4]  limit

Returns  {item, item, ...} (item_reply each), in (tenant, item_id) byte order, which
         is code point order: ids hold no NUL, so "T\0id" sorts as the pair.
         Writes nothing. Cost: O(log n + limit) in dead-ids.
]]
local from = '-'
if ARGV[3] ~= '' then
  from = '(' .. ARGV[3]
end
local out = {}
for _, member in ipairs(redis.call('ZRANGEBYLEX', DEAD_IDS, from, '+', 'LIMIT', 0, tonumber(ARGV[4]))) do
  local cut = string.find(member, '\0', 1, true)
  local tenant, id = string.sub(member, 1, cut - 1), string.sub(member, cut + 1)
  out[#out + 1] = item_reply(item_key(ref(tenant, id)))
end
return out
