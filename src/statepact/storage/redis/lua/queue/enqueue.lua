--[[ enqueue: store a new item, or return the one already stored under the same id.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  R = ref(tenant, item_id)
ARGV[4]  tenant            ARGV[5]  item_id
ARGV[6]  payload (encoded JSON, already size-checked)
ARGV[7]  priority          ARGV[8]  available_at, µs
ARGV[9]  created_at, µs

Returns  {1, {}} stored now (as sent: the caller has its record), {0, item} already
         there (untouched); item is HGETALL.
A due item goes straight to its tenant's ready set, a later one to delayed.
]]
return put_item(ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
