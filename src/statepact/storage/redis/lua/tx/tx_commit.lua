--[[ tx_commit: validate and apply one transaction atomically (RedisBackend.commit).

KEYS[1]  P:seq                       the global commit sequence
KEYS[2]  P:res                       registered resource names
KEYS[3]  P:op:<seg(txn_id)>          this commit's outcome record (see below)
KEYS[4]  P:idem:<seg(idem)>          only when ARGV[7] (fingerprint) is not ''
next     P:fence:<seg(fence res)>    only when ARGV[8] (fencing token) is not ''
then 4 keys per write, in the order of the writes:
         P:meta:R, P:data:R, P:hist:R:K, P:trim:R
then 1 key per read, in the order of the reads:
         P:data:R
ARGV[1]  isolation: 'read_committed' | 'snapshot' | 'serializable'
ARGV[2]  taken_at, the snapshot's sequence; '' for a transaction that read nothing
         (its snapshot is this commit: the current sequence, so no write conflicts)
ARGV[3]  now, µs since the epoch (the front's injected clock)
ARGV[4]  txn_id
ARGV[5]  history_limit (>= 1)
ARGV[6]  idempotency record TTL, seconds
ARGV[7]  fingerprint (hex), '' without an idempotency key
ARGV[8]  fencing token, '' without fencing
ARGV[9]  W, the number of writes;  ARGV[10]  N, the number of reads
then 3 per write: resource, key, body ('=' .. JSON text, or '-' to delete)
then 2 per read:  key, the version the transaction observed (0 = absent)

Returns, nothing applied unless the first element is 0:
  {0, version}                committed (read-only: version = taken_at); also
                              when this same txn already committed (a resend
                              after a lost reply finds its outcome record)
  {1, version}                replayed: the idempotency key committed the same
                              request before (fingerprints equal)
  {2, highest}                fencing token below the highest issued
  {3}                         idempotency key used for a different request
  {4, 1, i, latest}           write i (1-based) was committed after taken_at
  {4, 2, j, latest}           read j is no longer at the version observed

The outcome record: a commit that changed something (it wrote, or it stored
an idempotency record) leaves "<version>" under P:op:<seg(txn_id)> as its
last step, expiring after REPLAY_MS (lua/_common.lua, two minutes: far past
any failover budget). A resend of the same commit (its reply lost; our
failover, or a client's own retry, sends the same txn id) finds it first and
answers {0, version}, applying nothing, however many versions of its keys
were committed and trimmed in between and whether or not its idempotency
record is still there. A commit that was refused (2, 3, 4) or replayed (1)
applied nothing and records nothing: its resend is judged afresh, and since
versions and fencing tokens only grow, a refusal stays a refusal; whichever
answer the caller gets, the request applied at most once. A read-only commit
without an idempotency key records nothing either: a resend validates again,
which can only turn its success into a refusal of a commit that wrote nothing.

Order (the StorageBackend contract): own-resend check, fencing, idempotency,
validation, apply (INCR P:seq only when writing; data, capped history, meta,
registry), idempotency record, outcome record -- all in this one script, so
one round trip.
]]
local isolation = ARGV[1]
local taken_at
if ARGV[2] == '' then
  taken_at = tonumber(redis.call('GET', KEYS[1]) or '0')
else
  taken_at = tonumber(ARGV[2])
end
local now, txn = ARGV[3], ARGV[4]
local limit = tonumber(ARGV[5])
local fingerprint, token = ARGV[7], ARGV[8]
local nwrites, nreads = tonumber(ARGV[9]), tonumber(ARGV[10])

local op_key = KEYS[3]
local k = 4
local idem_key, fence_key
if fingerprint ~= '' then
  idem_key = KEYS[k]
  k = k + 1
end
if token ~= '' then
  fence_key = KEYS[k]
  k = k + 1
end
local write_keys, read_keys = k, k + 4 * nwrites
local write_args, read_args = 11, 11 + 3 * nwrites
local records = nwrites > 0 or idem_key ~= nil

-- A resend of this very commit after it applied: its outcome record tells.
if records then
  local done = op_done(op_key)
  if done then
    return { 0, tonumber(done) }
  end
end

-- The latest entry of every written key: needed by validation.
local latest = {}
for i = 1, nwrites do
  local base = write_keys + 4 * (i - 1)
  local entry = redis.call('HGET', KEYS[base + 1], ARGV[write_args + 3 * (i - 1) + 1])
  latest[i] = entry and entry_version(entry) or 0
end

local record
if idem_key then
  record = redis.call('GET', idem_key)
end

if fence_key then
  local highest = tonumber(redis.call('GET', fence_key) or '0')
  if tonumber(token) < highest then
    return { 2, highest }
  end
end

if record then
  local stored, version = string.match(record, '^([^:]*):(%d+):')
  if stored == fingerprint then
    return { 1, tonumber(version) }
  end
  return { 3 }
end

if isolation ~= 'read_committed' then
  for i = 1, nwrites do
    if latest[i] > taken_at then
      return { 4, 1, i, latest[i] }
    end
  end
  if isolation == 'serializable' then
    for j = 1, nreads do
      local entry = redis.call('HGET', KEYS[read_keys + j - 1], ARGV[read_args + 2 * (j - 1)])
      local version = entry and entry_version(entry) or 0
      if version ~= tonumber(ARGV[read_args + 2 * (j - 1) + 1]) then
        return { 4, 2, j, version }
      end
    end
  end
end

local version = taken_at
if nwrites > 0 then
  version = redis.call('INCR', KEYS[1])
  local head = str(version) .. ':' .. now .. ':' .. txn .. '\0'
  for i = 1, nwrites do
    local base = write_keys + 4 * (i - 1)
    local arg = write_args + 3 * (i - 1)
    local resource, key = ARGV[arg], ARGV[arg + 1]
    local entry = head .. ARGV[arg + 2]
    redis.call('HSET', KEYS[base + 1], key, entry)
    local length = redis.call('LPUSH', KEYS[base + 2], entry)
    if length > limit then
      -- Oldest first; the last one dropped is the newest trimmed version, which
      -- read() needs to tell "snapshot too old" from "absent at the snapshot".
      local dropped
      while length > limit do
        dropped = redis.call('RPOP', KEYS[base + 2])
        length = length - 1
      end
      redis.call('HSET', KEYS[base + 3], key, str(entry_version(dropped)))
    end
    redis.call('HSET', KEYS[base], 'version', str(version), 'at', now)
    redis.call('HSETNX', KEYS[base], 'metadata', '{}')
    redis.call('SADD', KEYS[2], resource)
  end
end

if idem_key then
  redis.call('SET', idem_key, fingerprint .. ':' .. str(version) .. ':' .. now .. ':' .. txn,
    'EX', ARGV[6])
end
if records then
  op_record(op_key, str(version))
end
return { 0, version }
