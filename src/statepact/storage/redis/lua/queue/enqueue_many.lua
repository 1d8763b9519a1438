--[[ enqueue_many: enqueue's put for each item of a batch, in one script (all or none).

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
then, per item, thirteen values as enqueue's ARGV[3..15]: R, tenant, item_id,
payload (already size-checked), priority, available_at µs, created_at µs,
unique_key, unique_for µs, timeout, slot, limit_key ('' when not set), weight.

Returns  per item, in order, its flag and (flag 0 only: the item was there) its item_reply,
         flat; the caller has the records of the items stored now. An item whose slot
         an earlier item of the batch took answers that item.
The front checked every argument, so no call below can fail half-way.
]]
local out = {}
for i = 3, #ARGV, 13 do
  local put = put_item(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5],
    ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9], ARGV[i + 10], ARGV[i + 11], ARGV[i + 12])
  out[#out + 1] = put[1]
  out[#out + 1] = put[2]
end
return out
