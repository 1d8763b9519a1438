--[[ claim: lease up to `limit` due items, tenants served in rotation, in one script.

KEYS     QueueKeys.fixed(): delayed, rotation, turns, turn, order, token,
         leases, lease-tokens, pending, count:queued, count:leased, count:dead,
         count:cancelled, finished:done, finished:cancelled, finished:dead,
         unique, paused, dead-ids;
         KEYS[20] Q op:<seg(call id)>, this call's replay key (a list)
ARGV[1]  Q, the queue prefix        ARGV[2]  now, µs
ARGV[3]  expires_at of the new leases, µs
ARGV[4]  limit                      ARGV[5]  most delayed items to promote in one call

Returns  {1} when more than ARGV[5] delayed items came due: they were promoted,
         nothing was claimed, call again (a claim must see every due item to
         honour priorities, and one script must not block the server for long);
         otherwise {0, R, token, item, R, token, item, ...} in the order claimed,
         item the record (HGETALL) after the claim. A retry of a call that
         claimed gets the same leases again (those still holding their item) and
         claims nothing more.

Each item moves from its tenant's ready set to the lease set, its token goes
into lease-tokens, and its record is written (status leased, attempts + 1,
updated, ctok = token). Cost per claimed item: O(log n) in the tenant's ready
set and O(log t) in the rotation; idle tenants and the backlog are never
scanned. Delayed items are promoted lazily here, each once. While Q paused
exists the claim answers {0} at once.
]]
local done = redis.call('LRANGE', OP, 0, -1)
if #done > 0 then
  local out = { 0 }
  for i = 1, #done, 2 do
    local r, token = done[i], done[i + 1]
    if redis.call('HGET', LEASE_TOKENS, r) == token then
      out[#out + 1] = r
      out[#out + 1] = token
      out[#out + 1] = redis.call('HGETALL', item_key(r))
    end
  end
  return out
end

-- Paused (queue.pause()): nothing is claimed, nothing promoted; one key read.
if redis.call('EXISTS', PAUSED) == 1 then
  return { 0 }
end

local cap = tonumber(ARGV[5])
local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', NOW, 'LIMIT', 0, cap)
for _, r in ipairs(due) do
  redis.call('ZREM', DELAYED, r)
  local ikey = item_key(r)
  local f = redis.call('HMGET', ikey, 'tenant', 'id')
  make_ready(f[1], f[2], ikey)
end
if #due >= cap then
  return { 1 }
end

local limit, expires = tonumber(ARGV[4]), ARGV[3]
local out = { 0 }
local pairs_claimed = {}
local claimed = 0
while claimed < limit do
  local head = redis.call('ZRANGE', ROTATION, 0, 0)
  if #head == 0 then
    break
  end
  local tenant = head[1]
  local rkey = ready_key(tenant)
  local popped = redis.call('ZPOPMIN', rkey)
  if #popped == 0 then
    -- Cannot happen while the invariant holds; never loop on it.
    redis.call('ZREM', ROTATION, tenant)
  else
    local id = popped[1]
    local turn = redis.call('INCR', TURN)
    redis.call('HSET', TURNS, tenant, str(turn))
    if redis.call('EXISTS', rkey) == 1 then
      redis.call('ZADD', ROTATION, turn, tenant)
    else
      redis.call('ZREM', ROTATION, tenant)
    end
    local r = ref(tenant, id)
    local token = str(next_token(TOKEN))
    redis.call('ZADD', LEASES, expires, r)
    redis.call('HSET', LEASE_TOKENS, r, token)
    local ikey = item_key(r)
    redis.call('HINCRBY', ikey, 'attempts', 1)
    redis.call('HSET', ikey, 'status', 'leased', 'updated', NOW, 'ctok', token)
    count(N_QUEUED, tenant, -1)
    count(N_LEASED, tenant, 1)
    pairs_claimed[#pairs_claimed + 1] = r
    pairs_claimed[#pairs_claimed + 1] = token
    out[#out + 1] = r
    out[#out + 1] = token
    out[#out + 1] = redis.call('HGETALL', ikey)
    claimed = claimed + 1
  end
end
if claimed > 0 then
  for i = 1, #pairs_claimed, 100 do
    redis.call('RPUSH', OP, unpack(pairs_claimed, i, math.min(i + 99, #pairs_claimed)))
  end
  redis.call('PEXPIRE', OP, REPLAY_MS)
end
return out
