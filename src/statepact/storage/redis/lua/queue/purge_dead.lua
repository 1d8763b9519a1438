--[[ purge_dead: delete up to a batch of a tenant's dead items, oldest death first.

KEYS     QueueKeys.fixed(), then KEYS[20] this call's replay key
ARGV[1]  Q                 ARGV[2]  now, µs (unused)
ARGV[3]  tenant            ARGV[4]  most items to delete in this call

Returns  {seen, purged}: the members of dead:T this call took (seen < ARGV[4]
         means none is left: the caller loops until then, so one call never
         holds the server for long) and the items it deleted; a retry of a call
         that ran gets the same answer.
Deletes each item's hash (so its id is free for a new enqueue), its member of
dead:T and finished:dead and its share of count:dead. A dead item is in no other set.
]]
local done = op_done(OP)
if done then
  local seen, purged = string.match(done, '^(%d+),(%d+)$')
  return { tonumber(seen), tonumber(purged) }
end
local tenant = ARGV[3]
local dkey = dead_key(tenant)
local ids = redis.call('ZRANGE', dkey, 0, tonumber(ARGV[4]) - 1)
local purged = 0
for _, id in ipairs(ids) do
  local ikey = item_key(ref(tenant, id))
  -- dead:T holds only dead items; the check keeps a broken invariant from deleting work.
  if redis.call('HGET', ikey, 'status') == 'dead' then
    redis.call('DEL', ikey)
    redis.call('ZREM', FINISHED.dead, ref(tenant, id))
    redis.call('ZREM', DEAD_IDS, tenant .. '\0' .. id)
    purged = purged + 1
  end
end
if #ids > 0 then
  redis.call('ZREM', dkey, unpack(ids))
end
if purged > 0 then
  count(N_DEAD, tenant, -purged)
end
op_record(OP, str(#ids) .. ',' .. str(purged))
return { #ids, purged }
