--[[ enqueue: store a new item, or return the one already stored under the same id.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R = ref(tenant, item_id)
ARGV[4]  tenant            ARGV[5]  item_id
ARGV[6]  payload (encoded JSON, already size-checked)
ARGV[7]  priority          ARGV[8]  available_at, µs
ARGV[9]  created_at, µs
ARGV[10] unique_key or ''  ARGV[11] unique_for, µs, or ''
ARGV[12] timeout (seconds) or ''
ARGV[13] the unique slot (statepact.queue.unique_slot) or ''
ARGV[14] limit_key or ''    ARGV[15] weight

Returns  {1, {}} stored now (as sent: the caller has its record), {0, item} already
         there (untouched) or the item holding the slot; item is item_reply.
A due item goes straight to its tenant's ready set, a later one to delayed. The
id is checked first, then the slot: one script, so concurrent enqueues of one
slot store one item.
]]
return put_item(ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9],
  ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14], ARGV[15])
