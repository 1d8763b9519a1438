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
         item the record (item_reply) after the claim. A retry of a call that
         claimed gets the same leases again (those still holding their item) and
         claims nothing more.

Each item moves from its tenant's ready set to the lease set, its token goes
into lease-tokens, and its record is written (status leased, attempts + 1,
updated, ctok = token). Cost per claimed item: O(log n) in the tenant's ready
set and O(log t) in the rotation; idle tenants and the backlog are never
scanned. Delayed items are promoted lazily here, each once. While Q paused
exists the claim answers {0} at once. With Q limits set, claim_limited
(below) walks the rotation instead, passing over tenants and items a cap
or a rate holds back (bounded: docs/backings.md#flow-control).
]]
local done = redis.call('LRANGE', OP, 0, -1)
if #done > 0 then
  local out = { 0 }
  for i = 1, #done, 2 do
    local r, token = done[i], done[i + 1]
    if redis.call('HGET', LEASE_TOKENS, r) == token then
      out[#out + 1] = r
      out[#out + 1] = token
      out[#out + 1] = item_reply(item_key(r))
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

-- Lease item id of tenant (already taken off ready:T): the tenant's turn moves to the
-- back (or it leaves the rotation), the item's record, counts and answer are written.
local function lease(tenant, id, rkey)
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
  hold_key(ikey, tenant, 1)
  pairs_claimed[#pairs_claimed + 1] = r
  pairs_claimed[#pairs_claimed + 1] = token
  out[#out + 1] = r
  out[#out + 1] = token
  out[#out + 1] = item_reply(ikey)
  claimed = claimed + 1
end

-- Flow control (statepact._queue_limits, the same rules as the memory queue): a
-- tenant at its cap, or whose first LOOKAHEAD ready items a key cap, a (tenant,
-- key) cap or a rate holds back, keeps its turn and the walk goes on to the next
-- tenant; at most MAX_PASSES tenants are passed over per call.
local LOOKAHEAD, MAX_PASSES, BUCKETS = 64, 1000, 10

local function num(v)
  if v == nil or v == cjson.null then
    return nil
  end
  return tonumber(v)
end

-- The limit ``map`` (a JSON object) gives ``name``, else ``default``; nil for no name or
-- no limit (absent or JSON null).
local function limit_of(map, name, default)
  if name == nil then
    return nil
  end
  local limit = default
  if map ~= nil and map ~= cjson.null and map[name] ~= nil then
    limit = map[name]
  end
  if limit == cjson.null then
    return nil
  end
  return limit
end

local function cap_of(map, name, default)
  return num(limit_of(map, name, default))
end

local now = tonumber(NOW)
local spent = {} -- spent-key -> {bucket -> weight}, read once per call

local function spent_key(kind, name)
  return Q .. 'spent:' .. kind .. ':' .. seg(name)
end

local function bucket_width(rate)
  return math.max(1000, math.floor(rate.per * 1000000 / BUCKETS))
end

local function spent_of(key)
  local got = spent[key]
  if got == nil then
    got = {}
    local flat = redis.call('HGETALL', key)
    for i = 1, #flat, 2 do
      got[tonumber(flat[i])] = tonumber(flat[i + 1])
    end
    spent[key] = got
  end
  return got
end

-- When a claim of weight fits rate (now: at once), or nil: never.
local function fits_at(key, rate, weight)
  if weight > rate.weight then
    return nil
  end
  local width = bucket_width(rate)
  local current = math.floor(now / width)
  local buckets = spent_of(key)
  for ahead = 0, BUCKETS + 1 do
    local first = current + ahead - BUCKETS
    local used = 0
    for bucket, w in pairs(buckets) do
      if bucket >= first and bucket <= current then
        used = used + w
      end
    end
    if used + weight <= rate.weight then
      if ahead == 0 then
        return now
      end
      return (current + ahead) * width
    end
  end
  return nil
end

local function spend(key, rate, weight)
  local width = bucket_width(rate)
  local current = math.floor(now / width)
  local buckets = spent_of(key)
  buckets[current] = (buckets[current] or 0) + weight
  redis.call('HINCRBY', key, string.format('%d', current), weight)
  for bucket, _ in pairs(buckets) do
    if bucket < current - BUCKETS then
      buckets[bucket] = nil
      redis.call('HDEL', key, string.format('%d', bucket))
    end
  end
  redis.call('PEXPIRE', key, math.ceil(rate.per * 2000) + 1000)
end

local function claim_limited(limits, limit, lease)
  local wake = nil
  local index, passes = 0, 0
  while claimed < limit and passes < MAX_PASSES do
    local head = redis.call('ZRANGE', ROTATION, index, index)
    if #head == 0 then
      break
    end
    local tenant = head[1]
    local rkey = ready_key(tenant)
    local pick = nil
    local tcap = cap_of(limits.tenant_caps, tenant, limits.per_tenant)
    if tcap == nil or (tonumber(redis.call('HGET', N_LEASED, tenant)) or 0) < tcap then
      for _, id in ipairs(redis.call('ZRANGE', rkey, 0, LOOKAHEAD - 1)) do
        local f = redis.call('HMGET', item_key(ref(tenant, id)), 'lkey', 'weight')
        local lkey, weight = f[1] or nil, tonumber(f[2] or '1')
        if lkey == false then
          lkey = nil
        end
        local held = false
        local kcap = cap_of(limits.key_caps, lkey, limits.per_key)
        if kcap ~= nil and (tonumber(redis.call('HGET', N_LEASED_KEY, lkey)) or 0) >= kcap then
          held = true
        end
        local pcap = lkey and num(limits.per_tenant_key)
        if not held and pcap ~= nil
            and (tonumber(redis.call('HGET', N_LEASED_PAIR, ref(tenant, lkey))) or 0) >= pcap then
          held = true
        end
        local charge = {}
        if not held then
          local latest = now
          local krate = limit_of(limits.key_rates, lkey, limits.key_rate)
          if krate then
            charge[#charge + 1] = { spent_key('k', lkey), krate }
          end
          local trate = limits.tenant_rate
          if trate ~= nil and trate ~= cjson.null then
            charge[#charge + 1] = { spent_key('t', tenant), trate }
          end
          for _, c in ipairs(charge) do
            local at = fits_at(c[1], c[2], weight)
            if at == nil then
              held, latest = true, nil
              break
            end
            if at > latest then
              latest = at
            end
          end
          if latest ~= nil and latest > now then
            held = true
            if wake == nil or latest < wake then
              wake = latest
            end
          end
        end
        if not held then
          pick = id
          for _, c in ipairs(charge) do
            spend(c[1], c[2], weight)
          end
          break
        end
      end
    end
    if pick then
      redis.call('ZREM', rkey, pick)
      lease(tenant, pick, rkey)
    else
      index, passes = index + 1, passes + 1
    end
  end
  if wake then
    redis.call('SET', Q .. 'rate-wake', string.format('%d', wake), 'PX',
      math.max(0, math.ceil((wake - now) / 1000)) + 60000)
  end
end

local limits = redis.call('GET', Q .. 'limits')
if not limits then
  -- No limits (the usual queue): the head of the rotation, its best item, as before.
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
      lease(tenant, popped[1], rkey)
    end
  end
else
  claim_limited(cjson.decode(limits), limit, lease)
end
if claimed > 0 then
  for i = 1, #pairs_claimed, 100 do
    redis.call('RPUSH', OP, unpack(pairs_claimed, i, math.min(i + 99, #pairs_claimed)))
  end
  redis.call('PEXPIRE', OP, REPLAY_MS)
end
return out
