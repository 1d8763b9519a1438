-- lua/queue/_prelude.lua: prepended (after lua/_common.lua) to every script of lua/queue/.
--
-- Layout (Q = "{<ns>:queue}:<seg(queue)>:", R = ref(tenant, item_id); all one slot):
--   Q item:R          hash   tenant, id, payload, priority, available, attempts,
--                            status, error (absent: none), created, updated (µs),
--                            order (enqueue order), ctok (token whose claim the
--                            record shows)
--   Q ready:<seg(T)>  zset   T's due queued items: member id,
--                            score (1000 - priority) * 2^42 + order
--   Q delayed         zset   queued items not yet due: member R, score available
--   Q rotation        zset   tenants with ready work: member T, score T's last turn
--                            (0: never served); lowest score, then lowest T in
--                            byte order, is served next
--   Q turns           hash   T -> last turn (kept while T is idle)
--   Q turn/order      string INCR counters
--   Q token           string the last lease token issued (next_token, _common.lua)
--   Q leases          zset   leased items: member R, score expires_at
--   Q lease-tokens    hash   R -> token of the live lease (the fencing truth)
--   Q pending         zset   R claimed but record not yet written: score claim time
--                            (only the two-script claim of earlier versions left any)
--   Q dead:<seg(T)>   zset   T's dead items: member id, score time of death
--   Q count:<status>  hash   T -> number of T's items queued / leased / dead / cancelled
--   Q finished:<st>   zset   done / cancelled / dead items: member R, score the time
--                            they finished (prune.lua reads only these)
--   Q unique          hash   ref(T, slot) -> id of the item holding that unique slot
--                            (queued or leased; done too when the slot has a period)
--   Q paused          string present while paused: claim.lua claims nothing
--   Q dead-ids        zset   every dead item as "T\0id", score 0 (by tenant, then id)
--   Q op:<seg(id)>    string/list  a write's replay key (_common.lua), KEYS[20]
--   Q wake            list   wake-up tokens for watchers (make_ready below)
--   Q ctl             pub/sub channel: "<token>:R" when a leased item is cancelled
--
--   Q limits          string the queue's QueueLimits as JSON (absent: none)
--   Q count:leased-key hash  limit key -> leased items holding it
--   Q count:leased-pair hash ref(T, limit key) -> leased items of T holding it
--   Q spent:<kind>:<seg(name)> hash  rate bucket -> weight claimed in it, for a
--                            limit key (kind k) or a tenant (kind t); expires
--   Q rate-wake       string when the earliest item a rate held back fits, µs
--                            (next_due's hint; expires)
-- Those five are named here from Q, not passed as KEYS: all share Q's slot.
--
-- Item hash fields besides the above: ukey (unique_key), ufor (unique_for, µs),
-- timeout (seconds, as the front wrote it), slot (the unique slot it was stored
-- under), lkey (limit_key), weight (absent: 1); each absent when not set. And
-- errors: the error history, a JSON array of {attempt, error, at (µs, a string),
-- kind}, oldest first (absent: none), written by add_error only; no reply of a
-- script carries it (item_reply), only RedisWorkQueue.error_history reads it.
--
-- Every queue script gets the same KEYS (QueueKeys.fixed() in _keys.py), a
-- write its replay key after them as KEYS[20], and ARGV[1] = Q, ARGV[2] = now
-- in µs (the caller's injected clock, never TIME).
-- Invariants: a queued item is in exactly one of ready/delayed; a leased one
-- is in leases and lease-tokens; T is in rotation iff ready:T is not empty; a
-- done / cancelled / dead item is in finished:<its status>.

local DELAYED, ROTATION, TURNS, TURN, ORDER, TOKEN = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local LEASES, LEASE_TOKENS, PENDING = KEYS[7], KEYS[8], KEYS[9]
local N_QUEUED, N_LEASED, N_DEAD, N_CANCELLED = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local FINISHED = { done = KEYS[14], cancelled = KEYS[15], dead = KEYS[16] }
local UNIQUE, PAUSED, DEAD_IDS = KEYS[17], KEYS[18], KEYS[19]
local OP = KEYS[20]
local Q, NOW = ARGV[1], ARGV[2]

-- Priorities run from -1000 to 1000 and the enqueue order stays below 2^42 (four
-- trillion enqueues per queue), so the score stays below 2001 * 2^42 < 2^53, exact.
local PRIORITY_SPAN = 4398046511104

local function item_key(r)
  return Q .. 'item:' .. r
end

-- The item hash as a reply (HGETALL), without its error history: a claim, a settle or
-- a listing never carries the history, whatever its size.
local function item_reply(ikey)
  local all = redis.call('HGETALL', ikey)
  for i = 1, #all, 2 do
    if all[i] == 'errors' then
      table.remove(all, i)
      table.remove(all, i)
      break
    end
  end
  return all
end

-- Append {attempt (the item's attempts now), error, at = now, kind} to the item's error
-- history, keeping the newest `cap` (the front's MAX_ERROR_HISTORY, from ARGV). Called
-- by every write of the item's error (settle's fail, reap, cancel with a reason).
local function add_error(ikey, error, kind, cap)
  local found = redis.call('HGET', ikey, 'errors')
  local history = found and cjson.decode(found) or {}
  history[#history + 1] = {
    attempt = tonumber(redis.call('HGET', ikey, 'attempts')), error = error, at = NOW, kind = kind
  }
  local keep = tonumber(cap)
  if #history > keep then
    local newest = {}
    for i = #history - keep + 1, #history do
      newest[#newest + 1] = history[i]
    end
    history = newest
  end
  redis.call('HSET', ikey, 'errors', cjson.encode(history))
end

local function ready_key(tenant)
  return Q .. 'ready:' .. seg(tenant)
end

local function dead_key(tenant)
  return Q .. 'dead:' .. seg(tenant)
end

local function count(key, tenant, delta)
  if redis.call('HINCRBY', key, tenant, delta) <= 0 then
    redis.call('HDEL', key, tenant)
  end
end

-- Q wake (a list of at most WAKE_MAX "1"s): one pushed per item scheduled, so each
-- watcher blocked on it (BLPOP, RedisWorkQueue.watch) is woken by one item; for a
-- delayed item the watcher asks next_due and sleeps until then.
local WAKE_MAX = 64
local woken = 0 -- tokens this script pushed: past WAKE_MAX more would be trimmed anyway

local function wake()
  if woken >= WAKE_MAX then
    return
  end
  woken = woken + 1
  local list = Q .. 'wake'
  redis.call('LPUSH', list, '1')
  redis.call('LTRIM', list, 0, WAKE_MAX - 1)
end

local function make_ready(tenant, id, ikey)
  wake()
  local f = redis.call('HMGET', ikey, 'priority', 'order')
  local score = (1000 - tonumber(f[1])) * PRIORITY_SPAN + tonumber(f[2])
  redis.call('ZADD', ready_key(tenant), score, id)
  if not redis.call('ZSCORE', ROTATION, tenant) then
    redis.call('ZADD', ROTATION, redis.call('HGET', TURNS, tenant) or 0, tenant)
  end
end

-- A queued item goes where a claim finds it: ready when due, else delayed.
local function schedule(tenant, id, ikey, available)
  if tonumber(available) <= tonumber(NOW) then
    make_ready(tenant, id, ikey)
  else
    wake()
    redis.call('ZADD', DELAYED, available, ref(tenant, id))
  end
end

-- The record write of a claim, done by reap for a pending claim (one an earlier
-- version's two-script claim left half written). Idempotent: a record already
-- showing this token is left alone.
local function write_claim(r, token, at)
  local ikey = item_key(r)
  if redis.call('HGET', ikey, 'ctok') ~= token then
    redis.call('HINCRBY', ikey, 'attempts', 1)
    redis.call('HSET', ikey, 'status', 'leased', 'updated', at, 'ctok', token)
  end
  redis.call('ZREM', PENDING, r)
end

-- A lease ends (settled or reaped): off the lease set, the token forgotten.
local N_LEASED_KEY, N_LEASED_PAIR = Q .. 'count:leased-key', Q .. 'count:leased-pair'

-- Count (delta 1) or uncount (-1) a leased item in its limit key's and its
-- (tenant, key)'s leased counts; kept whether or not limits are set, so limits
-- set later see the true counts. Every lease start and end passes here.
local function hold_key(ikey, tenant, delta)
  local lkey = redis.call('HGET', ikey, 'lkey')
  if lkey then
    count(N_LEASED_KEY, lkey, delta)
    count(N_LEASED_PAIR, ref(tenant, lkey), delta)
  end
end

local function end_lease(r, tenant)
  redis.call('ZREM', LEASES, r)
  redis.call('HDEL', LEASE_TOKENS, r)
  redis.call('ZREM', PENDING, r)
  count(N_LEASED, tenant, -1)
  hold_key(item_key(r), tenant, -1)
  if redis.call('EXISTS', Q .. 'limits') == 1 then
    wake() -- a freed slot: a watcher held back by a cap claims again
  end
end

-- The item holding unique slot `slot` of `tenant` while it blocks (queued or
-- leased; done too when its slot has a period, the bucket being in the slot), as
-- its key; nil when the slot is free (an entry left by an item that stopped
-- blocking without clearing it is not a holder).
local function slot_holder(tenant, slot)
  local holder = redis.call('HGET', UNIQUE, ref(tenant, slot))
  if not holder then
    return nil
  end
  local hkey = item_key(ref(tenant, holder))
  local f = redis.call('HMGET', hkey, 'status', 'ufor', 'slot')
  if f[3] ~= slot then
    return nil
  end
  if f[1] == 'queued' or f[1] == 'leased' or (f[1] == 'done' and f[2]) then
    return hkey
  end
  return nil
end

-- The item left a blocking state: its slot is free (if it still holds it).
local function free_slot(tenant, id, ikey)
  local slot = redis.call('HGET', ikey, 'slot')
  if slot then
    local field = ref(tenant, slot)
    if redis.call('HGET', UNIQUE, field) == id then
      redis.call('HDEL', UNIQUE, field)
    end
  end
end

-- An item became done, cancelled or dead (its hash already says so): indexed by
-- the time it finished for prune, counted, and its unique slot freed unless a
-- done item keeps it to the end of its period.
local function finish(r, tenant, id, ikey, status)
  redis.call('ZADD', FINISHED[status], NOW, r)
  if status == 'cancelled' then
    count(N_CANCELLED, tenant, 1)
  elseif status == 'dead' then
    redis.call('ZADD', DEAD_IDS, 0, tenant .. '\0' .. id)
  end
  if status ~= 'done' or not redis.call('HGET', ikey, 'ufor') then
    free_slot(tenant, id, ikey)
  end
end

-- Store a new item, or leave the one already stored under the same id untouched,
-- or (slot not '') return the item holding that unique slot. Returns {1, {}}
-- stored now (the caller has its record), {0, item} already there or the slot's
-- holder, item its HGETALL. ukey, ufor (µs), timeout, slot: '' when not set.
local function put_item(r, tenant, id, payload, priority, available, created, ukey, ufor, timeout,
                        slot, lkey, weight)
  local ikey = item_key(r)
  if redis.call('EXISTS', ikey) == 1 then
    return { 0, item_reply(ikey) }
  end
  if slot ~= '' then
    local held = slot_holder(tenant, slot)
    if held then
      return { 0, item_reply(held) }
    end
    redis.call('HSET', UNIQUE, ref(tenant, slot), id)
    redis.call('HSET', ikey, 'slot', slot)
  end
  local fields = {
    'tenant', tenant, 'id', id, 'payload', payload, 'priority', priority,
    'available', available, 'attempts', 0, 'status', 'queued',
    'created', created, 'updated', created, 'order', str(redis.call('INCR', ORDER)),
  }
  -- The optional fields, written only when they differ from what their absence means.
  for _, field in ipairs({
    { 'ukey', ukey, '' }, { 'ufor', ufor, '' }, { 'timeout', timeout, '' },
    { 'lkey', lkey, '' }, { 'weight', weight, '1' },
  }) do
    if field[2] ~= field[3] then
      fields[#fields + 1] = field[1]
      fields[#fields + 1] = field[2]
    end
  end
  redis.call('HSET', ikey, unpack(fields))
  count(N_QUEUED, tenant, 1)
  schedule(tenant, id, ikey, available)
  return { 1, {} }
end

-- End the lease of item r held under token as ack, fail or release decided:
-- status done | dead | queued; available '' keeps it; set_error '1' writes error;
-- attempts_change '0' or '-1' (release); the error, when written, is appended to
-- the history (kind failed, at most cap entries kept). Returns true, or false when token is not
-- the item's lease any more (nothing written). A queued item goes to ready when
-- due, else delayed; a dead one to dead:T scored by now (oldest death first).
local function settle_item(r, token, status, available_at, set_error, error, attempts_change, cap)
  if redis.call('HGET', LEASE_TOKENS, r) ~= token then
    return false
  end
  local ikey = item_key(r)
  local f = redis.call('HMGET', ikey, 'tenant', 'id', 'available')
  local tenant, id = f[1], f[2]
  local available = f[3]
  end_lease(r, tenant)
  redis.call('HSET', ikey, 'status', status, 'updated', NOW)
  if available_at ~= '' then
    available = available_at
    redis.call('HSET', ikey, 'available', available)
  end
  if set_error == '1' then
    redis.call('HSET', ikey, 'error', error)
    add_error(ikey, error, 'failed', cap)
  end
  if attempts_change ~= '0' then
    redis.call('HINCRBY', ikey, 'attempts', attempts_change)
  end
  if status == 'dead' then
    redis.call('ZADD', dead_key(tenant), NOW, id)
    count(N_DEAD, tenant, 1)
    finish(r, tenant, id, ikey, status)
  elseif status == 'done' then
    finish(r, tenant, id, ikey, status)
  elseif status == 'queued' then
    count(N_QUEUED, tenant, 1)
    schedule(tenant, id, ikey, available)
  end
  return true
end
