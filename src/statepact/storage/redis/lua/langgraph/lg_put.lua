--[[ lg_put: store a checkpoint, the blobs it brings, its index entries, its thread's time.

KEYS[1]  P cp:<seg(TH)>:<seg(NS)>:<seg(CID)>   the checkpoint
KEYS[2]  P bl:<seg(TH)>:<seg(NS)>              the namespace's blobs
KEYS[3]  P threads                              threads by last write
ARGV[1]  P, the tenant prefix
ARGV[2]  TH     ARGV[3]  NS     ARGV[4]  CID
ARGV[5]  parent checkpoint id ('' none)
ARGV[6]  type   ARGV[7]  data (the checkpoint without its values)
ARGV[8]  metadata (JSON)
ARGV[9]  run id ('' none)
ARGV[10] now, µs (the caller's clock)
ARGV[11] refs: the blob fields it reads, each as seg(field)
ARGV[12...] pairs: a new blob's field ref(channel, version), its value seg(type) data

Returns  1. A blob already stored is kept (a version's value never changes); a
         checkpoint of the same id is replaced; the thread's time never goes back.
]]
local p, th, ns, cid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local old_run = redis.call('HGET', KEYS[1], 'run') or ''
redis.call('HSET', KEYS[1], 'type', ARGV[6], 'data', ARGV[7], 'meta', ARGV[8], 'at', ARGV[10],
  'refs', ARGV[11])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'parent', ARGV[5])
else
  redis.call('HDEL', KEYS[1], 'parent')
end
if ARGV[9] ~= '' then
  redis.call('HSET', KEYS[1], 'run', ARGV[9])
else
  redis.call('HDEL', KEYS[1], 'run')
end
for i = 12, #ARGV, 2 do
  redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])
end
index(p, th, ns, cid, ARGV[9], old_run)
redis.call('ZADD', KEYS[3], 'GT', ARGV[10], th)
return 1
