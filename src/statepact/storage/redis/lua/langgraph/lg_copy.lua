--[[ lg_copy: copy every checkpoint, write and blob of one thread onto another.

KEYS[1]  P threads     KEYS[2]  P ixa
ARGV[1]  P     ARGV[2]  source TH     ARGV[3]  target TH     ARGV[4]  now, µs

Returns  the number of checkpoints copied. A target checkpoint of the same id is
         replaced, a target write of the same field too; a target blob is kept.
]]
local p, source, target, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local spaces = {}
for _, member in ipairs(redis.call('ZRANGE', ixt_key(p, source), 0, -1)) do
  local got = parts(member)
  local cid, ns = got[1], got[2]
  local from, to = cp_key(p, source, ns, cid), cp_key(p, target, ns, cid)
  local record = redis.call('HGETALL', from)
  if #record > 0 then
    local old_run = redis.call('HGET', to, 'run') or ''
    redis.call('DEL', to)
    redis.call('HSET', to, unpack(record))
    redis.call('HSET', to, 'at', now)
    index(p, target, ns, cid, redis.call('HGET', from, 'run') or '', old_run)
    spaces[ns] = true
  end
end
for _, member in ipairs(redis.call('ZRANGE', ixw_key(p, source), 0, -1)) do
  local got = parts(member)
  local writes = redis.call('HGETALL', wr_key(p, source, got[2], got[1]))
  if #writes > 0 then
    redis.call('HSET', wr_key(p, target, got[2], got[1]), unpack(writes))
    redis.call('ZADD', ixw_key(p, target), 0, member)
  end
end
local copied = 0
for ns in pairs(spaces) do
  local blobs = redis.call('HGETALL', bl_key(p, source, ns))
  for i = 1, #blobs, 2 do
    redis.call('HSETNX', bl_key(p, target, ns), blobs[i], blobs[i + 1])
  end
  copied = copied + 1
end
if copied > 0 then
  redis.call('ZADD', KEYS[1], 'GT', now, target)
end
return redis.call('ZCARD', ixt_key(p, source))
