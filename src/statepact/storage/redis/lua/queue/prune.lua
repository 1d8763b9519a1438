--[[ prune: delete up to a batch of finished items past their retention, oldest first.

KEYS     QueueKeys.fixed(), then KEYS[20] Q prune-lock
ARGV[1]  Q                 ARGV[2]  now, µs (unused: the cutoffs are the front's)
ARGV[3]  this pruner's lock token     ARGV[4]  the lock's lifetime, ms
ARGV[5]  most items to delete in this call (PRUNE_BATCH)
ARGV[6], ARGV[7], ARGV[8]  the cutoffs of done, cancelled, dead items, µs:
         an item that finished before it goes; '' keeps that status forever

Returns  {-1, 0} the lock is not this pruner's (it expired and another took
         it): nothing deleted, stop; else {more, deleted}, more = 1 when the
         batch was filled and another call may find more.
Reads only finished:<status> (by the time each item finished), never a scan:
one call costs O(batch log n). Each item deleted loses its hash (its id is
free again), its index entries (finished:<status>, dead:T), its share of
count:<status> and its unique slot (a done item with a period held it until
now). The lock's lifetime starts again with every call.
]]
local LOCK = KEYS[20]
if redis.call('GET', LOCK) ~= ARGV[3] then
  return { -1, 0 }
end
redis.call('PEXPIRE', LOCK, ARGV[4])
local left = tonumber(ARGV[5])
local deleted = 0
local more = 0
local cutoffs = { { 'done', ARGV[6] }, { 'cancelled', ARGV[7] }, { 'dead', ARGV[8] } }
for _, entry in ipairs(cutoffs) do
  local status, cutoff = entry[1], entry[2]
  if cutoff ~= '' and left > 0 then
    local index = FINISHED[status]
    local members = redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. cutoff, 'LIMIT', 0, left)
    for _, r in ipairs(members) do
      local ikey = item_key(r)
      local f = redis.call('HMGET', ikey, 'status', 'tenant', 'id')
      -- The index holds only items of its status; the check keeps a broken
      -- invariant from deleting live work.
      if f[1] == status then
        local tenant, id = f[2], f[3]
        free_slot(tenant, id, ikey)
        redis.call('DEL', ikey)
        if status == 'dead' then
          redis.call('ZREM', dead_key(tenant), id)
          redis.call('ZREM', DEAD_IDS, tenant .. '\0' .. id)
          count(N_DEAD, tenant, -1)
        elseif status == 'cancelled' then
          count(N_CANCELLED, tenant, -1)
        end
        deleted = deleted + 1
      end
      redis.call('ZREM', index, r)
    end
    left = left - #members
    if left <= 0 then
      more = 1
    end
  end
end
return { more, deleted }
