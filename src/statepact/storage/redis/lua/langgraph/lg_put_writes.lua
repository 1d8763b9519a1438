--[[ lg_put_writes: store a task's pending writes on a checkpoint.

KEYS[1]  P wr:<seg(TH)>:<seg(NS)>:<seg(CID)>   the checkpoint's writes
KEYS[2]  P ixw:<seg(TH)>                        the thread's write keys
ARGV[1]  the checkpoint's member of KEYS[2]: CID \0 NS
ARGV[2...] triples: field ref(task, idx), value, '1' when idx < 0 (replaced) else '0'

Returns  1. A write whose field is stored is kept, unless idx < 0 (a special channel:
         errors, interrupts), whose latest write wins.
]]
for i = 2, #ARGV, 3 do
  if ARGV[i + 2] == '1' then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  else
    redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
