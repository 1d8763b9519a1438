--[[ stats: per-tenant counts of queued, leased and dead items, read together.

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs (unused)

Returns  {queued, leased, dead}, each a flat {tenant, n, tenant, n, ...}
         (HGETALL of count:<status>). Writes nothing.
]]
return {
  redis.call('HGETALL', N_QUEUED),
  redis.call('HGETALL', N_LEASED),
  redis.call('HGETALL', N_DEAD),
}
