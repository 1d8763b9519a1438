--[[ cancel: items of one tenant to cancelled, in one script (queue.cancel, cancel_many).

KEYS     QueueKeys.fixed()
ARGV[1]  Q                 ARGV[2]  now, µs
ARGV[3]  '1' to set the error to ARGV[4], '0' to clear it (no reason given)
ARGV[4]  the reason, appended to each cancelled item's error history (kind cancelled)
ARGV[5]  the most error history entries kept (MAX_ERROR_HISTORY)
then R per item, in the order asked.

Returns  per item, flat: {0, {}} no such item, {1, item} the item after the call
         (item_reply): cancelled now, or done / dead / cancelled already and
         untouched.
A queued item leaves its ready set (its tenant leaves the rotation when that
empties) or the delayed set; a leased one loses its lease (lease-tokens is the
fencing truth, so every later settle or heartbeat of it is refused) and a
control notice "<token>:R" goes out on the channel Q ctl, which every
RedisWorkQueue.watch(on_cancel=...) subscribes to. Either way the item becomes
cancelled (error = the reason), is indexed in finished:cancelled and counted,
and frees its unique slot. Cancelling twice answers the cancelled item: a retry
after a lost reply answers as the first run did, so no replay key is needed.
]]
local out = {}
for i = 6, #ARGV do
  local r = ARGV[i]
  local ikey = item_key(r)
  local f = redis.call('HMGET', ikey, 'status', 'tenant', 'id')
  local status, tenant, id = f[1], f[2], f[3]
  if not status then
    out[#out + 1] = 0
    out[#out + 1] = {}
  else
    if status == 'queued' then
      local rkey = ready_key(tenant)
      if redis.call('ZREM', rkey, id) == 1 then
        if redis.call('EXISTS', rkey) == 0 then
          redis.call('ZREM', ROTATION, tenant)
        end
      else
        redis.call('ZREM', DELAYED, r)
      end
      count(N_QUEUED, tenant, -1)
    elseif status == 'leased' then
      local token = redis.call('HGET', LEASE_TOKENS, r)
      end_lease(r, tenant)
      if token then
        redis.call('PUBLISH', Q .. 'ctl', token .. ':' .. r)
      end
    end
    if status == 'queued' or status == 'leased' then
      redis.call('HSET', ikey, 'status', 'cancelled', 'updated', NOW)
      if ARGV[3] == '1' then
        redis.call('HSET', ikey, 'error', ARGV[4])
        add_error(ikey, ARGV[4], 'cancelled', ARGV[5])
      else
        redis.call('HDEL', ikey, 'error')
      end
      finish(r, tenant, id, ikey, 'cancelled')
    end
    out[#out + 1] = 1
    out[#out + 1] = item_reply(ikey)
  end
end
return out
