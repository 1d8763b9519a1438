--[[ stats: per-tenant counts of queued, leased, dead and cancelled items, read together.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs (unused)

Returns  {queued, leased, dead, cancelled}, each a flat {tenant, n, ...}
         (HGETALL of count:<status>). Writes nothing. Cost: O(tenants), whatever
         the number of finished items.
]]
return {
  redis.call('HGETALL', N_QUEUED),
  redis.call('HGETALL', N_LEASED),
  redis.call('HGETALL', N_DEAD),
  redis.call('HGETALL', N_CANCELLED),
}
